"""The plan numbers in the docs are the plan's: each marked number and cost block matches what
`scripts/docs_numbers.py` computes, and no count of cells, wheels or kernel sets is written by hand.

Costs about 15 s of CPU: the release target planned with its own `abi:` and with `abi: torch`, and costed."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from attnforge.matrix.project import Project

ROOT = Path(__file__).resolve().parents[2]

# A count of cells, wheels or kernel sets, as far as a regex can tell ("CUDA 12 wheels" is a toolkit, not a count).
BARE = re.compile(
    r"(?<![\w.,])(?<!CUDA )(?<!<= )(?<!>= )(\d[\d,]*)\s+"
    r"(?:valid\s+|invalid\s+|distinct\s+|CUDA\s+|stable-ABI\s+|per-torch\s+)?(?:cells?|wheels?|kernel[- ]sets?|build jobs)\b"
)
# Counts that are not the plan's: what one measured experiment built (its own cells), said where it stands.
NOT_PLAN = {
    ("docs/build.md", "so 6 cells are 2.0x one cell's unit-seconds"),
}


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_numbers", ROOT / "scripts" / "docs_numbers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_numbers"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dn() -> ModuleType:
    return _load()


@pytest.fixture(scope="module")
def numbers(dn: ModuleType) -> object:
    return dn.Numbers(Project(ROOT / "matrix.yaml", None))


def test_marked_numbers_are_the_plans(dn: ModuleType, numbers: object) -> None:
    found = [d for name in dn.FILES for d in dn.differences(ROOT / name, numbers)]
    assert not found, "\n".join(found) + "\nrun `python scripts/docs_numbers.py`"
    marked = sum(len(dn.MARK.findall((ROOT / name).read_text(encoding="utf-8"))) for name in dn.FILES)
    assert marked >= 10


def test_a_changed_number_is_found_and_rewritten(dn: ModuleType, numbers: object, tmp_path: Path) -> None:
    text = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    stale = re.sub(r"(<!-- plan:release:valid -->)\d[\d,]*", r"\g<1>175", text, count=1)
    assert stale != text
    copy = tmp_path / "ci.md"
    copy.write_text(stale, encoding="utf-8")
    (found,) = dn.differences(copy, numbers)
    assert "release:valid: written 175, the plan says" in found
    assert dn.rewrite(stale, numbers) == text
    assert dn.main(["--check", str(copy)], log=lambda _: None) == 1
    assert dn.main([str(copy)], log=lambda _: None) == 0 and copy.read_text(encoding="utf-8") == text


def test_no_count_is_written_by_hand(dn: ModuleType) -> None:
    bare = []
    for name in dn.FILES:
        text = (ROOT / name).read_text(encoding="utf-8")
        text = dn.BLOCK.sub("", dn.MARK.sub("", text))
        for m in BARE.finditer(text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            line_end = text.find("\n", m.end())
            context = text[line_start : line_end if line_end >= 0 else None]
            if not any(name == f and phrase in context for f, phrase in NOT_PLAN):
                bare.append(f"{name}: {m.group(0)!r} in {context.strip()!r}")
    assert not bare, "mark these (scripts/docs_numbers.py) or say they are not the plan's:\n" + "\n".join(
        bare
    )


def test_the_bare_count_pattern() -> None:
    hits = [
        m.group(0) for m in BARE.finditer("is 175 valid cells in 17 kernel-sets, 100 wheels; CUDA 12 wheels")
    ]
    assert hits == ["175 valid cells", "17 kernel-sets", "100 wheels"]
