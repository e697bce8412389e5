"""The error a profile wheel raises for a head dim, dtype or backward call it has no kernel for: what the wheel
holds (profile, head dims, dtypes, backward), what would serve the call, and no path of the build machine.

`attnforge_dispatch.h` is compiled here with g++ (standard C++ only, about a second) into a small program that
calls flash_api.cpp's switches as flash-attn does, beside the attnforge_profile.h the setup hook writes; the
program prints what the exception says, as Python's RuntimeError would carry it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.builder.kernel_lane import PATCHES_DIR, setup_hook
from attnforge.builder.knobs import flash_attn_env
from attnforge.builder.settings import BuildSettings
from attnforge.builder.spec import Source
from attnforge.engine.jobs import make_spec
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.schema import ProfileSpec

Call = Callable[..., str]  # runs the program with its arguments, returns what it printed
Compile = Callable[..., Call]  # (tree name, profile tag or None, *g++ defines)

CALLER = r"""
#include <cstdio>
#include <cstdlib>
#include <string>
namespace cutlass { struct half_t {}; struct bfloat16_t {}; }
#include "attnforge_dispatch.h"
// as flash_api.cpp: FP16_SWITCH(!is_bf16, [&] { HEADDIM_SWITCH(d, [&] { run_mha_fwd_<elem_type, kHeadDim>(...); }); });
static int fwd(int d, bool fp16) {
  return FP16_SWITCH(fp16, [&] { return HEADDIM_SWITCH(d, [&] { return kHeadDim + 0 * static_cast<int>(sizeof(elem_type)); }); });
}
static void bwd() { ATTNFORGE_BWD_CALL(std::puts("bwd kernel")); }
int main(int, char** argv) {
  try {
    if (std::string(argv[1]) == "bwd") { bwd(); return 0; }
    std::printf("kernel %d\n", fwd(std::atoi(argv[1]), std::string(argv[2]) == "fp16"));
  } catch (const std::exception& e) {
    std::printf("RuntimeError: %s\n", e.what());
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def compile_tree(tmp_path_factory: pytest.TempPathFactory) -> Compile:
    """compile(profile, *defines) -> a function running the program: a flash-attn tree with the dispatch
    header (as the dispatch-subset patch copies it) and the profile header the setup hook writes."""
    root = tmp_path_factory.mktemp("dispatch")
    gxx = shutil.which("g++")
    assert gxx, "g++ is needed (the builder's host compiler)"

    def compile_(name: str, profile: str | None, *defines: str) -> Call:
        tree = root / name
        folder = tree / "csrc" / "flash_attn"
        folder.mkdir(parents=True)
        shutil.copy2(PATCHES_DIR / "attnforge_dispatch.h", folder / "attnforge_dispatch.h")
        if profile is not None:
            mp = pytest.MonkeyPatch()
            mp.setenv("ATTNFORGE_PROFILE", profile)
            assert setup_hook().write_profile_header(str(tree)) == str(folder / "attnforge_profile.h")
            mp.undo()
        (folder / "caller.cpp").write_text(CALLER)
        exe = folder / "caller"
        proc = subprocess.run(
            [gxx, "-std=c++17", "-Wall", "-Werror", *defines, "caller.cpp", "-o", str(exe)],
            cwd=folder,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr

        def call(*args: str) -> str:
            return subprocess.run([exe, *args], capture_output=True, text=True, check=True).stdout.strip()

        return call

    return compile_


HD128 = "this flash-attn wheel (attnforge profile hd128: head dims [128], dtypes [fp16, bf16], forward and backward)"
SERVES = " serves it (the full profile has all); `attnforge which {}` names the one for your environment"


def test_a_missing_head_dim_names_the_profile_and_what_serves_it_and_no_build_path(
    compile_tree: Compile,
) -> None:
    call = compile_tree("hd128", "hd128", "-DATTNFORGE_HEAD_DIMS=128")
    out = call("64", "bf16")
    assert (
        out
        == f"RuntimeError: {HD128} has no kernel for head dim 64: a wheel of a profile with head dim 64{SERVES.format('--head-dim 64')}"
    )
    # it used to read "unsupported_head_dim, /…/.attnforge-cache/cells/<key>/…/attnforge_dispatch.h:69, …"
    assert "/" not in out and ".h" not in out and "unsupported_head_dim" not in out
    assert call("100", "fp16") == "kernel 128"  # upstream's buckets: d <= 128 runs the 128 kernel
    assert call("160", "fp16") == (
        f"RuntimeError: {HD128} has no kernel for head dim 160 (run by the head dim 192 kernel): a wheel of a "
        f"profile with head dim 192{SERVES.format('--head-dim 160')}"
    )
    assert call("300", "fp16") == "RuntimeError: flash-attn 2 has no kernel for head dim 300 (at most 256)"
    assert call("bwd") == "bwd kernel"


def test_a_missing_dtype_or_backward_names_them(compile_tree: Compile) -> None:
    call = compile_tree(
        "fwd128", "fwd128", "-DATTNFORGE_HEAD_DIMS=128", "-DATTNFORGE_FP16=0", "-DATTNFORGE_BF16=1",
        "-DFLASHATTENTION_DISABLE_BACKWARD",
    )  # fmt: skip
    wheel = "this flash-attn wheel (attnforge profile fwd128: head dims [128], dtypes [bf16], forward only)"
    assert call("128", "bf16") == "kernel 128"
    assert (
        call("128", "fp16")
        == f"RuntimeError: {wheel} has no fp16 kernels: a wheel of a profile with fp16 kernels{SERVES.format('--dtype fp16')}"
    )
    assert (
        call("bwd")
        == f"RuntimeError: {wheel} has no backward kernels: a wheel of a profile with backward kernels{SERVES.format('--backward')}"
    )


def test_without_the_profile_header_or_with_an_odd_tag(compile_tree: Compile) -> None:
    call = compile_tree("bare", None, "-DATTNFORGE_HEAD_DIMS=64,128")
    assert call("256", "fp16").startswith(
        "RuntimeError: this flash-attn wheel (attnforge build: head dims [64, 128], dtypes [fp16, bf16], "
        "forward and backward) has no kernel for head dim 256: "
    )
    # only a plain tag reaches the C++ text
    call = compile_tree("odd", 'x" ; int y = "', "-DATTNFORGE_HEAD_DIMS=128")
    assert "(attnforge build: head dims [128]" in call("64", "fp16")


def test_the_setup_hook_writes_the_header_only_where_the_patch_put_the_dispatch_header(
    tmp_path: Path,
) -> None:
    hook = setup_hook()
    assert hook.write_profile_header(str(tmp_path)) is None  # no dispatch-subset: nothing written
    assert hook.profile_header("infer") == (
        "// Written by attnforge's setup hook: the profile this wheel was built with (attnforge_dispatch.h).\n"
        '#pragma once\n#define ATTNFORGE_PROFILE_NAME "infer"\n'
    )


def test_the_builder_spec_carries_the_profile_tag_to_the_hook(tmp_path: Path) -> None:
    def cell(profile: str, spec: ProfileSpec) -> Cell:
        return Cell(
            kernel="flash-attn", kernel_version="2.8.3", toolkit=Toolkit.parse("cuda13.0"), torch="2.14.1",
            python="3.12", cxx11_abi=True, arches=("sm_90",), profile=profile, profile_spec=spec,
        )  # fmt: skip

    def env(c: Cell) -> dict[str, str]:
        spec = make_spec(
            c,
            source=Source("/s.tar.gz", "0" * 64),
            workdir=tmp_path / "cells" / "k" / "w",
            objects_dir=tmp_path / "o",
            ccache_dir=tmp_path / "c",
            settings=BuildSettings(2, 1, 4.5, "test"),
        )
        return flash_attn_env(spec, ["90"], None)

    lean = ProfileSpec(tag="infer", disable=["backward"])
    assert (
        env(cell("inference", lean))["ATTNFORGE_PROFILE"] == "infer"
    )  # the tag, as `which --profile` takes it
    assert env(cell("hd128", ProfileSpec(head_dims=[128])))["ATTNFORGE_PROFILE"] == "hd128"
    assert env(cell("full", ProfileSpec()))["ATTNFORGE_PROFILE"] == "full"
