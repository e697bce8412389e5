"""attnforge's hook for flash-attn's setup.py; copied into the unpacked sdist as attnforge_setup_hook.py.

setup.py calls ``apply(ext_modules)`` just before ``setup()`` (the "setup-hooks" patch). Environment:

- ``ATTNFORGE_HEAD_DIMS=128,256``  keep only these head dims' kernel units
- ``ATTNFORGE_DTYPES=bf16``        keep only these dtypes' kernel units (fp16, bf16)
- ``ATTNFORGE_DROP_BACKWARD=1``    drop the flash_bwd_* units (needs -DFLASHATTENTION_DISABLE_BACKWARD)
- ``ATTNFORGE_DEFINES="-DX -DY"``  added to both the nvcc and the host-compiler flags
- ``ATTNFORGE_PROFILE=hd128``  this build's profile tag: written as ``csrc/flash_attn/attnforge_profile.h``
  beside ``attnforge_dispatch.h`` (where the dispatch-subset patch put it), whose errors name it
- ``ATTNFORGE_PREBUILT_OBJECTS=DIR`` link DIR's objects (DIR/manifest.json maps source -> object file)
  instead of compiling those sources
- ``ATTNFORGE_KERNEL_LANE=DIR``   kernel units the builder compiled while torch installed (DIR/lane.json):
  each is linked where torch's flags for it match the lane's (``normalized_flags``), else ninja compiles it
- ``ATTNFORGE_UNIT_SECONDS="flash_api=129,flash_fwd_split_hdim128_bf16_sm80=453"`` estimated compile time
  per unit (stem): ninja starts the units longest first (units without an estimate: ``unit_cost``);
  ``start_in_order`` puts that order into torch's ninja file (setuptools sorts sources by name)

- ``ATTNFORGE_GENCODE="arch=compute_90,code=sm_90;arch=compute_90,code=compute_90"`` the arch policy's
  ``-gencode`` pairs, in place of every ``-gencode`` setup.py put in the nvcc flags (empty: setup.py's stay)
- ``ATTNFORGE_CROSS_TORCH=DIR``, ``ATTNFORGE_CROSS_LIBS=D1:D2``, ``ATTNFORGE_CROSS_EXT_SUFFIX=.cpython-312-
  aarch64-linux-gnu.so`` a cross build (builder/cross.py): the target torch's headers for the build torch's,
  its libraries (and the CUDA runtime's) first on the link path, and the target's extension file name

It prints one ``@@attnforge {"event": "sources", ...}`` line. Runs under the build's Python (3.8+), stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from typing import Any

KERNEL_RE = re.compile(
    r"flash_(?P<kind>fwd_split|fwd|bwd)_hdim(?P<hdim>\d+)_(?P<dtype>fp16|bf16)(?P<causal>_causal)?_sm\d+\.cu$"
)
EXTENSION = "flash_attn_2_cuda"
# defines only torch's and pybind11's headers read: a torch-free kernel unit compiles the same without them
TORCH_ONLY_DEFINES = ("-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=", "-DPYBIND11_")


def _csv(name: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, "").split(",") if x.strip()]


def _prebuilt(directory: str) -> dict[str, str]:
    """Map source path -> absolute object path from DIR/manifest.json; empty when DIR has none."""
    manifest = os.path.join(directory, "manifest.json")
    if not directory or not os.path.isfile(manifest):
        return {}
    with open(manifest, encoding="utf-8") as fh:
        objects = json.load(fh).get("objects", {})
    out = {}
    for src, obj in objects.items():
        path = os.path.join(directory, obj)
        if os.path.isfile(path):
            out[src] = path
    return out


def keep_source(src: str, head_dims: set[int], dtypes: set[str], drop_backward: bool) -> bool:
    """Whether a source survives the head-dim / dtype / direction filters (non-kernel files always do)."""
    m = KERNEL_RE.search(src.replace("\\", "/"))
    if m is None:
        return True
    if head_dims and int(m.group("hdim")) not in head_dims:
        return False
    if dtypes and m.group("dtype") not in dtypes:
        return False
    return not (drop_backward and m.group("kind") == "bwd")


# Relative compile cost by kind when no measured estimate is given (H100, nvcc 13.0, hd64128: the split-KV
# units were the longest, then backward, then forward; issue #18).
KIND_WEIGHT = {"fwd_split": 2.2, "bwd": 1.6, "fwd": 1.0}


def unit_cost(src: str) -> float:
    """Rough relative compile cost of a source (seconds-like), for units without a measured estimate."""
    m = KERNEL_RE.search(src.replace("\\", "/"))
    if m is None:
        return 80.0  # flash_api.cpp: a few minutes of host compile
    causal = 0.8 if m.group("causal") else 1.0
    return 190.0 * KIND_WEIGHT[m.group("kind")] * causal * (0.75 + int(m.group("hdim")) / 512.0)


def unit_seconds(text: str) -> dict[str, float]:
    """``a=1.5,b=20`` -> {"a": 1.5, "b": 20.0}; malformed items are ignored."""
    out: dict[str, float] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            continue
    return out


def longest_first(sources: list[str], estimates: dict[str, float] | None = None) -> list[str]:
    """Sources ordered longest-first (stable; longest-processing-time order): ninja starts them in this order,
    so the slowest units do not start last and leave the other cores idle at the tail."""
    est = estimates or {}

    def cost(src: str) -> float:
        stem = os.path.splitext(os.path.basename(src))[0]
        return est[stem] if stem in est else unit_cost(src)

    return sorted(sources, key=cost, reverse=True)


def normalized_flags(flags: list[str], tree: str, cuda_home: str) -> list[str]:
    """What of a kernel unit's nvcc flags can change a torch-free object: no include folder outside the source
    tree and the toolkit (torch's, Python's), no define only torch's headers read, no default C++11 ABI define."""
    out = []
    for flag in flags:
        bare = flag.strip("'\"")
        if bare.startswith("-I") and not bare[2:].startswith((tree, cuda_home)):
            continue
        if bare.startswith(TORCH_ONLY_DEFINES) or bare == "-D_GLIBCXX_USE_CXX11_ABI=1":
            continue
        out.append(flag)
    return out


