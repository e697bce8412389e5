"""Compiled kernel objects shared between the cells of one kernel set (``kernel_objects_dir``).

The first cell to compile a kernel set copies its kernel (``.cu``) objects there with a manifest of what
they were built from; later cells whose identity matches link those objects instead of compiling (the
setup hook's ``ATTNFORGE_PREBUILT_OBJECTS``). Python is deliberately not part of the identity: kernel
units do not include Python headers; nor is torch once the ``torch-free-kernels`` patch applies.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .ninja import build_temp
from .patches import torch_free
from .report import Reporter
from .spec import BuildSpec


def identity(spec: BuildSpec, tool: dict[str, str | None]) -> dict[str, Any]:
    """What must match for prebuilt kernel objects to be reused.

    torch is left out when a ``torch_free`` patch took it out of the kernel units (the kernel-set key then
    leaves it out too); nvcc counts by major.minor (the toolkit of the key: objects of one CUDA minor link
    and load alike, the exact release and the host compiler are recorded in the manifest's ``built_with``).
    """
    nvcc = tool.get("nvcc")
    return {
        "kernel": spec.kernel,
        "kernel_version": spec.kernel_version,
        "source_sha256": spec.source.sha256.lower(),
        "kernel_set_key": spec.kernel_set_key,
        "arches": list(spec.arches),
        "disable": list(spec.disable),
        "head_dims": spec.head_dims,
        "dtypes": spec.dtypes,
        "torch": None if torch_free(spec.patches) else tool.get("torch"),
        "nvcc": ".".join(nvcc.split(".")[:2]) if nvcc else None,
        "cxx11_abi": spec.cxx11_abi,
        "nvcc_append_flags": spec.nvcc_append_flags,
    }


def usable_prebuilt(spec: BuildSpec, ident: dict[str, Any], rep: Reporter) -> Path | None:
    """The objects folder when it holds objects built for ``ident``, else None."""
    d = spec.kernel_objects_dir
    if not d or spec.kernel != "flash-attn" or spec.pure_python:
        return None
    manifest = Path(d) / "manifest.json"
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except ValueError:
        return None
    if data.get("identity") != ident:
        rep.line(f"attnforge: kernel objects in {d} were built for something else; compiling")
        return None
    return Path(d)


def save_kernel_objects(
    spec: BuildSpec,
    tree: Path,
    compiled: list[str],
    ident: dict[str, Any],
    py_tag: str,
    rep: Reporter,
    built_with: dict[str, Any] | None = None,
) -> bool:
    """Copy the compiled kernel (.cu) objects to kernel_objects_dir, atomically; True when saved. Objects
    already there for the same identity stay; objects built for something else (an older toolchain or
    builder) are replaced, or no later cell could ever reuse this kernel set's objects."""
    if not spec.kernel_objects_dir:
        return False
    dest = Path(spec.kernel_objects_dir)
    if (dest / "manifest.json").is_file():
        try:
            same = json.loads((dest / "manifest.json").read_text(encoding="utf-8")).get("identity") == ident
        except ValueError:
            same = False
        if same:
            return False
        stale = dest.with_name(f"{dest.name}.stale{os.getpid()}")
        try:
            os.rename(dest, stale)
        except OSError:
            return False  # another cell is replacing them
        shutil.rmtree(stale, ignore_errors=True)
        rep.line(f"attnforge: replacing kernel objects in {dest} that were built for something else")
    kernels = [s for s in compiled if s.endswith(".cu")]
    temp = build_temp(tree, py_tag)
    if not kernels:
        return False
    if temp is None:
        rep.line(f"attnforge: no build/temp.*-{py_tag} directory; kernel objects not saved")
        return False
    objects: dict[str, str] = {}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp", dir=str(dest.parent)))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; other users' builds read it
    try:
        for src in kernels:
            obj = temp / (os.path.splitext(src)[0] + ".o")
            if not obj.is_file():
                rep.line(f"attnforge: missing object {obj}; kernel objects not saved")
                return False
            shutil.copyfile(obj, tmp / obj.name)
            objects[src] = obj.name
        manifest = {
            "schema": 1,
            "identity": ident,
            "objects": objects,
            "created_by": spec.cell_id,
            "built_with": built_with or {},
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        try:
            os.rename(tmp, dest)
        except OSError:
            return False  # another cell saved them first
        rep.line(f"attnforge: saved {len(objects)} kernel objects to {dest}")
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
