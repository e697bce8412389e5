"""The torch-free-kernels patch on the real flash-attn 2.8.3 sdist: its kernel units preprocess with no torch
on the include path, and the binding's Philox conversion compiles against a real torch and fails against a
torch whose Philox state changed (nvcc and g++ from this machine; torch headers from the test venv)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from attnforge.builder.patches import PATCHES_DIR, resolve_patches
from attnforge.builder.report import Reporter
from attnforge.builder.source import prepare_tree
from attnforge.builder.spec import BuildSpec, Source

from .test_builder import FA_SHA256, fa_sdist

CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
NVCC = str(CUDA_HOME / "bin" / "nvcc")
CUDA_INCLUDE = CUDA_HOME / "include"
needs_sdist = pytest.mark.skipif(
    fa_sdist() is None, reason="flash_attn-2.8.3.tar.gz not found (ATTNFORGE_FA_SDIST)"
)


def torch_include() -> Path:
    import torch

    return Path(torch.__file__).parent / "include"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sdist = fa_sdist()
    assert sdist is not None
    work = tmp_path_factory.mktemp("tf")
    spec = BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source(str(sdist), FA_SHA256),
        python="3.11",
        torch="2.14.1",
        build_dir=str(work),
        venv_dir="/v",
        output_dir="/o",
        patches=["cxx20-binding", "torch-free-kernels"],
        head_dims=[128],
    )
    names = resolve_patches(spec)
    assert names[:2] == ["torch-free-kernels", "cxx20-binding"]  # cxx20-binding requires torch-free-kernels
    return prepare_tree(spec, sdist, names, Reporter(None))


@needs_sdist
def test_kernel_units_include_no_torch(tree: Path) -> None:
    src = tree / "csrc" / "flash_attn" / "src"
    for header in (
        "flash.h",
        "flash_fwd_kernel.h",
        "flash_fwd_launch_template.h",
        "flash_bwd_launch_template.h",
    ):
        text = (src / header).read_text()
        assert "c10/" not in text and "ATen/" not in text and "at::" not in text, header
    # the C++20 patch for torch >= 2.14 reaches only the host compile of the binding
    setup_py = (tree / "setup.py").read_text()
    assert 'compiler_c17_flag=["-O3", "-std=c++20"]' in setup_py and '"-std=c++17",' in setup_py
    for unit in ("flash_fwd_split_hdim128_bf16_sm80.cu", "flash_bwd_hdim128_fp16_causal_sm80.cu"):
        out = subprocess.run(
            [
                NVCC,
                "-E",
                "-std=c++17",
                "--expt-relaxed-constexpr",
                "--expt-extended-lambda",
                "-gencode",
                "arch=compute_90,code=sm_90",
                f"-I{tree / 'csrc/flash_attn'}",
                f"-I{src}",
                f"-I{tree / 'csrc/cutlass/include'}",
                str(src / unit),
                "-o",
                "-",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        files = {ln.split('"')[1] for ln in out.stdout.splitlines() if ln.startswith("# ") and '"' in ln}
        assert not [f for f in files if any(d in f for d in ("/torch/", "/c10/", "/ATen/"))], unit
        assert any(f.endswith("attnforge_torch_free.h") for f in files)


def _compile_bridge(tree: Path, include: list[Path], tmp: Path) -> subprocess.CompletedProcess[str]:
    probe = tmp / "probe.cpp"
    probe.write_text('#include "attnforge_torch_bridge.h"\nint main() { return 0; }\n')
    flags = [f"-I{p}" for p in [tree / "csrc/flash_attn/src", *include, CUDA_INCLUDE]]
    return subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", *flags, str(probe)],
        capture_output=True,
        text=True,
        check=False,
    )


@needs_sdist
def test_binding_checks_the_philox_layout_of_its_torch(tree: Path, tmp_path: Path) -> None:
    ok = _compile_bridge(tree, [torch_include()], tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    # a torch whose PhiloxCudaState grew a member (same size after padding) fails the build with the reason;
    # tests/integration/test_torch_philox_headers.py checks the layouts of the real torch releases
    fake = tmp_path / "fake"
    (fake / "ATen/cuda/detail").mkdir(parents=True)
    (fake / "c10/util").mkdir(parents=True)
    (fake / "ATen/cuda/PhiloxCudaState.h").write_text(
        "#pragma once\n#include <cstdint>\nnamespace at { struct PhiloxCudaState {\n"
        "  union Payload { uint64_t val; int64_t* ptr; };\n  Payload seed_{}; Payload offset_{};\n"
        "  uint32_t offset_intragraph_ = 0; uint32_t generation_ = 0; bool captured_ = false; }; }\n"
    )
    (fake / "ATen/cuda/CUDAGeneratorImpl.h").write_text(
        "#pragma once\n#include <ATen/cuda/PhiloxCudaState.h>\n"
    )
    (fake / "ATen/cuda/detail/UnpackRaw.cuh").write_text(
        "namespace at::cuda::philox { inline std::tuple<uint64_t, uint64_t> unpack(at::PhiloxCudaState s) "
        "{ return {s.seed_.val, s.offset_.val}; } }\n"
    )
    (fake / "c10/util/Exception.h").write_text("#pragma once\n#define TORCH_CHECK(cond, ...) (void)(cond)\n")
    bad = _compile_bridge(tree, [fake], tmp_path)
    assert bad.returncode != 0
    assert "static assertion failed: captured_ moved" in bad.stderr


def test_patch_files_are_what_the_key_reads() -> None:
    from attnforge.builder.patches import patch_scope, torch_free

    assert torch_free(["torch-free-kernels"]) and not torch_free(["cxx20", "cxx20-binding"])
    assert patch_scope("cxx20-binding") == "binding" and patch_scope("cxx20") == "kernels"
    for header in ("attnforge_philox.h", "attnforge_torch_free.h", "attnforge_philox_torch.h"):
        assert (PATCHES_DIR / header).is_file()


MINI_UPSTREAM = Path(__file__).parent / "data" / "mini_flash_attn" / "csrc" / "flash_attn"
FIXTURE_NOTE = "// attnforge test fixture:"  # the first line of the fixture's own comment (3 lines)


def _excerpt_lines(path: Path) -> list[str]:
    """The lines of an excerpt that claim to be upstream's: all but blanks, "// [...]" and the note."""
    lines = path.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(FIXTURE_NOTE))
    del lines[at : at + 3]
    return [ln for ln in lines if ln.strip() and not ln.startswith("// [...]")]


@needs_sdist
def test_mini_fixture_excerpts_are_upstreams_lines() -> None:
    """The mini fixture's csrc/flash_attn/ files (what the images tests patch) hold upstream's lines, in
    upstream's order: the fixture cannot drift into a shape the real source does not have."""
    import tarfile

    sdist = fa_sdist()
    assert sdist is not None
    excerpts = sorted(p for p in MINI_UPSTREAM.rglob("*") if p.is_file())
    assert len(excerpts) == 6
    with tarfile.open(sdist) as tar:
        for path in excerpts:
            rel = path.relative_to(MINI_UPSTREAM.parents[1]).as_posix()
            member = tar.extractfile(f"flash_attn-2.8.3/{rel}")
            assert member is not None, rel
            upstream = member.read().decode().splitlines()
            at = 0
            for line in _excerpt_lines(path):
                assert line in upstream[at:], f"{rel}: {line!r} is not upstream's (in this order)"
                at = upstream.index(line, at) + 1