def read_lane(directory: str) -> dict[str, Any]:
    """DIR/lane.json, or {} when there is none."""
    try:
        with open(os.path.join(directory, "lane.json"), encoding="utf-8") as fh:
            return dict(json.load(fh))
    except (OSError, ValueError):
        return {}


def lane_units(directory: str, sources: list[str], kwargs: dict[str, Any]) -> tuple[dict[str, str], str]:
    """{absolute source: lane object} for the sources the kernel lane compiles with torch's own flags, and
    why none are taken when the flags differ."""
    lane = read_lane(directory)
    if not lane:
        return {}, ""
    tree, home = str(lane.get("tree", "")), str(lane.get("cuda_home", ""))
    torch_flags = list(kwargs.get("cuda_cflags") or []) + list(kwargs.get("cuda_post_cflags") or [])
    want = normalized_flags(torch_flags, tree, home)
    have = normalized_flags(list(lane.get("flags", [])), tree, home)
    if want != have:
        diff = [f for f in want if f not in have][:3] + ["!" + f for f in have if f not in want][:3]
        return {}, "torch's nvcc flags differ from the kernel lane's: " + " ".join(diff)
    units = {
        os.path.abspath(os.path.join(tree, s)): str(u["object"]) for s, u in lane.get("units", {}).items()
    }
    return {s: units[os.path.abspath(s)] for s in sources if os.path.abspath(s) in units}, ""


def wait_for_lane(directory: str, taken: dict[str, str], poll: float = 1.0) -> list[str]:
    """Wait until the lane has finished every taken unit; the sources it failed (ninja compiles those)."""
    rel = {}
    lane = read_lane(directory)
    tree = str(lane.get("tree", ""))
    for src in lane.get("units", {}):
        rel[os.path.abspath(os.path.join(tree, src))] = src
    while True:
        units = read_lane(directory).get("units", {})
        states = {s: units.get(rel.get(os.path.abspath(s), ""), {}).get("ok") for s in taken}
        if all(v is not None for v in states.values()):
            return [s for s, ok in states.items() if not ok]
        time.sleep(poll)


