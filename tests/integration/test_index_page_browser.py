"""The coverage page of a published index, in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium) over `attnforge serve`.

The index (tests/integration/tinyindex.py) holds real tiny wheels: one with a passed parity record, one built,
one yanked, one stable-ABI; its matrix plans cells refused by a rule and cells not built. The page must show
each state where it belongs, the yank with its reason, narrow the grid when filtered, and offer the install
command `attnforge which` prints for the same environment. Set ATTNFORGE_SCREENSHOT to a path to keep the
screenshot (docs/index-page.png comes from this test).
"""

from __future__ import annotations

import os
import shutil
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("tests.integration.tinyindex")

from tests.integration.tinyindex import REPORT_URL, V213, V214, V214_FWD, V_STABLE, YANK_REASON, TinyIndex  # noqa: E402
from tests.integration.wheelfactory import Served, attnforge_serve, cli, pip_install  # noqa: E402

pytest_plugins = ["tests.integration.tinyindex"]
# ~25 s on 2 busy cores (the session's tiny index ~10-15 s, Chromium's start, the page test ~7-10 s): slow,
# and in noxfile.CI_SLOW_ALLOWLIST
pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def _browser_or_skip() -> None:
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    why = "chromium and chromium-driver are not installed (scripts/setup-host.sh installs them)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def server(tiny_index: TinyIndex, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with attnforge_serve(tiny_index.index, tmp_path_factory.mktemp("serve") / "serve.log") as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _browser_or_skip()
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,2100")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def text(element: Any) -> str:
    """The element's text as written (WebDriver's .text applies CSS text-transform)."""
    return " ".join(str(element.get_attribute("textContent")).split())


def grid_cell(driver: Any, section: str, row: str, column: str) -> Any:
    """The <td> of a table (its <h2>), row header and column header; colspan cells cover every column."""
    from selenium.webdriver.common.by import By

    heading = driver.find_element(By.XPATH, f"//section[h2[normalize-space()='{section}']]")
    headers = [text(th) for th in heading.find_elements(By.CSS_SELECTOR, "thead th")]
    tr = heading.find_element(By.XPATH, f".//tbody/tr[th[normalize-space()='{row}']]")
    tds = tr.find_elements(By.TAG_NAME, "td")
    return tds[0] if len(tds) == 1 else tds[headers.index(column) - 1]


