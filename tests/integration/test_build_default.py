"""The README's main job for real: `attnforge build --target default` through Docker, then the wheel in a fresh venv.

A real flash-attn 2.8.3 compile (profile fwd128, sm_90, CUDA 13.0 from PyPI in a locally bootstrapped
Debian base, torch 2.14.1): about 5-10 minutes on 2 cores. CI runs it (noxfile.CI_SLOW_ALLOWLIST). attnforge
runs from its own wheel installed outside the checkout (conftest's `installed_attnforge`), as a team has it.
"""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from .conftest import DefaultBuild, InstalledAttnforge

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def attnforge(
    inst: InstalledAttnforge, matrix: Path, *args: str, timeout: int = 2400
) -> subprocess.CompletedProcess[str]:
    return inst.run("--matrix", str(matrix), *args, cwd=matrix.parent, timeout=timeout, CI="1")


@pytest.fixture(scope="module")
def built(default_build: DefaultBuild) -> tuple[Path, Path, str]:
    """The default target built once per session into a private output and cache folder (conftest)."""
    return default_build.matrix, default_build.wheels, default_build.output


def test_default_wheel_and_manifest(built: tuple[Path, Path, str]) -> None:
    _, wheels, output = built
    found = sorted(wheels.glob("flash_attn-2.8.3+*.whl"))
    assert len(found) == 1, output[-2000:]
    wheel = found[0]
    assert "cu130torch2.14cxx11abi" in wheel.name.lower() and ".fwd128-cp311-cp311-" in wheel.name
    manifest = json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text())
    assert manifest["cell_id"] == "flash-attn-2.8.3-cu130-torch2.14.1-cp311-abi1-sm90-fwd128-x86_64"
    assert manifest["inputs"]["patches"] == ["cxx20-binding", "torch-free-kernels"]
    assert manifest["inputs"]["head_dims"] == [128]
    assert manifest["build"]["backend"] == "docker"
    assert manifest["build"]["max_jobs"] >= 1 and manifest["build"]["units_total"] == 5
    # the 4 kernel units compiled in the kernel lane while torch installed, and torch's own flags for them
    # matched the lane's, so ninja compiled only the binding; a torch error in the binding reached Python
    lane = manifest["build"]["kernel_lane"]
    assert lane["mismatch"] == "" and len(lane["linked"]) == 4, lane
    assert manifest["build"]["units_compiled"] == 5
    windows = manifest["build"]["stage_windows"]
    kernel_starts = [
        u["start_s"] for u in manifest["build"]["unit_times"].values() if u.get("lane") == "kernel"
    ]
    assert len(kernel_starts) == 4 and min(kernel_starts) < windows["venv"][1], (kernel_starts, windows)
    assert manifest["build"]["exceptions_recheck"] == "raised"
    # the torch venv was made on the host while the builder images built, and the container reused it
    assert "torch venv cp311-torch2.14.1-cu130: ready in" in output, output[-3000:]
    assert manifest["build"]["venv_reused"] is True
    assert manifest["toolchain"]["nvcc"].startswith("13.0")
    assert manifest["finalize"]["torch_requirement"] == "torch==2.14.*"
    assert (wheels / "logs" / f"{manifest['cell_id']}.log").is_file()


def test_default_wheel_fits_the_glibc_floor_of_its_torch(
    built: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """Built on bookworm (glibc 2.36, libstdc++ 12), the wheel still installs wherever torch 2.14.1's own wheel
    (manylinux_2_28) does: no compiled file needs GLIBC_2.29 or newer, libstdc++'s `__libc_single_threaded`
    resolves inside the binding, and finalize checked it against the floor read from torch's wheel tag."""
    _, wheels, _ = built
    wheel = next(wheels.glob("flash_attn-2.8.3+*.whl"))
    manifest = json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text())
    assert manifest["build"]["glibc_floor"]["torch_wheel_tags"] == ["cp311-cp311-manylinux_2_28_x86_64"]
    assert manifest["finalize"]["glibc_floor"]["floor"] == "manylinux_2_28_x86_64"
    assert "glibc-floor" in manifest["finalize"]["checks"]
    platforms = wheel.name.removesuffix(".whl").rsplit("-", 1)[1].split(".")
    for plat in platforms:
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", plat)
        assert m and (int(m[1]), int(m[2])) <= (2, 28), platforms
    with zipfile.ZipFile(wheel) as zf:
        (ext,) = [n for n in zf.namelist() if n.startswith("flash_attn_2_cuda.") and n.endswith(".so")]
        zf.extract(ext, tmp_path)
    dynamic = subprocess.run(
        ["objdump", "-T", str(tmp_path / ext)], capture_output=True, text=True, check=True
    ).stdout
    glibc = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"\(GLIBC_([\d.]+)\)", dynamic)}
    assert glibc and max(glibc) < (2, 29), sorted(glibc)
    assert "__libc_single_threaded" not in dynamic


def test_second_run_skips_the_unchanged_cell(
    built: tuple[Path, Path, str], installed_attnforge: InstalledAttnforge
) -> None:
    matrix, wheels, _ = built
    before = {p.name: p.stat().st_mtime_ns for p in wheels.glob("*.whl")}
    proc = attnforge(installed_attnforge, matrix, "build", "--target", "default", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "skipped" in proc.stdout + proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in wheels.glob("*.whl")} == before


