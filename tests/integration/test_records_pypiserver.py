"""Signed records for wheels published to a real pypiserver, which keeps packages only (docs/records.md).

The real CLI finalizes and signs the small pure-Python wheel of `test_records_publish`, records a parity run,
and publishes it to pypiserver (htpasswd, twine upload) through a destination with a `records` folder. That
folder is served over HTTP (`python -m http.server`); pip installs the wheel from pypiserver into a fresh venv;
`doctor --verify --records-url` checks the installed files against the signed records, reading pypiserver's
PEP 503 page for the hash. Refused: the same check without --records-url (the server has no records, and the
error says where to find them) and a parity record edited after signing. A destination without `records`
says the records were not published.
"""

from __future__ import annotations

import base64
import json
import sys
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_records_publish import REPORT, VARIANT, WHEEL, attnforge, clean_env, write_raw
from tests.integration.wheelfactory import Served, free_port, pip_install, pypiserver, wait_for

USER = "forge"
PASSWORD = "Tr0ub4dor-and-3-for-the-records"
SUFFIXES = (".provenance.intoto.json", ".cdx.json", ".parity.intoto.json", ".manifest.json")
PIN = "flash-attn==2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton"


@dataclass
class Site:
    root: Path
    index: str  # pypiserver's simple/ URL
    records: str  # the served records folder
    python: Path  # a venv with the wheel installed from pypiserver
    published: str  # publish's stderr


