"""The kernel lane: setup.py's declarations read without running it, a real nvcc compile of a kernel unit
before any torch exists, and the setup hook taking the lane's object only where torch's flags are the lane's."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from attnforge.builder import kernel_lane as kl
from attnforge.builder.report import Reporter
from attnforge.builder.spec import BuildSpec, Source

SETUP = """
nvcc_flags = [
    "-O3",
    "-std=c++17",
    "--expt-relaxed-constexpr",
]
ext_modules.append(
    CUDAExtension(
        name="flash_attn_2_cuda",
        sources=[
            "csrc/flash_attn/flash_api.cpp",
            "csrc/flash_attn/src/flash_fwd_hdim128_bf16_sm80.cu",
            "csrc/flash_attn/src/flash_fwd_hdim64_fp16_sm80.cu",
        ],
    )
)
if IS_ROCM:
    ext_modules.append(CUDAExtension(name="flash_attn_2_cuda", sources=renamed_sources))
"""
KERNEL = "__global__ void attnforge_lane_probe(float* x) { x[threadIdx.x] += 1.0f; }\n"
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


def tree_at(root: Path) -> Path:
    tree = root / "flash_attn-2.8.3"
    (tree / "csrc/flash_attn/src").mkdir(parents=True)
    (tree / "csrc/cutlass/include").mkdir(parents=True)
    (tree / "setup.py").write_text(SETUP)
    (tree / "csrc/flash_attn/flash_api.cpp").write_text("int binding;\n")
    for name in ("flash_fwd_hdim128_bf16_sm80.cu", "flash_fwd_hdim64_fp16_sm80.cu"):
        (tree / "csrc/flash_attn/src" / name).write_text(KERNEL)
    return tree


def test_setup_py_declarations_are_read_without_running_it(tmp_path: Path) -> None:
    sources, flags = kl.declared(tree_at(tmp_path) / "setup.py")
    assert flags == ["-O3", "-std=c++17", "--expt-relaxed-constexpr"]
    assert sources[0].endswith("flash_api.cpp") and len(sources) == 3  # the ROCm branch's variable is skipped
    assert kl.gencode("80;90;86") == [
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
    ]


@pytest.fixture
def lane_run(tmp_path: Path) -> tuple[kl.KernelLane, Path, dict[str, object]]:
    """A real nvcc compile of the one kernel unit the head-dim filter keeps, with no torch anywhere."""
    if not Path(NVCC).is_file():
        pytest.fail("nvcc is part of this machine's set-up (scripts/setup-host.sh's CUDA toolkit)")
    tree = tree_at(tmp_path / "src")
    spec = BuildSpec(
        cell_id="lane-test",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source(path=str(tmp_path / "x.tar.gz"), sha256="0" * 64),
        python="3.11",
        torch="2.14.1",
        build_dir=str(tmp_path / "build"),
        venv_dir=str(tmp_path / "venv"),
        output_dir=str(tmp_path / "out"),
    )
    cuda_home = str(Path(NVCC).resolve().parent.parent)
    env = {
        "PATH": f"{cuda_home}/bin:/usr/bin:/bin",
        "FLASH_ATTN_CUDA_ARCHS": "90",
        "NVCC_THREADS": "1",
        "ATTNFORGE_HEAD_DIMS": "128",
        "ATTNFORGE_DEFINES": "-DFLASHATTENTION_DISABLE_BACKWARD",
    }
    finished: list[str] = []
    lane = kl.KernelLane(spec, tree, env, cuda_home, 2, Reporter(None), finished.append)
    assert lane.start() == ["csrc/flash_attn/src/flash_fwd_hdim128_bf16_sm80.cu"]
    assert lane.binding == ["csrc/flash_attn/flash_api.cpp"]
    info = lane.wait()
    return lane, tree, {**info, "finished": finished}


def test_the_lane_compiles_kernel_units_before_torch_exists(
    lane_run: tuple[kl.KernelLane, Path, dict[str, object]],
) -> None:
    lane, _tree, info = lane_run
    unit = info["units"]["flash_fwd_hdim128_bf16_sm80"]  # type: ignore[index]
    assert unit["ok"] is True, unit
    assert Path(unit["object"]).read_bytes()[:4] == b"\x7fELF"
    assert unit["peak_rss_gb"] > 0 and info["peak_single_gb"] > 0  # the lane's compilers are measured
    assert list(info["finished"]) == ["flash_fwd_hdim128_bf16_sm80"]  # type: ignore[call-overload]
    state = json.loads((lane.dir / kl.LANE_FILE).read_text())
    assert "-DFLASHATTENTION_DISABLE_BACKWARD" in state["flags"] and "'-O3'" not in state["flags"]


def test_the_hook_takes_lane_objects_only_under_torchs_own_flags(
    lane_run: tuple[kl.KernelLane, Path, dict[str, object]],
) -> None:
    lane, tree, _info = lane_run
    hook = kl.setup_hook()
    src = str(tree / "csrc/flash_attn/src/flash_fwd_hdim128_bf16_sm80.cu")
    torch_inc = "-I/venv/lib/python3.11/site-packages/torch/include"
    pre = [shlex.quote(f) for f in lane.pre]
    post = [shlex.quote(f) for f in lane.post]
    kwargs = {
        "cuda_cflags": pre[:-1] + [torch_inc, "-I/usr/include/python3.11", "-c"],
        "cuda_post_cflags": post
        + ["-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=flash_attn_2_cuda"],
    }
    taken, why = hook.lane_units(str(lane.dir), [src, str(tree / "csrc/flash_attn/flash_api.cpp")], kwargs)
    assert why == "" and list(taken) == [src] and taken[src].endswith("flash_fwd_hdim128_bf16_sm80.o")
    assert hook.wait_for_lane(str(lane.dir), taken) == []
    changed = dict(kwargs, cuda_post_cflags=[f.replace("-std=c++17", "-std=c++20") for f in post])
    taken, why = hook.lane_units(str(lane.dir), [src], changed)
    assert taken == {} and "-std=c++20" in why and "!-std=c++17" in why


def test_the_arch_policys_gencode_sits_where_the_setup_hook_puts_it() -> None:
    """The hook replaces setup.py's -gencode pairs by the policy's after its defines; the lane's flags agree."""
    hook = kl.setup_hook()
    nvcc_flags = ["-O3", "-std=c++17", "--use_fast_math"]
    defines = ["-DFLASHATTENTION_DISABLE_BACKWARD"]
    policy = ["arch=compute_90,code=sm_90", "arch=compute_90,code=compute_90"]
    env = {
        "FLASH_ATTN_CUDA_ARCHS": "90",
        "NVCC_THREADS": "2",
        "ATTNFORGE_DEFINES": " ".join(defines),
        "ATTNFORGE_GENCODE": ";".join(policy),
    }
    _pre, post = kl.unit_flags(Path("/t"), nvcc_flags, env, "/usr/local/cuda")
    setup_py_args = [
        *nvcc_flags,
        *kl.gencode("90"),
        "--threads",
        "2",
    ]  # append_nvcc_threads(nvcc_flags + cc_flag)
    assert post[len(kl.TORCH_NVCC_FLAGS) :] == hook.replace_gencode(setup_py_args + defines, policy)
    no_policy = {k: v for k, v in env.items() if k != "ATTNFORGE_GENCODE"}
    assert kl.unit_flags(Path("/t"), nvcc_flags, no_policy, "/usr/local/cuda")[1][
        len(kl.TORCH_NVCC_FLAGS) :
    ] == (setup_py_args + defines)
