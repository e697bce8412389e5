"""The patch engine: named JSON patches (``patches/<name>.json``) applied to an unpacked source tree.

A patch names its kernel, the versions it supports and its ``scope``: ``kernels`` (default: it may change
the compiled kernel units, so it is part of the kernel-set key) or ``binding`` (only the per-torch binding
``flash_api.cpp`` and its flags: left out of the key). ``torch_free: true`` marks a patch after which the
kernel units include no torch header (their objects serve every torch release of a CUDA lane). Each edit (``replace``, ``insert_before``,
``insert_after``, ``copy``) must match exactly ``count`` times (default 1), so a patch that no longer fits
its source fails loudly instead of half-applying. Paths in a patch are relative to the archive's top folder.
``requires`` names patches that must be applied before it: the builder orders a spec's patches so they
are, and refuses a set that lacks one (EXIT_CONFIG).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from .exits import EXIT_CONFIG, BuildFailure
from .report import Reporter
from .spec import BuildSpec

PATCHES_DIR = Path(__file__).resolve().parent / "patches"
HOOK_PATCH = "setup-hooks"  # the setup hook: source pruning, profile macros, prebuilt objects, unit order
DISPATCH_PATCH = "dispatch-subset"  # flash_api.cpp dispatches only to compiled head dims and dtypes
FA3_OFFLINE_PATCH = (
    "fa3-offline"  # FA3's hopper/setup.py: no submodule update, toolkit download or wheel lookup
)
FA3_GUARD_PATCH = "fa3-dispatch-guard"  # FA3's mha_fwd refuses a V head dim it has no kernel for
STABLE_PATCH = "stable-abi"  # FA2's binding on torch's stable ABI (flash_api_stable.cpp, one abi3 .so)
STABLE_DISPATCH_PATCH = "dispatch-subset-stable"  # dispatch-subset for flash_api_stable.cpp


def patches_dir() -> Path:
    return PATCHES_DIR


def resolve_patches(spec: BuildSpec, pdir: Path = PATCHES_DIR) -> list[str]:
    """Patch names in application order: the FA2 hook patches when the spec needs them (with the stable-ABI
    binding, its own dispatch-subset too), FA3's offline and dispatch-guard patches always; each after the
    patches it ``requires``."""
    names = list(spec.patches)
    if spec.kernel == "flash-attn-3":
        names += [p for p in (FA3_OFFLINE_PATCH, FA3_GUARD_PATCH) if p not in names]
    if spec.kernel == "flash-attn" and not spec.pure_python:
        profile = bool(spec.head_dims or spec.dtypes or not spec.backward)
        if (
            profile or spec.disable or spec.kernel_objects_dir or spec.unit_seconds
        ) and HOOK_PATCH not in names:
            names.append(HOOK_PATCH)
        if profile and DISPATCH_PATCH not in names:
            names.append(DISPATCH_PATCH)
        if profile and STABLE_PATCH in names and STABLE_DISPATCH_PATCH not in names:
            names.append(STABLE_DISPATCH_PATCH)
    return order_by_requires(pdir, names)


def requires(pdir: Path, name: str) -> list[str]:
    """The patches a patch needs applied before it (its ``requires``; none for an unknown patch)."""
    return list(load_patch(pdir, name).get("requires", [])) if patch_exists(name, pdir) else []


def order_by_requires(pdir: Path, names: list[str]) -> list[str]:
    """``names`` in their order, but each after the patches it requires (which must be among them);
    BuildFailure(EXIT_CONFIG) naming a missing requirement or a cycle."""
    check_requires(pdir, names)
    ordered: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in ordered:
            return
        if name in visiting:
            raise BuildFailure(EXIT_CONFIG, f"patches require each other in a cycle through {name!r}")
        visiting.add(name)
        for dep in requires(pdir, name):
            visit(dep)
        visiting.discard(name)
        ordered.append(name)

    for name in names:
        visit(name)
    return ordered


def check_requires(pdir: Path, names: list[str]) -> None:
    """Every patch's ``requires`` is in the set (BuildFailure(EXIT_CONFIG) naming the first missing one)."""
    for name in names:
        missing = [dep for dep in requires(pdir, name) if dep not in names]
        if missing:
            raise BuildFailure(
                EXIT_CONFIG,
                f"patch {name} requires {', '.join(missing)}, which the build does not apply "
                f"(patches: {', '.join(names)})",
            )


