"""Kernel objects shared within a kernel set (`builder.objects`), and finding a whole CUDA toolkit's nvcc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.builder.objects import save_kernel_objects, usable_prebuilt
from attnforge.builder.report import Reporter
from attnforge.builder.spec import BuildSpec, Source
from attnforge.engine.backends.local import find_nvcc


def spec_for(tmp: Path) -> BuildSpec:
    return BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source("/s", "0" * 64),
        python="3.11",
        torch="2.14.1",
        build_dir=str(tmp / "b"),
        venv_dir="/v",
        output_dir="/o",
        kernel_objects_dir=str(tmp / "objects"),
    )


def tree_with_object(tmp: Path) -> Path:
    obj = tmp / "tree" / "build" / "temp.linux-x86_64-cpython-311" / "csrc" / "k.o"
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"\x7fELF kernel")
    return tmp / "tree"


def test_objects_are_saved_once_and_replaced_when_built_for_something_else(tmp_path: Path) -> None:
    spec, tree, rep = spec_for(tmp_path), tree_with_object(tmp_path), Reporter(None)
    old = {"nvcc": "12.8.93", "torch": "2.14.1+cu130"}
    assert save_kernel_objects(spec, tree, ["csrc/k.cu"], old, "cpython-311", rep)
    manifest = tmp_path / "objects" / "manifest.json"
    assert json.loads(manifest.read_text())["objects"] == {"csrc/k.cu": "k.o"}
    assert usable_prebuilt(spec, old, rep) == tmp_path / "objects"
    assert not save_kernel_objects(spec, tree, ["csrc/k.cu"], old, "cpython-311", rep)  # same identity: kept
    new = {"nvcc": "13.0.88", "torch": "2.14.1+cu130"}
    assert usable_prebuilt(spec, new, rep) is None
    assert save_kernel_objects(spec, tree, ["csrc/k.cu"], new, "cpython-311", rep)  # stale: replaced
    assert json.loads(manifest.read_text())["identity"] == new
    assert usable_prebuilt(spec, new, rep) == tmp_path / "objects"
    assert not list(tmp_path.glob("objects.stale*"))


def test_a_wrapper_script_on_path_is_not_a_toolkit_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (toolkit / "bin" / "nvcc").chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    assert find_nvcc() == toolkit / "bin" / "nvcc"
    wrapper = tmp_path / "wrapper"
    (wrapper / "bin").mkdir(parents=True)
    (wrapper / "bin" / "nvcc").write_text(f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    (wrapper / "bin" / "nvcc").chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(wrapper))  # no include/ beside it: not a toolkit
    monkeypatch.setenv("PATH", f"{wrapper / 'bin'}:/usr/bin:/bin")
    assert find_nvcc() != wrapper / "bin" / "nvcc"
