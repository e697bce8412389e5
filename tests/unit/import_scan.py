"""Every import statement of a package's modules, read with `ast` (nothing is imported): where it stands
(module level, inside a function, under `if TYPE_CHECKING:`), what it names (resolved to a module of the
package, or a third-party or standard-library name), and the comments on its lines. Used by
test_import_graph.py (cycles, why an import sits in a function) and test_stdlib_zones.py."""

from __future__ import annotations

import ast
import functools
import io
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "attnforge"
# folders of the package that hold data, not modules (Dockerfile build contexts; the guides)
DATA_DIRS = ("docker", "docs")

MODULE = "module"
FUNCTION = "function"
TYPE_CHECKING = "type-checking"


@dataclass(frozen=True)
class Import:
    """One name an import statement brings in."""

    source: str  # the importing module, dotted
    target: str  # a module of the package (dotted), or the imported name as written for anything else
    internal: bool
    where: str  # MODULE | FUNCTION | TYPE_CHECKING
    file: str  # relative to the package's parent: attnforge/publish/coverage.py
    line: int
    comment: str  # the comments on the statement's lines, joined

    @property
    def top(self) -> str:
        """The top-level name of an outside import (`torch` for `torch.nn`)."""
        return self.target.split(".")[0]

    @property
    def at(self) -> str:
        return f"{self.file}:{self.line}"


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (an `__init__.py` names its package)."""
    root = package.name
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in DATA_DIRS or "__pycache__" in rel.parts:
            continue
        parts = [root, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _comments(source: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(node: ast.AST, where: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement under `node` with where it stands (a class body runs at import: module level)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, where
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _statements(child, FUNCTION)
        elif isinstance(child, ast.If) and _is_type_checking(child.test) and where == MODULE:
            for stmt in child.body:
                yield from _statements(ast.Module(body=[stmt], type_ignores=[]), TYPE_CHECKING)
            for stmt in child.orelse:
                yield from _statements(ast.Module(body=[stmt], type_ignores=[]), where)
        else:
            yield from _statements(child, where)


def _owner(name: str, known: dict[str, Path]) -> str:
    """The longest known module `name` is in (`a.b.C` -> `a.b`)."""
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def imports(name: str, known: dict[str, Path]) -> list[Import]:
    """Every name the module `name` imports (`known`: the package's modules, from `modules()`)."""
    path = known[name]
    root = name.split(".")[0]
    file = path.relative_to(known[root].parent.parent).as_posix()
    text = path.read_text(encoding="utf-8")
    comments = _comments(text)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[Import] = []
    for stmt, where in _statements(ast.parse(text), MODULE):
        end = stmt.end_lineno or stmt.lineno
        comment = " ".join(comments[n] for n in range(stmt.lineno, end + 1) if n in comments)
        out += [
            Import(name, target, internal, where, file, stmt.lineno, comment)
            for target, internal in _names(stmt, root, package, known)
        ]
    return out


def _names(
    stmt: ast.Import | ast.ImportFrom, root: str, package: str, known: dict[str, Path]
) -> list[tuple[str, bool]]:
    """(what the statement imports, whether it is in the package), each name of the statement."""
    if isinstance(stmt, ast.Import):
        out = []
        for alias in stmt.names:
            inside = alias.name == root or alias.name.startswith(root + ".")
            out.append((_owner(alias.name, known) if inside else alias.name, inside))
        return out
    if stmt.level:
        base = package
        for _ in range(stmt.level - 1):
            base = base.rpartition(".")[0]
        full = f"{base}.{stmt.module}" if stmt.module else base
    else:
        full = stmt.module or ""
    if full == "__future__":
        return []
    if full == root or full.startswith(root + "."):
        # `from pkg import submodule` names the submodule; `from pkg.mod import name`, the module
        return [
            (f"{full}.{a.name}" if f"{full}.{a.name}" in known else _owner(full, known), True)
            for a in stmt.names
        ]
    return [(full, False)]


@functools.cache
def _all_imports(package: Path) -> tuple[Import, ...]:
    known = modules(package)
    return tuple(imp for name in known for imp in imports(name, known))


def all_imports(package: Path = PACKAGE) -> list[Import]:
    """Every import of every module of the package (parsed once per test session)."""
    return list(_all_imports(package))


def is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names


def loaded_at_import(name: str, every: list[Import]) -> tuple[set[str], set[str]]:
    """(package modules, outside top-level names) that importing `name` loads: its module-level imports,
    theirs in turn, and the packages above each module (Python runs their `__init__` first)."""
    by_source: dict[str, list[Import]] = {}
    for imp in every:
        by_source.setdefault(imp.source, []).append(imp)
    seen: set[str] = set()
    outside: set[str] = set()
    todo = [name]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for imp in by_source.get(mod, []):
            if imp.where != MODULE:
                continue
            if imp.internal:
                todo.append(imp.target)
            else:
                outside.add(imp.top)
    return seen, outside