def test_wheel_imports_in_a_fresh_venv(built: tuple[Path, Path, str], tmp_path: Path) -> None:
    """Real pip install into a fresh venv next to the torch it was built for (the build's own torch 2.14.1+cu130
    venv, seen through a .pth as a site's shared torch would be: pip resolves `torch==2.14.*` against it and
    installs the rest); the CUDA extension loads (no GPU needed)."""
    matrix, wheels, _ = built
    wheel = next(wheels.glob("flash_attn-2.8.3+*.whl"))
    cache = Path(yaml.safe_load(matrix.read_text())["build"]["cache_dir"])
    (torch_site,) = (cache / "venvs" / "cp311-torch2.14.1-cu130" / "lib").glob("python3*/site-packages")
    venv = tmp_path / "venv"
    subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "_build_torch.pth").write_text(f"{torch_site}\n")
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import torch, flash_attn, flash_attn_2_cuda; print(flash_attn.__version__, torch.__version__)",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    version, torch_version = probe.stdout.split()
    assert version.startswith("2.8.3") and torch_version == "2.14.1+cu130"


def test_env_build_against_that_venvs_torch(
    built: tuple[Path, Path, str], tmp_path: Path, installed_attnforge: InstalledAttnforge
) -> None:
    """`attnforge build --python` (the env backend: a GPU runner's route) against the torch the docker build
    installed, on this host's CUDA 13.0 toolkit: the same cell name, the kernel objects of the docker build
    reused, only the binding compiled, `build.backend: "env"` with the exact torch build."""
    matrix, _, _ = built
    data = yaml.safe_load(matrix.read_text())
    data["build"]["output_dir"] = str(tmp_path / "env-wheels")
    env_matrix = tmp_path / "matrix.yaml"
    env_matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    python = Path(data["build"]["cache_dir"]) / "venvs" / "cp311-torch2.14.1-cu130" / "bin" / "python"
    proc = attnforge(
        installed_attnforge,
        env_matrix,
        "build",
        "--python",
        str(python),
        "--profile",
        "fwd128",
        "--arch",
        "sm_90",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "env-wheels").glob("*.whl")
    assert wheel.name == next(built[1].glob("*.whl")).name
    manifest = json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text())
    assert manifest["build"]["backend"] == "env" and manifest["build"]["torch_build"] == "2.14.1+cu130"
    assert manifest["build"]["units_compiled"] == 1 and manifest["build"]["units_total"] == 5
    assert manifest["inputs"]["torch_build"] == "2.14.1+cu130"


STABLE_PROBE = """
import json, torch, flash_attn, flash_attn_2_cuda
q = torch.empty(2, 128, 8, 128, device="meta", dtype=torch.bfloat16)
out = flash_attn.flash_attn_func(q, q, q, causal=True)
print(json.dumps({"torch": torch.__version__, "flash_attn": flash_attn.__version__, "out": list(out.shape),
                  "ops": sorted(n for n in ("fwd", "varlen_fwd", "fwd_kvcache") if hasattr(torch.ops.flash_attn_stable, n)),
                  "extension": flash_attn_2_cuda.__file__.rsplit("/", 1)[-1]}))
"""


def test_stable_abi_wheel_from_the_same_kernel_objects(
    built: tuple[Path, Path, str], tmp_path: Path, installed_attnforge: InstalledAttnforge
) -> None:
    """The default cell's stable-ABI twin (`abi: stable`, same toolkit, arch and profile) through Docker: its
    kernel units are the default build's torch-free objects, so only the stable binding compiles; the build's
    ABI check passes (no torch C++ symbol imported); the cp310-abi3 wheel installs next to torch 2.14.1, its ops
    register under torch.ops.flash_attn_stable and flash_attn_func traces through their fakes. (The same kind of
    file under torch 2.10-2.14 and Pythons 3.10-3.13: reports/cpu/stable_abi_imports.json; on a GPU:
    reports/gpu/stable_abi_parity.json.)"""
    matrix, wheels, _ = built
    data = yaml.safe_load(matrix.read_text())
    data["targets"]["default-stable"] = {
        "description": "the default cell on torch's stable ABI",
        "abi": "stable",
        "matrix": data["targets"]["default"]["matrix"],
    }
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = attnforge(installed_attnforge, matrix, "build", "--target", "default-stable")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = wheels.glob("flash_attn-2.8.3+*abi3*.whl")
    assert wheel.name.startswith("flash_attn-2.8.3+cu130sm90torch2.10abi3.fwd128-cp310-abi3-manylinux_")
    manifest = json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text())
    assert "stable-abi" in manifest["inputs"]["patches"]
    assert manifest["build"]["units_compiled"] == 1 and manifest["build"]["units_total"] == 5
    assert manifest["finalize"]["torch_requirement"].startswith("torch>=2.10")
    log = (wheels / "logs" / f"{manifest['cell_id']}.log").read_text()
    assert "stable-ABI check passed" in log
    cache = Path(data["build"]["cache_dir"])
    (torch_site,) = (cache / "venvs" / "cp311-torch2.14.1-cu130" / "lib").glob("python3*/site-packages")
    venv = tmp_path / "venv"
    subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "_build_torch.pth").write_text(f"{torch_site}\n")
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel), "einops"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", STABLE_PROBE], capture_output=True, text=True, timeout=300
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    got = json.loads(probe.stdout.strip().splitlines()[-1])
    assert got["torch"] == "2.14.1+cu130" and got["flash_attn"].startswith("2.8.3")
    assert got["out"] == [2, 128, 8, 128] and got["ops"] == ["fwd", "fwd_kvcache", "varlen_fwd"]
    assert got["extension"] == "flash_attn_2_cuda.abi3.so"