def load_patch(pdir: Path, name: str) -> dict[str, Any]:
    path = pdir / f"{name}.json"
    if not path.is_file():
        raise BuildFailure(EXIT_CONFIG, f"unknown patch {name!r} (no {path})")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def patch_exists(name: str, pdir: Path = PATCHES_DIR) -> bool:
    return (pdir / f"{name}.json").is_file()


@functools.lru_cache(maxsize=64)
def _meta(pdir: Path, name: str) -> tuple[str, bool]:
    """(scope, torch_free) of a patch file; an unknown patch counts as ("kernels", False)."""
    if not patch_exists(name, pdir):
        return "kernels", False
    data = load_patch(pdir, name)
    return str(data.get("scope", "kernels")), bool(data.get("torch_free"))


def patch_scope(name: str, pdir: Path = PATCHES_DIR) -> str:
    """``kernels`` or ``binding`` (see the module docstring)."""
    return _meta(pdir, name)[0]


def torch_free(names: list[str] | tuple[str, ...], pdir: Path = PATCHES_DIR) -> bool:
    """Whether one of the patches makes the kernel units independent of torch (``torch_free: true``)."""
    return any(_meta(pdir, n)[1] for n in names)


def patch_digest(pdir: Path, names: list[str]) -> str:
    """Hash of the patch files (and the files they copy): tells whether an unpacked tree is current."""
    h = hashlib.sha256()
    for name in names:
        data = load_patch(pdir, name)
        h.update(json.dumps(data, sort_keys=True).encode())
        for edit in data.get("edits", []):
            if edit.get("op") == "copy":
                h.update((pdir / edit["from"]).read_bytes())
    return h.hexdigest()[:16]


def _version_matches(version: str | None, patterns: list[str]) -> bool:
    return not patterns or version is None or any(fnmatch.fnmatch(version, p) for p in patterns)


def apply_patch(top: Path, pdir: Path, name: str, spec: BuildSpec, rep: Reporter) -> None:
    """Apply one patch's edits under ``top``; every edit must match exactly ``count`` times."""
    data = load_patch(pdir, name)
    if data.get("kernel") and data["kernel"] != spec.kernel:
        raise BuildFailure(EXIT_CONFIG, f"patch {name} is for {data['kernel']}, not {spec.kernel}")
    if not _version_matches(spec.kernel_version, list(data.get("versions", []))):
        raise BuildFailure(
            EXIT_CONFIG, f"patch {name} supports {data['versions']}, not {spec.kernel_version}"
        )
    for i, edit in enumerate(data.get("edits", [])):
        op = edit.get("op")
        where = f"patch {name} edit {i} ({op})"
        if op == "copy":
            dest = top / edit["to"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pdir / edit["from"], dest)
            continue
        target = top / edit["file"]
        if not target.is_file():
            raise BuildFailure(EXIT_CONFIG, f"{where}: {edit['file']} not found in the source")
        text = target.read_text(encoding="utf-8")
        needle = edit["old"] if op == "replace" else edit["anchor"]
        found = text.count(needle)
        want = int(edit.get("count", 1))
        if found != want:
            raise BuildFailure(
                EXIT_CONFIG,
                f"{where}: expected {want} occurrence(s) of {needle!r} in {edit['file']}, found {found}: "
                "the patch does not apply to this source",
            )
        if op == "replace":
            new = text.replace(needle, edit["new"])
        elif op == "insert_before":
            new = text.replace(needle, edit["text"] + needle)
        elif op == "insert_after":
            new = text.replace(needle, needle + edit["text"])
        else:
            raise BuildFailure(EXIT_CONFIG, f"{where}: unknown op")
        target.write_text(new, encoding="utf-8")
    rep.line(f"attnforge: applied patch {name}" + (f": {data['log']}" if data.get("log") else ""))
