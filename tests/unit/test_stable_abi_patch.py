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

import pytest

from attnforge.builder.importcheck import torch_cxx_imports
from attnforge.builder.patches import PATCHES_DIR, load_patch, patch_scope
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
