"""docs/architecture.md is the map of the package: every module is named there with its job, nothing named
there is missing, the module table is the one scripts/architecture_table.py makes from the docstrings, and
its layer order is the one `lint-imports` enforces."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

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


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "architecture_table", ROOT / "scripts" / "architecture_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_module_table_is_the_generated_one() -> None:
    at = _script()
    text = DOC.read_text(encoding="utf-8")
    assert at.update(text, at.table()) == text, "run `python scripts/architecture_table.py`"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "architecture_table.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert (proc.returncode, proc.stdout) == (0, "")


def test_the_table_generator(tmp_path: Path) -> None:
    """Rows come from docstrings in layer order (then packages the contract does not name), each folder's
    __init__ first, then by name; `|` is escaped, long paragraphs are cut; a module without a docstring is named."""
    at = _script()
    pkg = tmp_path / "attnforge"
    files = {
        "__init__.py": '"""The package."""\n',
        "low/__init__.py": '"""Low things.\n\nMore."""\n',
        "low/b.py": '"""Run `a|b`, one job."""\n',
        "low/sub/__init__.py": '"""Sub."""\n',
        "low/a.py": f'"""{"word " * 80}"""\n',
        "high.py": '"""High, a module."""\n',
        "extra/x.py": '"""Not in the layers."""\n',
        "docker/ctx.py": "print(1)\n",
        "low/__main__.py": "",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    rows = at.table(pkg, ["low", "high"]).splitlines()
    assert [r.split(" | ")[0] for r in rows[2:]] == [
        "| `__init__.py`",
        "| **low/**",
        "| `low/__init__.py`",
        "| `low/a.py`",
        "| `low/b.py`",
        "| `low/sub/__init__.py`",
        "| **high.py**",
        "| `high.py`",
        "| **extra/**",
        "| `extra/x.py`",
    ]
    assert "| `low/b.py` | Run `a\\|b`, one job. |" in rows
    assert "| `low/__init__.py` | Low things. |" in rows
    (long,) = [r for r in rows if r.startswith("| `low/a.py`")]
    assert long.endswith("word … |") and len(long) < 280
    assert at.table(pkg, ["low", "high"]) == "\n".join(rows) + "\n"
    doc = f"# T\n{at.BEGIN}\nold\n{at.END}\nafter\n"
    assert at.update(doc, "new\n") == f"# T\n{at.BEGIN}\nnew\n{at.END}\nafter\n"
    (pkg / "high.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="high.py: no module docstring"):
        at.table(pkg, ["low", "high"])
