"""CUDA 12.4 through the CUDA_FROM=base branch, for real: `attnforge build --target cuda12`.

Two cells (flash-attn 2.8.3, torch 2.6.0 = PyPI's cu124 build, pre-cxx11 ABI, sm_80 + sm_90, fwd128): cp311
compiles, cp312 links the cp311 cell's kernel objects. The base is attnforge's local STAND-IN for
nvidia/cuda:12.4.1-devel-ubuntu22.04 (attnforge-standin/cuda:12.4.1-devel-debian12: NVIDIA's CUDA 12.4 from
Debian's non-free packages on bookworm; NOT an NVIDIA image), made on demand. About 25-30 min on 2 cores from
a fresh cache (two arches per unit), about 8 GB of free disk; whether CI runs it: noxfile.CI_SLOW_ALLOWLIST.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnforge.engine.backends.cuda_standin import STANDINS

from .cudaelf import find_cuobjdump, wheel_cuda_code

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CELL = "flash-attn-2.8.3-cu124-torch2.6.0-{cp}-abi0-sm80-sm90-fwd128-x86_64"
WHEEL_PREFIX = "flash_attn-2.8.3+cu124torch2.6cxx11abiFALSE.fwd128-{cp}-{cp}-manylinux_2_"
PYENV = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"


def attnforge(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CI": "1"}
    return subprocess.run(
        [sys.executable, "-m", "attnforge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, object]]]:
    """Both cells of the `cuda12` target, built once into a private (fresh) cache and output folder."""
    tmp = tmp_path_factory.mktemp("build-cu124")
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"] |= {"output_dir": str(tmp / "wheels"), "cache_dir": str(tmp / "cache")}
    matrix = tmp / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = attnforge("--matrix", str(matrix), "build", "--target", "cuda12", timeout=5400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifests = {}
    for m in (tmp / "wheels").glob("*.whl.manifest.json"):
        data = json.loads(m.read_text())
        manifests[str(data["cell_id"])] = data
    return tmp / "wheels", manifests


def test_wheels_are_named_for_cu124_torch26_pre_cxx11(
    built: tuple[Path, dict[str, dict[str, object]]],
) -> None:
    wheels, manifests = built
    assert sorted(manifests) == [CELL.format(cp="cp311"), CELL.format(cp="cp312")]
    for cp in ("cp311", "cp312"):
        m = manifests[CELL.format(cp=cp)]
        name = str(m["wheel"])
        assert name.startswith(WHEEL_PREFIX.format(cp=cp)) and name.endswith("_x86_64.whl"), name
        assert (wheels / name).is_file()
        glibc_minor = int(name.split("manylinux_2_")[1].split("_")[0])
        assert glibc_minor <= 36, f"{name}: needs a newer glibc than the bookworm base (2.36)"
        toolchain, build = m["toolchain"], m["build"]
        assert isinstance(toolchain, dict) and str(toolchain["nvcc"]).startswith("12.4.")
        assert isinstance(build, dict) and build["base"] == STANDINS["12.4"].tag
        assert m["finalize"]["torch_requirement"] == "torch==2.6.*"  # type: ignore[index]


def test_second_python_links_the_saved_kernel_objects(
    built: tuple[Path, dict[str, dict[str, object]]],
) -> None:
    wheels, manifests = built
    build = manifests[CELL.format(cp="cp312")]["build"]
    assert isinstance(build, dict)
    assert build["units_total"] == 5 and build["units_compiled"] == 1  # flash_api.cpp only
    log = (wheels / "logs" / f"{CELL.format(cp='cp312')}.log").read_text()
    sources = [
        json.loads(ln.strip()[len("@@attnforge ") :])
        for ln in log.splitlines()
        if ln.strip().startswith('@@attnforge {"event": "sources"')
    ]
    assert sources and len(sources[-1]["prebuilt"]) == 4, sources[-1:]


def test_cubins_are_sm80_and_sm90_from_nvcc_12_4(
    built: tuple[Path, dict[str, dict[str, object]]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """NVIDIA's cuobjdump (PyPI's CUDA 13 build when none is installed) reads each cubin's ELF header, where
    the ptxas that assembled it writes its CUDA release (`toolkit=124`; CUDA 12.4 writes no .note.nv.tkinfo);
    the host code's .comment names bookworm's g++ 12."""
    wheels, manifests = built
    tools = Path(os.environ.get("ATTNFORGE_TEST_CACHE", tmp_path_factory.mktemp("tools"))) / "tools"
    cuobjdump = find_cuobjdump(tools)
    for cp in ("cp311", "cp312"):
        code = [
            c
            for c in wheel_cuda_code(wheels / str(manifests[CELL.format(cp=cp)]["wheel"]), cuobjdump)
            if c.library.startswith("flash_attn_2_cuda")
        ]
        assert len(code) == 1
        ext = code[0]
        assert ext.arches == ["sm_80", "sm_90"] and ext.cubins == 8, ext  # 4 kernel units x 2 arches
        assert ext.toolkits == ["12.4"], ext
        assert ext.ptx == [], ext
        assert ext.host_compilers == ["GCC: (Debian 12.2.0-14+deb12u1) 12.2.0"], ext


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_wheel_imports_beside_torch_2_6_and_doctor_passes(
    built: tuple[Path, dict[str, dict[str, object]]], python: str, tmp_path: Path
) -> None:
    """A fresh venv, `pip install torch==2.6.0 <wheel>` (PyPI: cu124, pre-cxx11), import, `attnforge doctor`."""
    wheels, manifests = built
    cp = "cp" + python.replace(".", "")
    interpreter = sorted(PYENV.glob(f"{python}.*/bin/python{python}"))
    assert interpreter, f"no pyenv Python {python}"
    venv = tmp_path / "venv"
    subprocess.run([str(interpreter[-1]), "-m", "venv", str(venv)], check=True)
    wheel = wheels / str(manifests[CELL.format(cp=cp)]["wheel"])
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "torch==2.6.0", str(wheel)],
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    code = "import torch, flash_attn, flash_attn_2_cuda; print(torch.__version__, flash_attn.__version__)"
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=600
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.split() == ["2.6.0+cu124", "2.8.3"]
    doctor = attnforge("doctor", "--python", str(venv / "bin" / "python"), timeout=600)
    assert doctor.returncode == 0, doctor.stdout[-2000:] + doctor.stderr[-2000:]


def test_trixie_builder_image_gets_gxx_13_and_the_builder_picks_it(tmp_path: Path) -> None:
    """No compile: on a trixie base (g++ 14, newer than CUDA 12.4's gcc <= 13) the builder image gets g++-13
    (HOST_GCC) and builder/compiler.gcc_for_toolkit chooses it. The trixie stand-in is a local STAND-IN too."""
    from attnforge.engine.backends.cuda_standin import ensure_cuda_standin
    from attnforge.engine.backends.docker import BUILDER_DIR, DockerBackend
    from attnforge.engine.progress import PlainProgressView
    from attnforge.matrix.cell import Toolkit
    from attnforge.matrix.project import Project

    tag = "attnforge-standin/cuda:12.4.1-devel-debian13"
    ensure_cuda_standin("12.4", base="local/debian:trixie", tag=tag, log_path=tmp_path / "standin.log")
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"] |= {"output_dir": str(tmp_path / "wheels")}
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    backend = DockerBackend(Project(tmp_path / "matrix.yaml"), base_images={"cuda12.4": tag})
    with PlainProgressView() as view:
        image = backend.ensure_builder(Toolkit.parse("cuda12.4"), view)
    code = (
        "import os, sys; sys.path.insert(0, '/opt/b')\n"
        "from builder.compiler import gcc_for_toolkit\nfrom builder.report import Reporter\n"
        "print(gcc_for_toolkit(13, dict(os.environ), Reporter(None))['cxx'])\n"
    )
    mount = f"{BUILDER_DIR}:/opt/b/builder:ro"
    proc = subprocess.run(
        ["/usr/bin/docker", "run", "--rm", "-v", mount, image, "python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "c++ is gcc 14, newer than the toolkit accepts (gcc <= 13): using g++-13" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "/usr/bin/g++-13"
