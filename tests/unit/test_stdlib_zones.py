"""What a module's docstring says it needs is what it needs: a module that claims "standard library only"
(build containers, bare GPU hosts, a probed interpreter) or "standard library and torch only" (the venv that
holds a wheel under test) is a source of the matching forbidden-import contract in pyproject.toml, whose
list names every third-party package src/ imports; the standard-library zone imports, for real, in an
interpreter without site-packages; and the files copied out of the package (the smoke script, the pytest
plugins, the setup hook) and the runtimes shipped under another name import nothing of attnforge outside
themselves.

Costs about a second: one `python -I -S` that imports the zone's modules; the rest is parsing.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.import_scan import PACKAGE, ROOT, Import, all_imports, is_stdlib, loaded_at_import, modules

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STDLIB = "Standard library only"
WITH_TORCH = "Standard library and torch only"
# "Standard library only", "stdlib only", "Standard library + torch only", "Standard library, pytest and torch only"
CLAIM = re.compile(r"\b(?:standard library|stdlib)(?P<also>(?:[ ,+]+(?:and )?\w+)*?) only\b", re.IGNORECASE)
COPIED = [  # single files copied out of the package and run where attnforge is not importable
    "attnforge.images.smoke_script",  # /opt/attnforge/smoke.py in every image
    "attnforge.parity.upstream_plugin",  # conftest.py beside upstream's tests
    "attnforge.fa4.upstream_plugin",
    "attnforge.builder.patches.setup_hook",  # attnforge_setup_hook.py in the unpacked sdist
]
RUNTIMES = ["attnforge.flex.runtime", "attnforge.fa4.runtime"]  # shipped as attnforge_flex and attnforge_fa4


def contract(name: str) -> dict[str, Any]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (found,) = [c for c in contracts["contracts"] if c["name"] == name]
    return dict(found)


def in_zone(module: str, zone: dict[str, Any]) -> bool:
    return any(module == s or module.startswith(s + ".") for s in zone["source_modules"])


@functools.cache
def claims(package: Path = PACKAGE) -> dict[str, str]:
    """module -> the kind of claim its docstring makes (STDLIB or WITH_TORCH), for every module that makes one."""
    out = {}
    for name, path in modules(package).items():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        found = [m["also"] for m in CLAIM.finditer(" ".join(doc.split()))]
        if found:
            out[name] = WITH_TORCH if any("torch" in also or "pytest" in also for also in found) else STDLIB
    return out


@pytest.fixture(scope="module")
def every() -> list[Import]:
    return all_imports()


def test_the_claim_pattern() -> None:
    texts = {
        "Standard library only.": "",
        "(plain dicts; stdlib only)": "",
        "Standard library + torch only, so": " + torch",
        "Standard library, pytest and torch only.": ", pytest and torch",
        "Standard library and pytest only (it runs": " and pytest",
    }
    for text, also in texts.items():
        match = CLAIM.search(text)
        assert match is not None and match["also"] == also, text
    assert CLAIM.search("the standard library is enough for most of it") is None


def test_every_claim_is_enforced_by_its_contract() -> None:
    found = claims()
    assert len(found) >= 15
    assert found["attnforge.names"] == STDLIB and found["attnforge.images.smoke_script"] == WITH_TORCH
    zones = {STDLIB: contract(STDLIB), WITH_TORCH: contract(WITH_TORCH)}
    setup_hook = "attnforge.builder.patches.setup_hook"  # not a module of the package: test_builder_stdlib.py
    missing = [
        f"{module}: says '{kind}' but is not a source of that contract in pyproject.toml"
        for module, kind in sorted(found.items())
        if module != setup_hook and not in_zone(module, zones[kind])
    ]
    assert not missing, "\n".join(missing)


def parity_runners() -> list[str]:
    """The modules parity/__init__.py says run cases with the standard library and torch only."""
    doc = ast.get_docstring(ast.parse((PACKAGE / "parity" / "__init__.py").read_text(encoding="utf-8"))) or ""
    sentence = " ".join(doc.split()).split("need only the standard library and torch")[0].rsplit(".", 1)[-1]
    return [f"attnforge.parity.{m}" for m in re.findall(r"`(\w+)`", sentence)]


def test_every_zone_member_makes_its_claim() -> None:
    """A contract's source that says nothing in its docstring (or its package's) would leave a reader guessing
    why it is there."""
    found = claims()
    runners = parity_runners()
    for kind in (STDLIB, WITH_TORCH):
        for source in contract(kind)["source_modules"]:
            assert found.get(source) == kind or source in runners, f"{source}: no '{kind}' in its docstring"


def test_the_forbidden_lists_name_every_third_party_package(every: list[Import]) -> None:
    third_party = {i.top for i in every if not i.internal and not is_stdlib(i.target)}
    assert {"pydantic", "torch", "yaml", "click"} <= third_party
    for kind, allowed in ((STDLIB, set()), (WITH_TORCH, {"torch"})):
        listed = set(contract(kind)["forbidden_modules"])
        assert third_party - allowed - listed == set(), f"'{kind}' does not forbid them"
        assert allowed & listed == set()


def test_the_torch_zone_loads_nothing_else_at_import(every: list[Import]) -> None:
    zone = contract(WITH_TORCH)
    for module in zone["source_modules"]:
        outside = {n for n in loaded_at_import(module, every)[1] if not is_stdlib(n)}
        ignored = {i.split(" -> ")[1] for i in zone["ignore_imports"] if i.startswith(module + " ->")}
        assert outside - {"torch"} - ignored == set(), module


def test_the_standard_library_zone_imports_without_site_packages() -> None:
    """Each module of the zone (whole packages: every module) imports in `python -I -S`, where no third-party
    package exists; any module outside the standard library it loads is named with the import that loaded it."""
    zone = contract(STDLIB)
    known = modules()
    names = sorted(
        m
        for m, path in known.items()
        if in_zone(m, zone)
        and path.name != "__main__.py"  # runs the command
        and (
            path.name == "__init__.py" or (path.parent / "__init__.py").is_file()
        )  # not the copied setup hook
    )
    assert len(names) > 30 and "attnforge.builder.main" in names
    code = (
        "import importlib, json, sys\n"
        f"sys.path.insert(0, {str(PACKAGE.parent)!r})\n"
        "out = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    before = set(sys.modules)\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        out[name] = [f'{type(exc).__name__}: {exc}']\n"
        "        continue\n"
        "    new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "    bad = sorted(new - set(sys.stdlib_module_names) - {'attnforge'})\n"
        "    if bad:\n"
        "        out[name] = bad\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, json.dumps(names)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(proc.stdout) == {}


def test_copied_files_and_shipped_runtimes_import_nothing_of_attnforge_beside_themselves(
    every: list[Import],
) -> None:
    known = modules()
    assert set(COPIED) <= set(known)
    for module in COPIED:
        assert [i.at for i in every if i.source == module and i.internal] == []
    for runtime in RUNTIMES:
        inside = [i for i in every if i.source == runtime or i.source.startswith(runtime + ".")]
        assert inside, runtime
        outside = [f"{i.at} {i.target}" for i in inside if i.internal and not i.target.startswith(runtime)]
        assert outside == [], f"{runtime} is shipped alone (relative imports only): {outside}"


def test_the_parity_runners_listed_in_the_package_docstring_are_zoned() -> None:
    """parity/__init__.py says which modules run cases with the standard library and torch only."""
    listed = parity_runners()
    assert len(listed) >= 10 and "attnforge.parity.parity_run" in listed
    zones = [contract(STDLIB), contract(WITH_TORCH)]
    assert [m for m in listed if not any(in_zone(m, z) for z in zones)] == []
