"""The coverage page of a published index, in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium) over `attnforge serve`.

The index (tests/integration/tinyindex.py) holds real tiny wheels: one with a passed parity record, one built,
one yanked, one stable-ABI; its matrix plans cells refused by a rule and cells not built. The page must show
each state where it belongs, the yank with its reason, fold the refusals, narrow the grid when filtered, and
offer the install command `attnforge which` prints for the same environment.

The same wheels published next to the shipped matrix.yaml give the page at the size it is made for (the
release plan's cells and every other target's): within its weight, the published wheels and the counts on the
first screen, the refusals folded, the filter kept in the address through a reload, nothing wider than the
window. Set ATTNFORGE_SCREENSHOT to a path to keep that page's first screen (docs/index-page.png comes from it).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("tests.integration.tinyindex")

from tests.integration.tinyindex import (  # noqa: E402
    REPORT_URL,
    V213,
    V214,
    V214_FWD,
    V_STABLE,
    YANK_REASON,
    TinyIndex,
    signing_env,
)
from tests.integration.wheelfactory import Served, attnforge_serve, cli, pip_install  # noqa: E402

pytest_plugins = ["tests.integration.tinyindex"]
# ~50 s on 2 busy cores (the session's tiny index ~15-25 s, the release index ~8 s, Chromium's start, the page
# tests ~15 s): slow, and in noxfile.CI_SLOW_ALLOWLIST
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
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
def release_server(tiny_index: TinyIndex, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The tiny index's wheels published next to the shipped matrix.yaml (the release plan's 1,087 cells and
    every other target's), one yanked: the page at the size it is made for. Two CLI runs, ~3 s."""
    project = tmp_path_factory.mktemp("release")
    (project / "matrix.yaml").write_text((ROOT / "matrix.yaml").read_text())
    (project / "wheels").mkdir()
    for wheel in tiny_index.wheels.values():  # the wheel, its manifest, its signed records and SBOM
        for f in wheel.parent.glob(glob.escape(wheel.name) + "*"):
            (project / "wheels" / f.name).write_bytes(f.read_bytes())
    env = signing_env(tiny_index.project / "keys" / "site.pem")
    cli("publish", "--to", "local", cwd=project, env=env)
    cli("yank", tiny_index.wheels[V214_FWD].name, "--reason", YANK_REASON, cwd=project, env=env)
    with attnforge_serve(
        project / "wheels" / "index", tmp_path_factory.mktemp("serve") / "serve.log"
    ) as served:
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

    heading = driver.find_element(By.XPATH, f"//section[h3[normalize-space()='{section}']]")
    headers = [text(th) for th in heading.find_elements(By.CSS_SELECTOR, "thead th")]
    tr = heading.find_element(By.XPATH, f".//tbody/tr[th[normalize-space()='{row}']]")
    tds = tr.find_elements(By.TAG_NAME, "td")
    return tds[0] if len(tds) == 1 else tds[headers.index(column) - 1]


