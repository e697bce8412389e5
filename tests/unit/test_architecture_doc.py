"""docs/architecture.md is the map of the package: every module is named there with its job, nothing named
there is missing, and its layer order is the one `lint-imports` enforces."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "attnforge"
DOC = ROOT / "docs" / "architecture.md"
MODULE_CELL = re.compile(r"^\| `([\w/]+\.py)`")


def modules() -> set[str]:
    """Every module of the package as its path under src/attnforge (package __init__ files included; the\n    Dockerfiles' build contexts under docker/ are data, not modules)."""
    return {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
        and p.name != "__main__.py"
        and p.relative_to(PACKAGE).parts[0] != "docker"
    }


def named() -> set[str]:
    """The modules docs/architecture.md names in the first column of its module tables."""
    return {m[1] for line in DOC.read_text(encoding="utf-8").splitlines() if (m := MODULE_CELL.match(line))}


def test_every_module_is_named_with_its_job() -> None:
    missing = sorted(modules() - named())
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_nothing_named_is_missing() -> None:
    stale = sorted(named() - modules())
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_every_row_says_what_the_module_does() -> None:
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if MODULE_CELL.match(line):
            job = line.split("|")[2].strip()
            assert len(job) >= 12, f"no job given: {line}"


def test_the_layer_order_is_the_enforced_one() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    enforced = [
        " | ".join(sorted(x.strip().removeprefix("attnforge.") for x in row.split("|"))) for row in layers
    ]
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- layers -->")[1].split("<!-- /layers -->")[0]
    documented = [
        " | ".join(sorted(x.strip() for x in line.strip().strip("`").split("|")))
        for line in block.splitlines()
        if line.strip().startswith("`")
    ]
    assert documented == enforced
