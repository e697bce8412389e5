"""The stable-abi patch set (patches/stable-abi.json) on the real flash-attn 2.8.3 sdist: it applies after
torch-free-kernels, swaps the binding for flash_api_stable.cpp with the stable-ABI flags, never runs the
cached-wheel download, and routes flash_attn_interface through torch.ops.flash_attn_stable. Where torch
headers with torch/csrc/stable are given ($ATTNFORGE_STABLE_TORCH_INCLUDE), the binding compiles as one
translation unit with TORCH_TARGET_VERSION=2.10 and imports no torch C++ symbol."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from attnforge.builder.exits import EXIT_CONFIG, BuildFailure
from attnforge.builder.importcheck import torch_cxx_imports
from attnforge.builder.patches import (
    PATCHES_DIR,
    check_requires,
    load_patch,
    order_by_requires,
    patch_scope,
    resolve_patches,
)
from attnforge.builder.report import Reporter
from attnforge.builder.source import prepare_tree
from attnforge.builder.spec import BuildSpec, Source

FA_SHA256 = "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"
OPS = ("fwd", "varlen_fwd", "bwd", "varlen_bwd", "fwd_kvcache")


def fa_sdist() -> Path | None:
    env = os.environ.get("ATTNFORGE_FA_SDIST")
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    for path in (Path(env) if env else None, base / "attnforge" / "sources" / "flash_attn-2.8.3.tar.gz"):
        if path is not None and path.is_file():
            return path
    return None


needs_sdist = pytest.mark.skipif(fa_sdist() is None, reason="flash_attn-2.8.3.tar.gz not found")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sdist = fa_sdist()
    assert sdist is not None
    spec = BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source(str(sdist), FA_SHA256),
        python="3.11",
        torch="2.14.1",
        build_dir=str(tmp_path_factory.mktemp("stable")),
        venv_dir="/v",
        output_dir="/o",
        patches=["torch-free-kernels", "stable-abi"],
    )
    return prepare_tree(spec, sdist, ["torch-free-kernels", "stable-abi"], Reporter(None))


def test_the_patch_is_binding_scoped_and_needs_torch_free_kernels() -> None:
    data = load_patch(PATCHES_DIR, "stable-abi")
    assert patch_scope("stable-abi") == "binding" and data["requires"] == ["torch-free-kernels"]
    copied = [e["from"] for e in data["edits"] if e["op"] == "copy"]
    assert all((PATCHES_DIR / name).is_file() for name in copied)
    json.dumps(data)  # plain data


@needs_sdist
def test_setup_py_builds_one_abi3_extension_from_the_stable_binding(tree: Path) -> None:
    setup_py = (tree / "setup.py").read_text()
    ast.parse(setup_py)
    cuda_part = setup_py.split("elif not SKIP_CUDA_BUILD and IS_ROCM")[0]
    assert '"csrc/flash_attn/flash_api_stable.cpp",' in cuda_part
    assert '"csrc/flash_attn/flash_api.cpp"' not in cuda_part
    assert "py_limited_api=True" in cuda_part
    assert '"-DTORCH_TARGET_VERSION=0x020a000000000000", "-DPy_LIMITED_API=0x030a0000"' in cuda_part
    assert 'options={"bdist_wheel": {"py_limited_api": "cp310"}}' in setup_py
    # upstream's CachedWheelsCommand (downloads a prebuilt wheel) is neither registered nor able to download
    assert 'cmdclass={"build_ext": NinjaBuildExtension}' in setup_py
    assert '"bdist_wheel": CachedWheelsCommand' not in setup_py
    assert "if True:  # attnforge stable-abi: never download" in setup_py
    assert 'python_requires=">=3.10"' in setup_py and '"torch>=2.10"' in setup_py


@needs_sdist
def test_the_python_api_goes_through_the_stable_ops(tree: Path) -> None:
    interface = (tree / "flash_attn" / "flash_attn_interface.py").read_text()
    assert "import flash_attn_2_cuda" not in interface
    assert "from . import attnforge_stable as flash_attn_gpu" in interface
    shim = (tree / "flash_attn" / "attnforge_stable.py").read_text()
    module = ast.parse(shim)
    functions = {n.name for n in module.body if isinstance(n, ast.FunctionDef)}
    assert set(OPS) <= functions
    fakes = [
        d.args[0].value  # type: ignore[attr-defined]
        for n in module.body
        if isinstance(n, ast.FunctionDef)
        for d in n.decorator_list
        if isinstance(d, ast.Call) and ast.unparse(d.func) == "torch.library.register_fake"
    ]
    assert fakes == [f"flash_attn_stable::{op}" for op in OPS]
    api = (tree / "csrc" / "flash_attn" / "flash_api_stable.cpp").read_text()
    for op in OPS:
        assert f'm.def("{op}(' in api and f'm.impl("{op}", &boxed_{op});' in api
    assert "Tensor(kc!) kcache, Tensor(vc!) vcache" in api  # the KV cache is written in place
    assert "STABLE_TORCH_LIBRARY(flash_attn_stable, m)" in api
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", api, flags=re.S)
    for word in ("at::", "c10::", "ATen/", "torch/python.h", "pybind11", "Generator"):
        assert word not in code, word


def stable_torch_include() -> Path | None:
    env = os.environ.get("ATTNFORGE_STABLE_TORCH_INCLUDE")
    if env and (Path(env) / "torch" / "csrc" / "stable" / "library.h").is_file():
        return Path(env)
    return None


@needs_sdist
@pytest.mark.skipif(
    stable_torch_include() is None
    or shutil.which("g++") is None
    or not Path("/usr/local/cuda/include").is_dir(),
    reason="set ATTNFORGE_STABLE_TORCH_INCLUDE to a torch >= 2.10 include dir; needs g++ and CUDA headers",
)
def test_the_stable_binding_compiles_for_torch_2_10_and_imports_no_torch_cxx(
    tree: Path, tmp_path: Path
) -> None:
    import sysconfig

    inc = stable_torch_include()
    src = tree / "csrc" / "flash_attn"
    obj = tmp_path / "flash_api_stable.o"
    common = ["g++", "-std=c++17", "-fPIC", "-DTORCH_TARGET_VERSION=0x020a000000000000"]
    includes = [f"-I{inc}", "-I/usr/local/cuda/include", f"-I{sysconfig.get_paths()['include']}"]
    includes += [f"-I{src}", f"-I{src / 'src'}", f"-I{tree / 'csrc' / 'cutlass' / 'include'}"]
    cmd = [*common, "-O1", "-DPy_LIMITED_API=0x030a0000", *includes, "-c", str(src / "flash_api_stable.cpp")]
    proc = subprocess.run([*cmd, "-o", str(obj)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    nm = subprocess.run(
        ["nm", "--undefined-only", "-C", str(obj)], capture_output=True, text=True, check=True
    )
    assert torch_cxx_imports(nm.stdout) == []
    # TORCH_TARGET_VERSION refuses torch's non-stable headers
    probe = tmp_path / "probe.cpp"
    probe.write_text("#include <ATen/cuda/PhiloxCudaState.h>\n")
    refused = subprocess.run(
        [*common, f"-I{inc}", "-fsyntax-only", str(probe)], capture_output=True, text=True
    )
    assert refused.returncode != 0 and "TORCH_TARGET_VERSION" in refused.stderr


# ------------------------------------------------------------------ profiles on the stable binding

PROFILE_PATCHES = [
    "torch-free-kernels",
    "stable-abi",
    "setup-hooks",
    "dispatch-subset",
    "dispatch-subset-stable",
]


def profile_spec(build_dir: str, sdist: Path | None = None, **profile: Any) -> BuildSpec:
    return BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source(str(sdist or "/s.tar.gz"), FA_SHA256),
        python="3.12",
        torch="2.11.0",
        build_dir=build_dir,
        venv_dir="/v",
        output_dir="/o",
        patches=["stable-abi", "torch-free-kernels"],  # a cell's patches come sorted by name
        stable_abi=True,
        **profile,
    )


def test_a_stable_profile_build_gets_the_dispatch_patches_after_what_they_require() -> None:
    names = resolve_patches(profile_spec("/b", head_dims=[128], dtypes=["fp16", "bf16"]))
    assert sorted(names) == sorted(PROFILE_PATCHES)
    for name in names:
        for dep in load_patch(PATCHES_DIR, name).get("requires", []):
            assert names.index(dep) < names.index(name), (dep, name)
    # a full-profile stable build needs no dispatch patch; a per-torch one never gets the stable one
    assert resolve_patches(profile_spec("/b")) == ["torch-free-kernels", "stable-abi"]
    per_torch = profile_spec("/b", head_dims=[128]).replace(patches=["torch-free-kernels"])
    assert "dispatch-subset-stable" not in resolve_patches(per_torch)


def test_a_patch_set_missing_a_requirement_is_refused() -> None:
    with pytest.raises(BuildFailure, match="patch stable-abi requires torch-free-kernels") as info:
        check_requires(PATCHES_DIR, ["stable-abi"])
    assert info.value.code == EXIT_CONFIG
    with pytest.raises(BuildFailure, match="dispatch-subset-stable requires dispatch-subset"):
        order_by_requires(
            PATCHES_DIR, ["torch-free-kernels", "stable-abi", "setup-hooks", "dispatch-subset-stable"]
        )
    with pytest.raises(BuildFailure, match="requires setup-hooks"):
        prepare_tree(
            profile_spec("/nonexistent"), Path("/nonexistent.tar.gz"), ["dispatch-subset"], Reporter(None)
        )


@pytest.fixture(scope="module")
def profile_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sdist = fa_sdist()
    assert sdist is not None
    spec = profile_spec(str(tmp_path_factory.mktemp("stable-profile")), sdist, head_dims=[128])
    return prepare_tree(spec, sdist, resolve_patches(spec), Reporter(None))


@needs_sdist
def test_the_dispatch_patch_reaches_the_stable_binding(profile_tree: Path) -> None:
    api = (profile_tree / "csrc" / "flash_attn" / "flash_api_stable.cpp").read_text()
    assert '#include "static_switch.h"\n#include "attnforge_dispatch.h"' in api
    assert "ATTNFORGE_BWD_CALL(run_mha_bwd_<elem_type, kHeadDim, Is_causal>(params, stream));" in api
    assert (profile_tree / "attnforge_setup_hook.py").is_file()
    setup_py = (profile_tree / "setup.py").read_text()
    assert "attnforge_setup_hook.apply(ext_modules)" in setup_py and "flash_api_stable.cpp" in setup_py


def kernel_calls(nm_output: str) -> set[str]:
    """The kernel launchers a binding object calls: `fwd bf16 128`, `bwd fp16 128`, `fwd_split bf16 128`."""
    calls = set()
    for m in re.finditer(
        r"run_mha_(fwd|bwd|fwd_splitkv_dispatch)_?<cutlass::(half_t|bfloat16_t), (\d+),", nm_output
    ):
        kind = {"fwd": "fwd", "bwd": "bwd", "fwd_splitkv_dispatch": "fwd_split"}[m.group(1)]
        calls.add(f"{kind} {'fp16' if m.group(2) == 'half_t' else 'bf16'} {m.group(3)}")
    return calls


@needs_sdist
@pytest.mark.skipif(
    stable_torch_include() is None
    or shutil.which("g++") is None
    or not Path("/usr/local/cuda/include").is_dir(),
    reason="set ATTNFORGE_STABLE_TORCH_INCLUDE to a torch >= 2.10 include dir; needs g++ and CUDA headers",
)
@pytest.mark.parametrize(
    ("defines", "want"),
    [
        # the fa2-stable target's profile: head dim 128, fp16 + bf16, fwd + bwd, dropout kept
        (
            ["-DATTNFORGE_HEAD_DIMS=128", "-DATTNFORGE_FP16=1", "-DATTNFORGE_BF16=1"],
            {f"{k} {d} 128" for k in ("fwd", "bwd", "fwd_split") for d in ("fp16", "bf16")},
        ),
        # fwd128: bf16 forward only, every feature off
        (
            ["-DATTNFORGE_HEAD_DIMS=128", "-DATTNFORGE_FP16=0", "-DATTNFORGE_BF16=1"]
            + [
                f"-DFLASHATTENTION_DISABLE_{f}"
                for f in ("BACKWARD", "DROPOUT", "ALIBI", "SOFTCAP", "UNEVEN_K", "LOCAL")
            ],
            {"fwd bf16 128", "fwd_split bf16 128"},
        ),
    ],
    ids=["hd128-fwd-bwd", "fwd128"],
)
def test_a_profile_stable_binding_calls_only_the_kernels_it_compiles(
    profile_tree: Path, tmp_path: Path, defines: list[str], want: set[str]
) -> None:
    import sysconfig

    inc = stable_torch_include()
    src = profile_tree / "csrc" / "flash_attn"
    obj = tmp_path / "flash_api_stable.o"
    cmd = ["g++", "-std=c++17", "-fPIC", "-O1", "-DTORCH_TARGET_VERSION=0x020a000000000000"]
    cmd += ["-DPy_LIMITED_API=0x030a0000", *defines, f"-I{inc}", "-I/usr/local/cuda/include"]
    cmd += [f"-I{sysconfig.get_paths()['include']}", f"-I{src}", f"-I{src / 'src'}"]
    cmd += [f"-I{profile_tree / 'csrc' / 'cutlass' / 'include'}", "-c", str(src / "flash_api_stable.cpp")]
    proc = subprocess.run([*cmd, "-o", str(obj)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    nm = subprocess.run(
        ["nm", "--undefined-only", "-C", str(obj)], capture_output=True, text=True, check=True
    )
    assert torch_cxx_imports(nm.stdout) == []
    assert kernel_calls(nm.stdout) == want