def visible_rows(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [
        text(th) for th in driver.find_elements(By.CSS_SELECTOR, "#grids tbody tr th") if th.is_displayed()
    ]


def published_row(driver: Any, version: str) -> Any:
    """The line of a published wheel (its version is the row header)."""
    from selenium.webdriver.common.by import By

    return driver.find_element(
        By.XPATH, f"//section[@id='published']//tbody/tr[th[normalize-space()='{version}']]"
    )


def test_the_page_shows_states_yanks_filters_and_the_command_which_prints(
    server: Served, browser: Any, tiny_index: TinyIndex, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.set_window_size(1400, 2100)
    browser.get(server.url + "/")
    assert browser.title == "attnforge wheel index: coverage"
    assert browser.find_element(By.TAG_NAME, "html").get_attribute("lang") == "en"

    # real tables: a caption, column headers, one row header per row
    tables = browser.find_elements(By.CSS_SELECTOR, "#grids table")
    assert len(tables) == 3  # flash-attn x {full, fwd128, hd128}
    for table in browser.find_elements(By.TAG_NAME, "table"):
        assert text(table.find_element(By.TAG_NAME, "caption"))
        assert {th.get_attribute("scope") for th in table.find_elements(By.CSS_SELECTOR, "thead th")} == {
            "col"
        }
        assert {th.get_attribute("scope") for th in table.find_elements(By.CSS_SELECTOR, "tbody th")} == {
            "row"
        }

    # each state where it belongs: a published wheel's cell links to its line in the published list
    passed = grid_cell(browser, "flash-attn · profile full", "CUDA 13.0 · torch 2.14", "Python 3.11")
    assert text(passed) == "parity passed 2.8.3"
    passed.find_element(By.TAG_NAME, "a").click()
    line = published_row(browser, V214)
    assert browser.execute_script("return location.hash") == "#" + line.get_attribute("id")
    assert "CUDA 13.0 · torch 2.14 · Python 3.11" in text(line)
    assert "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB), driver 580.65.06, 2026-11-20T10:00:00+00:00" in text(line)
    assert line.find_element(By.LINK_TEXT, "parity report").get_attribute("href") == REPORT_URL
    built = grid_cell(browser, "flash-attn · profile full", "CUDA 13.0 · torch 2.13", "Python 3.11")
    assert text(built) == "built 2.8.3"
    assert "No GPU parity run recorded" in text(published_row(browser, V213))
    not_built = grid_cell(browser, "flash-attn · profile full", "CUDA 13.0 · torch 2.13", "Python 3.12")
    assert text(not_built).startswith("not built 2.8.3")
    assert "attnforge build --cell flash-attn-2.8.3-cu130-torch2.13.0-cp312-abi1-sm90-full-x86_64" in text(
        not_built
    )
    # the CUDA 12.4 rows are refused in every cell: folded, one group per rule's sentence
    assert "CUDA 12.4 · torch 2.14" not in visible_rows(browser)
    refusals = browser.find_element(By.CSS_SELECTOR, "#grid-1 details.refusals")
    groups = refusals.find_elements(By.CSS_SELECTOR, "li.group")
    assert refusals.get_attribute("open") is None and not any(g.is_displayed() for g in groups)
    refusals.find_element(By.TAG_NAME, "summary").click()
    assert [text(g) for g in groups if "torch 2.14's" in text(g)] == [
        "torch-toolkit, 2 cells: torch 2.14's oldest CUDA 12 build is 12.6, newer than the toolkit 12.4: "
        "compile with CUDA >= 12.6 Python 3.11, 3.12: CUDA 12.4 · torch 2.14"
    ]
    refusals.find_element(By.TAG_NAME, "summary").click()
    stable = grid_cell(
        browser, "flash-attn · profile hd128", "CUDA 13.0 · sm90 · torch ≥ 2.10 (stable ABI)", ""
    )
    assert stable.get_attribute("colspan") == "1" and text(stable) == (
        "one stable-ABI (abi3) wheel for torch ≥ 2.10 and Python ≥ 3.10 built 2.8.3"
    )

    # the yanked wheel: its reason, and no install command offered
    yanked = published_row(browser, V214_FWD)
    assert f"yanked Reason: {YANK_REASON}" in text(yanked)
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
    commands = {c.get_attribute("data-cmd"): c for c in line.find_elements(By.CSS_SELECTOR, "code.cmd")}
    assert commands["pip"].text == which.stdout.strip()
    assert (
        commands["pip"].text
        == f"pip install flash-attn=={V214} --index-url {server.url}/cu130-torch2.14/simple"
    )
    which_uv = cli("which", "--index-url", server.url, "--python", env / "bin" / "python", "--format", "uv")
    assert commands["uv"].get_attribute("textContent") == which_uv.stdout
    assert (
        line.find_element(By.CSS_SELECTOR, "button.copy")
        .get_attribute("aria-label")
        .startswith("Copy the pip")
    )

    # filtering narrows the grids (rows and refusal groups); the status line says how far
    everything = visible_rows(browser)
    assert len(everything) == 4
    search = browser.find_element(By.ID, "filter-text")
    assert browser.find_element(By.CSS_SELECTOR, "label[for=filter-text]").text == "Search"
    search.send_keys("torch 2.13 3.12")
    assert visible_rows(browser) == ["CUDA 13.0 · torch 2.13"]
    assert (
        browser.find_element(By.ID, "filter-status").text == "Showing 1 of 4 rows and 1 of 2 refusal groups"
    )
    assert refusals.get_attribute("open") == "true"  # opened: a refusal matches
    search.clear()
    search.send_keys(" ")  # clear() fires no input event
    assert refusals.get_attribute("open") is None  # closed again: the filter opened it
    Select(browser.find_element(By.ID, "filter-state")).select_by_value("yanked")
    assert visible_rows(browser) == ["CUDA 13.0 · torch 2.14"]
    shown = [s for s in browser.find_elements(By.CSS_SELECTOR, "#grids section.grid") if s.is_displayed()]
    assert [text(s.find_element(By.TAG_NAME, "h3")) for s in shown] == ["flash-attn · profile fwd128"]
    Select(browser.find_element(By.ID, "filter-state")).select_by_value("")
    assert len(visible_rows(browser)) == 4


def test_the_page_reads_without_javascript(server: Served) -> None:
    """What a browser without scripts (or a screen reader's raw view) gets from `attnforge serve`: the grids,
    every state in words, the filter hidden (it needs the script), commands naming the index INDEX_URL with a
    note saying so."""
    with urllib.request.urlopen(server.url + "/", timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/html")
        page = resp.read().decode()
    assert '<form id="filters" role="search" aria-label="Filter the grids" hidden>' in page
    words = re.sub(r"<[^>]+>", "", page)  # what a reader gets, tags away
    assert (
        "replace it with the" in words and f"pip install flash-attn=={V214} --index-url INDEX_URL/" in words
    )
    for state in ("parity passed", "built", "yanked", "not built", "refused by a rule"):
        assert f'<strong class="state">{state}</strong>' in page
    assert f"Reason: {YANK_REASON}" in page


def _fits(driver: Any) -> bool:
    """No table, and nothing else, is wider than the viewport."""
    return bool(
        driver.execute_script(
            "const w = document.documentElement.clientWidth;"
            "return document.documentElement.scrollWidth <= w &&"
            " [...document.querySelectorAll('table')].every(t => t.getBoundingClientRect().right <= w + 1);"
        )
    )


def test_the_release_page_opens_on_what_is_published_and_folds_refusals(
    release_server: Served, browser: Any, tmp_path: Path
) -> None:
    """The page of the shipped matrix (release plan and every target) with four wheels: within its weight,
    the published wheels and the counts on the first screen, refusals folded, the filter kept in the address."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with urllib.request.urlopen(release_server.url + "/", timeout=30) as resp:
        size = len(resp.read())
    assert size <= 200_000, f"the page weighs {size} bytes"
    with urllib.request.urlopen(release_server.url + "/coverage.json", timeout=30) as resp:
        summary = json.load(resp)["summary"]
    assert summary["refused"] > 800 and summary["not-built"] > 100  # the release plan is in it
    assert (summary["parity-passed"], summary["built"], summary["yanked"]) == (1, 2, 1)

    browser.set_window_size(1280, 900)
    chrome = browser.execute_script("return window.outerHeight - window.innerHeight")
    browser.set_window_size(1280, 900 + chrome)  # a 1280 x 900 page area
    browser.get(release_server.url + "/")
    height = browser.execute_script("return window.innerHeight")

    def on_first_screen(element: Any) -> bool:
        return bool(element.is_displayed() and element.rect["y"] + element.rect["height"] <= height)

    shot = tmp_path / "index-page.png"
    browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("ATTNFORGE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["ATTNFORGE_SCREENSHOT"])
    lines = browser.find_elements(By.CSS_SELECTOR, "#published tbody tr")
    assert sorted(text(tr.find_element(By.TAG_NAME, "th")) for tr in lines) == sorted(
        [V214, V213, V214_FWD, V_STABLE]
    )
    assert all(on_first_screen(tr) for tr in lines)
    counts = browser.find_element(By.CSS_SELECTOR, "ul.counts")
    assert on_first_screen(counts)
    labels = {
        "parity-passed": "parity passed",
        "built": "built",
        "yanked": "yanked",
        "not-built": "not built",
    }
    labels["refused"] = "refused by a rule"
    assert text(counts) == " ".join(f"{labels[s]} {n}" for s, n in summary.items())
    assert _fits(browser)

    # refusals folded: closed <details>, no grid row refused in every cell
    folds = browser.find_elements(By.CSS_SELECTOR, "details.refusals")
    assert folds and all(d.get_attribute("open") is None for d in folds)
    assert not any(g.is_displayed() for g in browser.find_elements(By.CSS_SELECTOR, "li.group"))
    states = [
        tr.get_attribute("data-states") for tr in browser.find_elements(By.CSS_SELECTOR, "#grids tbody tr")
    ]
    assert states and "refused" not in states
    groups = len(browser.find_elements(By.CSS_SELECTOR, "li.group"))
    assert groups < summary["refused"] / 8  # one per reason, not one per cell

    # a filter set in the address (query), then kept through a reload
    browser.get(release_server.url + "/?state=yanked")
    for _ in range(2):
        assert Select(browser.find_element(By.ID, "filter-state")).first_selected_option.text == "yanked"
        assert visible_rows(browser) == ["CUDA 13.0 · torch 2.14"]
        browser.refresh()
    # set from the page: it goes into the address, and a reload keeps it
    search = browser.find_element(By.ID, "filter-text")
    Select(browser.find_element(By.ID, "filter-state")).select_by_value("refused")
    search.send_keys("torch 2.5 3.14t")
    assert browser.current_url == release_server.url + "/?q=torch+2.5+3.14t&state=refused"
    browser.refresh()
    assert browser.find_element(By.ID, "filter-text").get_attribute("value") == "torch 2.5 3.14t"
    shown = [g for g in browser.find_elements(By.CSS_SELECTOR, "li.group") if g.is_displayed()]
    assert all("2.5" in text(g) and "3.14t" in text(g) for g in shown) and len(shown) < groups
    assert any(
        re.match(
            r"torch-python, \d+ cells: torch 2\.5 has no free-threaded wheels for Python 3\.14t", text(g)
        )
        for g in shown
    )
    # the fragment form, as a link would carry it
    browser.get(release_server.url + "/#state=not-built&q=rocm")
    rows = visible_rows(browser)
    assert rows and all(r.startswith("ROCm") for r in rows)

    # narrow screens: the tables' cells stack, nothing scrolls sideways
    browser.set_window_size(420, 900)
    browser.get(release_server.url + "/")
    assert _fits(browser)