def start_in_order(order: list[str], lane_dir: str = "") -> bool:
    """Make torch's ninja file list the compile edges in ``order`` (ninja starts equal-priority edges in file
    order; setuptools sorts an extension's sources by name before compiling them, which put flash-attn's
    split-KV units last). Only the ninja file's order changes: the objects are linked in the sorted order
    as before, so the .so is the same. With ``lane_dir`` the kernel lane's objects stand in for the units it
    compiled with the same flags: ninja compiles the rest (the binding) meanwhile, then the lane's objects are
    copied where torch links them. False when this torch has no ``_write_ninja_file_and_compile_objects``."""
    try:
        from torch.utils import cpp_extension
    except ImportError:
        return False
    original = getattr(cpp_extension, "_write_ninja_file_and_compile_objects", None)
    if original is None:
        return False
    rank = {os.path.abspath(src): i for i, src in enumerate(order)}

    def ordered(*args: Any, **kwargs: Any) -> Any:
        sources, objects = kwargs.get("sources"), kwargs.get("objects")
        if sources is None or objects is None or len(sources) != len(objects):
            return original(*args, **kwargs)
        pairs = sorted(zip(sources, objects), key=lambda p: rank.get(os.path.abspath(p[0]), len(rank)))  # noqa: B905 (3.8+)
        taken, why = lane_units(lane_dir, sources, kwargs) if lane_dir else ({}, "")
        if lane_dir:
            event = {"event": "lane", "linked": sorted(os.path.basename(s) for s in taken), "mismatch": why}
            print("@@attnforge " + json.dumps(event), flush=True)
        rest = [p for p in pairs if p[0] not in taken]
        result = None
        if rest or not taken:
            kwargs["sources"], kwargs["objects"] = [s for s, _ in rest], [o for _, o in rest]
            result = original(*args, **kwargs)
        if taken:
            failed = wait_for_lane(lane_dir, taken)
            for src, obj in pairs:
                if src in taken and src not in failed:
                    os.makedirs(os.path.dirname(obj), exist_ok=True)
                    shutil.copyfile(taken[src], obj)
            if failed:
                again = [p for p in pairs if p[0] in failed]
                kwargs["sources"], kwargs["objects"] = [s for s, _ in again], [o for _, o in again]
                result = original(*args, **kwargs)
        return result

    cpp_extension._write_ninja_file_and_compile_objects = ordered
    return True


def replace_gencode(nvcc_args: list[str], gencode: list[str]) -> list[str]:
    """``nvcc_args`` with every ``-gencode X`` pair (and ``-gencode=X``) replaced by ``gencode``'s pairs."""
    out: list[str] = []
    skip = False
    for arg in nvcc_args:
        if skip:
            skip = False
            continue
        if arg in ("-gencode", "--generate-code"):
            skip = True
            continue
        if arg.startswith(("-gencode=", "--generate-code=")):
            continue
        out.append(arg)
    for pair in gencode:
        out += ["-gencode", pair]
    return out


def cross_paths(ext: Any, native_torch: str, target_torch: str, libs: list[str]) -> None:
    """Point an extension at the target's torch: its include dirs under the build torch become the target
    torch's, and the target's library dirs come first (the linker skips the other architecture's)."""
    includes = [str(d) for d in ext.include_dirs]  # setup.py may give Path objects
    ext.include_dirs = [
        target_torch + d[len(native_torch) :] if d.startswith(native_torch) else d for d in includes
    ]
    ext.library_dirs = libs + [str(d) for d in ext.library_dirs if not str(d).startswith(native_torch)]


def cross_ext_suffix(suffix: str) -> None:
    """Name extension files with the target's suffix (``.cpython-312-aarch64-linux-gnu.so``) instead of the
    build interpreter's."""
    import sysconfig

    from torch.utils import cpp_extension  # its BuildExtension: setuptools' build_ext below flash-attn's

    native = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    original: Any = cpp_extension.BuildExtension.get_ext_filename

    def get_ext_filename(self: Any, fullname: str) -> str:
        name = str(original(self, fullname))
        return name[: -len(native)] + suffix if name.endswith(native) else name

    cpp_extension.BuildExtension.get_ext_filename = get_ext_filename  # type: ignore[method-assign]


PROFILE_HEADER = "attnforge_profile.h"
TAG_RE = re.compile(r"^[a-z][a-z0-9]*$")  # a profile tag (matrix schema): nothing else reaches the C++ text


def profile_header(profile: str) -> str:
    """attnforge_profile.h: this build's profile tag as attnforge_dispatch.h reads it (ATTNFORGE_PROFILE_NAME;
    empty when it is not a plain name)."""
    name = profile if TAG_RE.match(profile) else ""
    return (
        "// Written by attnforge's setup hook: the profile this wheel was built with (attnforge_dispatch.h).\n"
        f'#pragma once\n#define ATTNFORGE_PROFILE_NAME "{name}"\n'
    )


