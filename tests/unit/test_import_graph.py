"""The package's internal imports form no cycle, and an internal import inside a function says why it is there.

Every module under src/attnforge is parsed with `ast` and every import of an attnforge module counts: at
module level, inside a function, under `if TYPE_CHECKING:`. The rule (docs/architecture.md, "Imports"): an
internal import sits inside a function only for start-up cost or for an optional dependency, and says so
in a trailing comment (`# start-up cost`, `# optional: torch`), or is listed in ALLOWED with its reason. The
comments are checked too: a `start-up cost` import is of a module that `attnforge --help` does not load,
and an `optional: NAME` import is of a module that loads NAME when it is imported.

Costs about 2 s: one `attnforge --help` in a subprocess; the rest is parsing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.unit.import_scan import FUNCTION, PACKAGE, Import, all_imports, is_stdlib, loaded_at_import

# (importing module, imported module) -> why it sits inside a function, for a reason no comment form covers
ALLOWED: dict[tuple[str, str], str] = {}
REASON = re.compile(r"#\s*(?P<kind>start-up cost|optional: (?P<name>[\w.-]+))")


def graph(imports: list[Import]) -> dict[str, dict[str, Import]]:
    """module -> {module it imports: the first statement that does}, internal imports only."""
    out: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in imports:
        if imp.internal and imp.target != imp.source:
            out[imp.source].setdefault(imp.target, imp)
    return out


def cycles(edges: dict[str, dict[str, Import]]) -> list[list[Import]]:
    """One cycle per strongly connected group of modules (Tarjan), each as the imports that close it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, {})):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_loop(group, edges) for group in sorted(groups)]


def _loop(group: list[str], edges: dict[str, dict[str, Import]]) -> list[Import]:
    """The shortest path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths: dict[str, list[Import]] = {start: []}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for nxt, imp in sorted(edges.get(node, {}).items()):
            if nxt == start:
                return [*paths[node], imp]
            if nxt in members and nxt not in paths:
                paths[nxt] = [*paths[node], imp]
                todo.append(nxt)
    raise AssertionError(f"no loop through {start}")  # pragma: no cover


def describe(loop: list[Import]) -> str:
    steps = [f"{imp.target} ({imp.at}{'' if imp.where == 'module' else ', ' + imp.where})" for imp in loop]
    return " -> ".join([loop[0].source, *steps])


def unexplained(imports: list[Import]) -> list[str]:
    """Function-level internal imports with neither a reason comment nor an ALLOWED entry."""
    return [
        f"{imp.at} {imp.target}"
        for imp in imports
        if imp.internal
        and imp.where == FUNCTION
        and not REASON.search(imp.comment)
        and (imp.source, imp.target) not in ALLOWED
    ]


@pytest.fixture(scope="module")
def every() -> list[Import]:
    return all_imports()


def test_no_import_cycles(every: list[Import]) -> None:
    found = [describe(loop) for loop in cycles(graph(every))]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_every_function_level_import_says_why(every: list[Import]) -> None:
    bad = unexplained(every)
    assert not bad, (
        "internal imports inside a function without a reason (move it to module level, or add "
        "`# start-up cost` / `# optional: NAME`):\n" + "\n".join(bad)
    )
    assert all(target != source for source, target in ALLOWED)


def test_start_up_cost_imports_are_not_loaded_by_help(every: list[Import]) -> None:
    """A lazy import saves start-up time only if `attnforge --help` has not loaded the module anyway."""
    code = (
        "import json, sys\nfrom attnforge.cli import main\nsys.argv = ['attnforge', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write(json.dumps(sorted(m for m in sys.modules if m.startswith('attnforge'))))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    loaded = set(json.loads(out.stderr))
    assert "attnforge.cli.commands.build" in loaded
    lazy = [i for i in every if i.where == FUNCTION and (m := REASON.search(i.comment)) and not m["name"]]
    assert len(lazy) > 10
    stale = [f"{i.at} {i.target}" for i in lazy if i.target in loaded]
    assert not stale, "`# start-up cost` but `attnforge --help` loads it anyway:\n" + "\n".join(stale)


def test_optional_imports_name_what_the_module_needs(every: list[Import]) -> None:
    """`# optional: torch` is true when importing the module loads torch (directly or through its imports)."""
    optional = [(i, m["name"]) for i in every if (m := REASON.search(i.comment)) and m["name"]]
    assert len(optional) > 10
    wrong = [
        f"{i.at} {i.target} does not load {name}"
        for i, name in optional
        if name not in loaded_at_import(i.target, every)[1]
    ]
    assert not wrong, "\n".join(wrong)
    assert all(not is_stdlib(name) for _, name in optional)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "attnforge"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_check_sees_cycles_hidden_in_functions_and_type_checking(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "a.py": "from attnforge.b import x\n",
            "b.py": "def f():\n    from attnforge import a  # start-up cost\n",
            "p/__init__.py": "",
            "p/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\n",
            "p/d.py": "from attnforge.p.c import C\n",
            "e.py": "import json\nfrom attnforge import f\n",
            "f.py": "import attnforge.e.x\n",
        },
    )
    found = [describe(loop) for loop in cycles(graph(all_imports(root)))]
    assert found == [
        "attnforge.a -> attnforge.b (attnforge/a.py:1) -> attnforge.a (attnforge/b.py:2, function)",
        "attnforge.e -> attnforge.f (attnforge/e.py:2) -> attnforge.e (attnforge/f.py:1)",
        "attnforge.p.c -> attnforge.p.d (attnforge/p/c.py:3, type-checking) -> attnforge.p.c (attnforge/p/d.py:1)",
    ]


def test_the_rule_sees_an_import_without_a_reason(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "a.py": "import json\n",
            "b.py": (
                "def f():\n    from attnforge import a\n"
                "def g():\n    from attnforge.a import (  # start-up cost\n        json,\n    )\n"
                "def h():\n    import attnforge.a  # optional: torch\n"
                "class K:\n    from attnforge import a\n"
            ),
        },
    )
    assert unexplained(all_imports(root)) == ["attnforge/b.py:2 attnforge.a"]
