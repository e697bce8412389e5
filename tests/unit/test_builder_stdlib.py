"""The builder is standard library only: it is mounted into builder containers and run by whatever Python
the cell uses, where nothing but the standard library can be assumed. This is the lint rule."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

BUILDER = Path(__file__).resolve().parents[2] / "src" / "attnforge" / "builder"


def imports_outside_stdlib(path: Path) -> list[str]:
    """Absolute imports of `path` that are not standard-library modules (relative imports stay inside)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        bad += [
            f"{path.name}:{node.lineno} {n}"
            for n in names
            if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"
        ]
    return bad


def test_every_builder_module_imports_only_the_standard_library() -> None:
    files = sorted(BUILDER.rglob("*.py"))
    assert len(files) > 10 and (BUILDER / "patches" / "setup_hook.py") in files
    bad = [b for f in files for b in imports_outside_stdlib(f)]
    # the setup hook is copied into flash-attn's tree and runs inside its setup.py, where torch is importable
    assert [b for b in bad if not (b.startswith("setup_hook.py:") and b.endswith(" torch.utils"))] == []


def test_the_rule_sees_a_third_party_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import json\nfrom .x import y\nimport pydantic\nfrom attnforge.core.errors import E\n")
    assert imports_outside_stdlib(module) == ["m.py:3 pydantic", "m.py:4 attnforge.core.errors"]


def test_no_builder_module_shadows_the_standard_library() -> None:
    """`python rusage_wrap.py` puts the builder folder first on sys.path: a `select.py` there would break
    subprocess in that process."""
    assert [p.stem for p in BUILDER.glob("*.py") if p.stem in sys.stdlib_module_names] == []