def write_profile_header(root: str) -> str | None:
    """Write ``<root>/csrc/flash_attn/attnforge_profile.h`` from ATTNFORGE_PROFILE when the dispatch header is
    there (rewritten only when it changes: ninja would recompile the binding); its path, or None."""
    folder = os.path.join(root, "csrc", "flash_attn")
    if not os.path.isfile(os.path.join(folder, "attnforge_dispatch.h")):
        return None
    text = profile_header(os.environ.get("ATTNFORGE_PROFILE", ""))
    path = os.path.join(folder, PROFILE_HEADER)
    current = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            current = fh.read()
    if current != text:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    return path


def apply(ext_modules: list[Any]) -> None:
    """Prune sources, add macros and swap in prebuilt objects on flash-attn's CUDA extension."""
    write_profile_header(os.path.dirname(os.path.abspath(__file__)))
    head_dims = {int(x) for x in _csv("ATTNFORGE_HEAD_DIMS")}
    dtypes = set(_csv("ATTNFORGE_DTYPES"))
    drop_backward = os.environ.get("ATTNFORGE_DROP_BACKWARD", "") == "1"
    defines = os.environ.get("ATTNFORGE_DEFINES", "").split()
    prebuilt = _prebuilt(os.environ.get("ATTNFORGE_PREBUILT_OBJECTS", ""))
    bad = dtypes - {"fp16", "bf16"}
    if bad:
        raise SystemExit(f"attnforge: unknown dtypes {sorted(bad)} in ATTNFORGE_DTYPES")
    if drop_backward and "-DFLASHATTENTION_DISABLE_BACKWARD" not in defines:
        raise SystemExit("attnforge: ATTNFORGE_DROP_BACKWARD=1 needs -DFLASHATTENTION_DISABLE_BACKWARD")
    host_only = []
    if head_dims:
        host_only.append("-DATTNFORGE_HEAD_DIMS=" + ",".join(str(d) for d in sorted(head_dims)))
    if dtypes:
        host_only += [
            f"-DATTNFORGE_FP16={int('fp16' in dtypes)}",
            f"-DATTNFORGE_BF16={int('bf16' in dtypes)}",
        ]
    for ext in ext_modules:
        if ext.name != EXTENSION:
            continue
        compile_list: list[str] = []
        reused: list[str] = []
        pruned: list[str] = []
        for src in ext.sources:
            if not keep_source(src, head_dims, dtypes, drop_backward):
                pruned.append(src)
            elif src in prebuilt:
                ext.extra_objects.append(prebuilt[src])
                reused.append(src)
            else:
                compile_list.append(src)
        compile_list = longest_first(compile_list, unit_seconds(os.environ.get("ATTNFORGE_UNIT_SECONDS", "")))
        ext.sources = compile_list
        ordered = start_in_order(compile_list, os.environ.get("ATTNFORGE_KERNEL_LANE", ""))
        args = ext.extra_compile_args
        args["cxx"] = list(args.get("cxx", [])) + defines + host_only
        args["nvcc"] = list(args.get("nvcc", [])) + defines
        gencode = [g for g in os.environ.get("ATTNFORGE_GENCODE", "").split(";") if g]
        if gencode:
            args["nvcc"] = replace_gencode(args["nvcc"], gencode)
        target_torch = os.environ.get("ATTNFORGE_CROSS_TORCH", "")
        if target_torch:
            from torch.utils import cpp_extension

            native_torch = os.path.dirname(os.path.dirname(os.path.abspath(cpp_extension.__file__)))
            libs = [d for d in os.environ.get("ATTNFORGE_CROSS_LIBS", "").split(os.pathsep) if d]
            cross_paths(ext, native_torch, target_torch, libs)
            cross_ext_suffix(os.environ.get("ATTNFORGE_CROSS_EXT_SUFFIX", ".so"))
        event = {
            "event": "sources",
            "compile": compile_list,
            "prebuilt": reused,
            "pruned": pruned,
            "defines": defines + host_only,
            "order": "longest first" if ordered else "by name (torch has no ninja-file hook)",
            "lane": bool(os.environ.get("ATTNFORGE_KERNEL_LANE")),  # the builder announced the plan already
            "gencode": gencode,
            "cross": target_torch or None,
        }
        print("@@attnforge " + json.dumps(event), flush=True)
