"""Messages name only what an installed attnforge has: no path of this repository the wheel does not ship.

Every string attnforge can show a user is checked: the string literals of src/attnforge's Python (help texts,
errors, hints; the docstrings of modules and of functions outside the CLI are notes for readers of the code and
are left out, unless the module shows its docstring as help), the JSON Schema of matrix.yaml (its descriptions come from the models' docstrings) and the string
values of its packaged data (TOML, JSON). A guide is named
as `attnforge docs TOPIC`, never as docs/TOPIC.md.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from attnforge.core.guides import guides
from attnforge.matrix.schema import Matrix

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "attnforge"
# a path of this checkout: one of its top-level folders, then at least one more character of a path (the folders
# attnforge writes into a user's repository, .github/workflows, reports/gpu and wheels/, are theirs, not ours)
CITED = re.compile(r"(?<![\w/.-])((?:docs|scripts|src|tests|benchmarks|\.ci)/[\w.*-][\w./*-]*)")


def _docstring_ids(tree: ast.Module, in_cli: bool) -> set[int]:
    """The ids of docstring nodes a user never sees: the module's, and outside cli/ every function's and class's."""
    owners: list[ast.AST] = [tree]
    if not in_cli:
        owners += [
            n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
    found = set()
    for owner in owners:
        body = getattr(owner, "body", [])
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def _python_strings(path: Path) -> Iterator[tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    skip = _docstring_ids(tree, in_cli="cli" in path.relative_to(PACKAGE).parts)
    if "__doc__" in source:  # the module's docstring is a help text (argparse description=__doc__)
        skip.discard(id(tree.body[0].value) if tree.body and isinstance(tree.body[0], ast.Expr) else 0)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def _data_strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _data_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _data_strings(item)


def _strings() -> Iterator[tuple[str, str]]:
    """(where, text) of every user-visible string in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _python_strings(path):
            yield f"{path.relative_to(ROOT)}:{line}", text
    yield "the JSON Schema of matrix.yaml", json.dumps(Matrix.model_json_schema())
    for path in sorted(PACKAGE.rglob("*.toml")):
        for text in _data_strings(tomllib.loads(path.read_text(encoding="utf-8"))):
            yield str(path.relative_to(ROOT)), text
    for path in sorted(PACKAGE.rglob("*.json")):
        for text in _data_strings(json.loads(path.read_text(encoding="utf-8"))):
            yield str(path.relative_to(ROOT)), text


def _unshipped(cited: str) -> bool:
    """A guide cited by file, or a path that exists in the checkout (a glob counts) outside the package."""
    path = cited.rstrip(".,;:)")
    if path.startswith("docs/") and path.endswith(".md"):
        return True
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def offenders() -> list[str]:
    found = []
    for where, text in _strings():
        for match in CITED.finditer(text):
            if _unshipped(match.group(1)):
                found.append(f"{where}: {match.group(1)}")
    return found


def test_no_message_cites_a_file_the_wheel_lacks() -> None:
    bad = offenders()
    assert not bad, (
        "messages citing files outside the wheel (name a guide as `attnforge docs TOPIC`):\n" + "\n".join(bad)
    )


def test_the_checker_finds_a_cited_guide_and_a_checkout_path() -> None:
    assert (
        _unshipped("docs/records.md")
        and _unshipped("scripts/setup-host.sh")
        and _unshipped("tests/data/runner/*")
    )
    assert not _unshipped("tests/test_flash_attn.py")  # upstream's file, named as upstream's
    sample = 'raise ConfigurationError("see docs/flex.md")\n'
    assert [m.group(1) for m in CITED.finditer(sample)] == ["docs/flex.md"]
    assert not CITED.search("ROCm/ROCm docs/compatibility") or not _unshipped("docs/compatibility")


def test_every_guide_named_in_a_message_exists() -> None:
    topics = {g.topic for g in guides()}
    named = {m.group(1) for _, text in _strings() for m in re.finditer(r"attnforge docs ([a-z0-9-]+)", text)}
    assert named and named <= topics, named - topics