def visible_rows(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [
        text(th) for th in driver.find_elements(By.CSS_SELECTOR, "#grids tbody tr th") if th.is_displayed()
    ]


def test_the_page_shows_states_yanks_filters_and_the_command_which_prints(
    server: Served, browser: Any, tiny_index: TinyIndex, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(server.url + "/")
    assert browser.title == "attnforge wheel index: coverage"
    assert browser.find_element(By.TAG_NAME, "html").get_attribute("lang") == "en"

    # real tables: a caption, column headers, one row header per row
    tables = browser.find_elements(By.CSS_SELECTOR, "#grids table")
    assert len(tables) == 3  # flash-attn x {full, fwd128, hd128}
    for table in tables:
        assert text(table.find_element(By.TAG_NAME, "caption"))
        assert {th.get_attribute("scope") for th in table.find_elements(By.CSS_SELECTOR, "thead th")} == {
            "col"
        }
        assert {th.get_attribute("scope") for th in table.find_elements(By.CSS_SELECTOR, "tbody th")} == {
            "row"
        }

    # each state where it belongs
    passed = grid_cell(browser, "flash-attn · profile full", "CUDA 13.0 · torch 2.14", "Python 3.11")
    assert text(passed).startswith(f"parity passed {V214}")
    assert "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB), driver 580.65.06, 2026-11-20T10:00:00+00:00" in text(
        passed
    )
    assert passed.find_element(By.LINK_TEXT, REPORT_URL).get_attribute("href") == REPORT_URL
    built = grid_cell(browser, "flash-attn · profile full", "CUDA 13.0 · torch 2.13", "Python 3.11")
    assert text(built).startswith(f"built {V213}") and "No GPU parity run recorded" in text(built)
    not_built = grid_cell(browser, "flash-attn · profile full", "CUDA 13.0 · torch 2.13", "Python 3.12")
    assert text(not_built).startswith("not built 2.8.3")
    assert "attnforge build --cell flash-attn-2.8.3-cu130-torch2.13.0-cp312-abi1-sm90-full-x86_64" in text(
        not_built
    )
    refused = grid_cell(browser, "flash-attn · profile full", "CUDA 12.4 · torch 2.14", "Python 3.12")
    assert text(refused).startswith("refused by a rule 2.8.3 Rule: torch-toolkit")
    refused.find_element(By.TAG_NAME, "summary").click()  # the rule's own sentence, from `plan`
    assert "[torch-toolkit]" in refused.find_element(By.TAG_NAME, "li").text
    stable = grid_cell(
        browser, "flash-attn · profile hd128", "CUDA 13.0 · sm90 · torch ≥ 2.10 (stable ABI)", ""
    )
    assert stable.get_attribute("colspan") == "1" and text(stable).startswith(
        f"one stable-ABI (abi3) wheel for torch ≥ 2.10 and Python ≥ 3.10 built {V_STABLE}"
    )

    # the yanked wheel: its reason, and no install command offered
    yanked = grid_cell(browser, "flash-attn · profile fwd128", "CUDA 13.0 · torch 2.14", "Python 3.11")
    assert text(yanked).startswith(f"yanked {V214_FWD} Reason: {YANK_REASON}")
    assert not yanked.find_elements(By.CSS_SELECTOR, "code.cmd")

    # the install command, with this index's address filled in, is what `which` prints for that environment
    env = tmp_path / "env"
    venv.create(env, with_pip=False, symlinks=True)
    pip_install(
        env / "bin" / "python",
        "--no-index",
        "--find-links",
        tiny_index.torch_index / "torch",
        "torch==2.14.1+cu130",
        check=True,
    )
    which = cli("which", "--index-url", server.url, "--python", env / "bin" / "python")
    passed.find_element(By.TAG_NAME, "summary").click()
    commands = {c.get_attribute("data-cmd"): c for c in passed.find_elements(By.CSS_SELECTOR, "code.cmd")}
    assert commands["pip"].text == which.stdout.strip()
    assert (
        commands["pip"].text
        == f"pip install flash-attn=={V214} --index-url {server.url}/cu130-torch2.14/simple"
    )
    which_uv = cli("which", "--index-url", server.url, "--python", env / "bin" / "python", "--format", "uv")
    assert commands["uv"].get_attribute("textContent") == which_uv.stdout
    assert (
        passed.find_element(By.CSS_SELECTOR, "button.copy")
        .get_attribute("aria-label")
        .startswith("Copy the pip")
    )

    # filtering narrows the grid; the status line says how far
    everything = visible_rows(browser)
    assert len(everything) == 6
    search = browser.find_element(By.ID, "filter-text")
    assert browser.find_element(By.CSS_SELECTOR, "label[for=filter-text]").text == "Search"
    search.send_keys("torch 2.13 3.12")
    assert visible_rows(browser) == ["CUDA 12.4 · torch 2.13", "CUDA 13.0 · torch 2.13"]
    assert browser.find_element(By.ID, "filter-status").text == "Showing 2 of 6 rows"
    search.clear()
    search.send_keys(" ")  # clear() fires no input event
    Select(browser.find_element(By.ID, "filter-state")).select_by_value("yanked")
    assert visible_rows(browser) == ["CUDA 13.0 · torch 2.14"]
    shown = [s for s in browser.find_elements(By.CSS_SELECTOR, "#grids section.grid") if s.is_displayed()]
    assert [text(s.find_element(By.TAG_NAME, "h2")) for s in shown] == ["flash-attn · profile fwd128"]
    Select(browser.find_element(By.ID, "filter-state")).select_by_value("")
    assert len(visible_rows(browser)) == 6

    shot = tmp_path / "index-page.png"
    browser.set_window_size(1400, 2500)  # the whole page, the stable-ABI row included
    browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("ATTNFORGE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["ATTNFORGE_SCREENSHOT"])


def test_the_page_reads_without_javascript(server: Served) -> None:
    """What a browser without scripts (or a screen reader's raw view) gets from `attnforge serve`: the grids,
    every state in words, the filter hidden (it needs the script), commands naming the index INDEX_URL with a
    note saying so."""
    with urllib.request.urlopen(server.url + "/", timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/html")
        page = resp.read().decode()
    assert '<form id="filters" role="search" aria-label="Filter the grids" hidden>' in page
    assert "replace it with the" in page and f"pip install flash-attn=={V214} --index-url INDEX_URL/" in page
    for state in ("parity passed", "built", "yanked", "not built", "refused by a rule"):
        assert f'<strong class="state">{state}</strong>' in page
    assert f"Reason: {YANK_REASON}" in page