def env() -> dict[str, str]:
    return clean_env(ATTNFORGE_INDEX_USER=USER, ATTNFORGE_INDEX_PASSWORD=PASSWORD)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("records-pypiserver") / "proj"
    (root / "keys").mkdir(parents=True)
    with pypiserver(root.parent / "pypi", USER, PASSWORD) as server:
        server_dest = {
            "kind": "pypiserver",
            "url": server.url,
            "username_env": "ATTNFORGE_INDEX_USER",
            "password_env": "ATTNFORGE_INDEX_PASSWORD",
            "require_parity": True,
        }
        matrix = {
            "version": 1,
            "kernels": {"flash-attn": {"version": "2.8.3"}},
            "targets": {
                "default": {"matrix": {"toolkit": ["cuda13.0"], "torch": ["2.14.1"], "python": ["3.11"]}}
            },
            "destinations": {"internal": {**server_dest, "records": "records"}, "bare": server_dest},
            "signing": {"key": "keys/site.pem"},
        }
        (root / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
        assert attnforge("keys", "generate", "keys/site.pem", cwd=root).returncode == 0
        proc = attnforge("wheels", "finalize", write_raw(root / "raw"), "--out-dir", "wheels", cwd=root)
        assert proc.returncode == 0, proc.stderr
        (root / "parity.json").write_text(json.dumps(REPORT))
        manifest = f"wheels/{WHEEL}.manifest.json"
        proc = attnforge("parity", "record", manifest, "--report", root / "parity.json", cwd=root)
        assert proc.returncode == 0, proc.stderr
        published = attnforge("publish", "--to", "internal", cwd=root, env=env())
        assert published.returncode == 0, published.stderr
        port = free_port()
        cmd: list[str | Path] = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
        served = Served([*cmd, "--directory", root / "records"], root.parent / "records-http.log")
        try:
            wait_for(f"http://127.0.0.1:{port}/")
            venv.create(root.parent / "env", with_pip=False, symlinks=True)
            python = root.parent / "env" / "bin" / "python"
            install = pip_install(python, "--no-deps", "--index-url", f"{server.url}/simple/", PIN)
            assert install.returncode == 0, install.stderr
            yield Site(root, f"{server.url}/simple/", f"http://127.0.0.1:{port}", python, published.stderr)
        finally:
            served.stop()


def doctor(site: Site, *extra: str | Path) -> tuple[int, dict[str, dict[str, Any]]]:
    proc = attnforge(
        "doctor",
        "--verify",
        "--json",
        "--python",
        site.python,
        "--index-url",
        site.index,
        *extra,
        cwd=site.root,
    )
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def test_publish_puts_the_records_where_consumers_can_read_them(site: Site) -> None:
    assert f"added      {WHEEL}" in site.published and PASSWORD not in site.published
    assert "records: 4 file(s) of 1 wheel(s) in" in site.published
    for suffix in SUFFIXES:
        written = site.root / "records" / "flash-attn" / (WHEEL + suffix)
        assert written.read_bytes() == (site.root / "wheels" / (WHEEL + suffix)).read_bytes(), suffix
    uploaded = sorted(p.name for p in (site.root.parent / "pypi" / "packages").iterdir())
    assert uploaded == [WHEEL]  # the server itself holds the wheel only


def test_doctor_verifies_a_pypiserver_wheel_against_the_served_records(site: Site) -> None:
    _, checks = doctor(site, "--records-url", site.records)
    for name in ("provenance", "sbom", "manifest", "parity", "installed files"):
        assert checks[f"records: {name}"]["status"] == "ok", checks[f"records: {name}"]
    assert "the hash the index lists for" in checks["records: provenance"]["detail"]
    assert "all 6 files of" in checks["records: installed files"]["detail"]
    # $ATTNFORGE_RECORDS_URL says the same
    proc = attnforge(
        "doctor", "--verify", "--json", "--python", site.python, "--index-url", site.index,
        cwd=site.root, env=clean_env(ATTNFORGE_RECORDS_URL=site.records),
    )  # fmt: skip
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["records: provenance"]["status"] == "ok"


def test_without_the_records_url_the_check_fails_and_says_where_to_look(site: Site) -> None:
    code, checks = doctor(site)
    assert code == 5 and checks["records"]["status"] == "fail"
    detail = checks["records"]["detail"]
    assert "no signed build provenance beside the wheel" in detail and "--records-url" in detail


def test_a_served_record_edited_after_signing_is_refused(site: Site) -> None:
    path = site.root / "records" / "flash-attn" / (WHEEL + ".parity.intoto.json")
    original = path.read_bytes()
    envelope = json.loads(original)
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["gpu"] = "NVIDIA B200"  # what the signed run did not say
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(envelope))
    try:
        code, checks = doctor(site, "--records-url", site.records)
    finally:
        path.write_bytes(original)
    assert code == 5 and checks["records"]["status"] == "fail", checks
    assert "parity.intoto.json: the signature by" in checks["records"]["detail"]


def test_a_destination_without_records_says_they_were_not_published(site: Site) -> None:
    proc = attnforge("publish", "--to", "bare", cwd=site.root, env=env())
    assert proc.returncode == 0, proc.stderr
    assert f"unchanged  {WHEEL}" in proc.stderr
    assert "records: not published ('bare' names no records folder)" in proc.stderr


def test_which_reads_a_candidates_manifest_from_the_records_folder(site: Site) -> None:
    """pypiserver serves no manifest beside a wheel, so `which` can't see the GPU arches it was built for; with
    the records URL it reads the manifest there and refuses the wheel for a GPU it lacks (gfx1100 here)."""
    from attnforge.client.which import resolve
    from attnforge.engine.environment import Env

    gpu_host = Env("3.11", "x86_64", (2, 36), "2.9.1+rocm6.4", "rocm6.4", True, ("gfx1100",), None)
    blind = resolve(gpu_host, site.index, profile="triton")
    assert blind.choice is not None and blind.choice.filename == WHEEL, blind.explanation
    seen = resolve(gpu_host, site.index, profile="triton", records_url=site.records)
    assert seen.choice is None, seen.explanation
    (wheel,) = [c for c in seen.candidates if c.filename == WHEEL]
    assert ("gpu_arch", "wheel has gfx90a, gfx942, GPU here is gfx1100") in wheel.problems
    assert seen.candidates[0].variant == VARIANT
