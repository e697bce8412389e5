"""Write the module table of docs/architecture.md from the modules' own docstrings (`--check`: only say whether
it is current).

Each row is one module of src/attnforge and the first paragraph of its docstring (cut at a word near 240
characters, with " …"). Packages come in the order of the layers contract in pyproject.toml, bottom first,
then any package the contract does not name; inside a package, modules sort by path, each folder's
`__init__.py` first. The table sits between `<!-- modules -->` and `<!-- /modules -->`; everything else in the
file is left as it is. Nothing is imported: the docstrings are read with `ast`, so a new module only needs one.

    python scripts/architecture_table.py            rewrite the table
    python scripts/architecture_table.py --check    exit 1 with a diff when the table is stale
"""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attnforge"
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- modules: generated from each module's docstring by scripts/architecture_table.py -->"
END = "<!-- /modules -->"
DATA_DIRS = ("docker", "docs")  # folders of the package that hold data, not modules
LIMIT = 240


def layer_order(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The layers contract's packages and top-level modules, bottom layer first (`builder`, `core`, ...)."""
    contracts = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [name.strip().removeprefix("attnforge.") for row in reversed(layers) for name in row.split("|")]


def summary(path: Path) -> str:
    """The first paragraph of the module's docstring on one line, `|` escaped, cut near LIMIT characters."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc:
        raise ValueError(f"{path}: no module docstring (its first paragraph is the module's row)")
    text = " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|").replace("\\\\|", "\\|")
    if len(text) > LIMIT:
        text = text[:LIMIT].rsplit(" ", 1)[0].rstrip(",;:") + " …"
    return text


def modules(package: Path) -> list[Path]:
    """Every module file of the package (no `__main__.py`, nothing under the data folders)."""
    return [
        p
        for p in package.rglob("*.py")
        if "__pycache__" not in p.parts
        and p.name != "__main__.py"
        and p.relative_to(package).parts[0] not in DATA_DIRS
    ]


def _sort_key(rel: Path) -> tuple[str, ...]:
    return tuple("" if part == "__init__.py" else part for part in rel.parts)


def table(package: Path = PACKAGE, order: list[str] | None = None) -> str:
    """The module table (markdown, header included)."""
    order = layer_order() if order is None else order
    groups: dict[str, list[Path]] = {}
    for path in modules(package):
        rel = path.relative_to(package)
        top = rel.parts[0].removesuffix(".py") if rel.name != "__init__.py" or len(rel.parts) > 1 else ""
        groups.setdefault(top, []).append(rel)
    ranked = [g for g in order if g in groups] + sorted(g for g in groups if g not in order and g)
    lines = ["| module | one job |", "|---|---|"]
    for rel in groups.get("", []):
        lines.append(f"| `{rel.as_posix()}` | {summary(package / rel)} |")
    for group in ranked:
        single = groups[group] == [Path(f"{group}.py")]
        lines.append(f"| **{group}.py** | |" if single else f"| **{group}/** | |")
        for rel in sorted(groups[group], key=_sort_key):
            lines.append(f"| `{rel.as_posix()}` | {summary(package / rel)} |")
    return "\n".join(lines) + "\n"


def update(text: str, new_table: str) -> str:
    """`text` with the table between the markers replaced."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"the module table's markers are missing: {BEGIN} ... {END}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{new_table}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 with a diff when the table is stale")
    args = ap.parse_args(argv)
    try:
        old = DOC.read_text(encoding="utf-8")
        new = update(old, table())
    except ValueError as exc:
        print(f"architecture_table: {exc}", file=sys.stderr)
        return 2
    if new == old:
        return 0
    if args.check:
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), "docs/architecture.md", "generated", lineterm=""
        )
        print("\n".join(diff))
        print("docs/architecture.md: the module table is stale: run `python scripts/architecture_table.py`")
        return 1
    DOC.write_text(new, encoding="utf-8")
    print("docs/architecture.md: module table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
