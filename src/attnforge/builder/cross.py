"""Cross-compiling a cell for another host architecture (an aarch64 wheel on an x86-64 builder).

The device code is the same for both hosts (nvcc's device passes do not depend on the host); what differs is
the host code: the binding, and the host stubs nvcc writes for every kernel unit. So the host compiler is the
target's GNU cross compiler (``aarch64-linux-gnu-g++``, also nvcc's ``-ccbin``), the torch headers and
libraries it compiles and links against come from torch's own aarch64 wheel, and the CUDA runtime it links
from NVIDIA's aarch64 ``nvidia-cuda-runtime`` wheel; both are unpacked beside the cell's venv
(``<venv_dir>-<platform>/site``). The x86-64 venv's torch only runs setup.py (its ``cpp_extension``). The
setup hook swaps the paths (``ATTNFORGE_CROSS_*``), ``_PYTHON_HOST_PLATFORM`` tags the wheel
``linux_<platform>``. Nothing of the target can run here: the compiler probe and the import check are left to
a machine (or an emulator) of that architecture.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import zipfile
from pathlib import Path

from .exits import EXIT_ENV, BuildFailure
from .files import file_lock
from .procs import stream
from .report import Reporter
from .spec import BuildSpec
from .toolkits import cuda_of_variant
from .torchenv import pip_env

TRIPLES = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"}
# pip's --platform values for the target's wheels: torch's are manylinux_2_28, NVIDIA's manylinux2014 (pip does not
# widen a given --platform to older manylinux tags: each is named)
PIP_PLATFORMS = {
    arch: (f"manylinux_2_28_{arch}", f"manylinux_2_17_{arch}", f"manylinux2014_{arch}")
    for arch in ("aarch64", "x86_64")
}
MARKER = ".attnforge-target.json"


def host_machine() -> str:
    """This machine's architecture as a wheel names it (x86_64, aarch64)."""
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def is_cross(spec: BuildSpec) -> bool:
    """Whether the spec's wheel is for another architecture than this builder's (and compiles anything)."""
    return not spec.pure_python and spec.platform != host_machine()


def cross_compilers(target: str, env: dict[str, str]) -> tuple[str, str]:
    """(gcc, g++) of the target's GNU cross toolchain on PATH; BuildFailure(EXIT_ENV) naming the package."""
    triple = TRIPLES[target]
    cc = shutil.which(f"{triple}-gcc", path=env.get("PATH"))
    cxx = shutil.which(f"{triple}-g++", path=env.get("PATH"))
    if not cc or not cxx:
        raise BuildFailure(
            EXIT_ENV,
            f"cross-compiling for {target} needs {triple}-g++ (Debian/Ubuntu: apt-get install g++-{triple}); "
            "the docker backend's cross image has it",
        )
    return cc, cxx


def target_requirements(spec: BuildSpec) -> list[str]:
    """What the target's libraries come from: torch's wheel and, for CUDA, the runtime of its minor."""
    reqs = [spec.torch_requirement or f"torch=={spec.torch}"]
    cuda = cuda_of_variant(spec.torch_variant or "")
    if cuda:
        reqs.append(f"nvidia-cuda-runtime=={cuda}.*")
    return reqs


def ensure_target_files(spec: BuildSpec, vpy: str, env: dict[str, str], rep: Reporter) -> Path:
    """The target's torch and CUDA runtime wheels, unpacked once into ``<venv_dir>-<platform>/site`` (cached
    like the venv, under a lock); the folder holding ``torch/`` and ``nvidia/``."""
    root = Path(f"{spec.venv_dir}-{spec.platform}")
    site = root / "site"
    py = spec.python.removesuffix("t")
    abi = "cp" + spec.python.replace(".", "")
    reqs = target_requirements(spec)
    want = {"platform": list(PIP_PLATFORMS[spec.platform]), "python": spec.python, "requirements": reqs}
    with file_lock(root.with_name(root.name + ".lock")):
        marker = root / MARKER
        if marker.is_file():
            try:
                if json.loads(marker.read_text(encoding="utf-8")).get("want") == want:
                    rep.line(f"attnforge: reusing the {spec.platform} target files in {site}")
                    return site
            except ValueError:
                pass
        if root.exists():
            shutil.rmtree(root)
        downloads = root / "wheels"
        downloads.mkdir(parents=True)
        cmd = [vpy, "-m", "pip", "download", "--progress-bar", "off", "--no-deps", "--only-binary=:all:"]
        cmd += [arg for plat in PIP_PLATFORMS[spec.platform] for arg in ("--platform", plat)]
        cmd += ["--python-version", py]
        cmd += ["--implementation", "cp", "--abi", abi, "--abi", "none", "--abi", "abi3"]
        cmd += [*spec.pip_args, "-d", str(downloads), *reqs]
        rep.line("attnforge: " + " ".join(cmd))
        rc, _ = stream(cmd, pip_env(spec, env), rep)
        if rc != 0:
            raise BuildFailure(
                EXIT_ENV, f"pip could not download the {spec.platform} wheels {reqs} (exit {rc})"
            )
        for wheel in sorted(downloads.glob("*.whl")):
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(site)
        shutil.rmtree(downloads)
        for lib in site.glob("nvidia/*/lib"):  # -lcudart needs the unversioned name, as a toolkit has
            versioned = sorted(lib.glob("libcudart.so.*"))
            if versioned and not (lib / "libcudart.so").exists():
                (lib / "libcudart.so").symlink_to(versioned[0].name)
        if not (site / "torch" / "lib").is_dir():
            raise BuildFailure(EXIT_ENV, f"the {spec.platform} torch wheel has no torch/lib ({reqs[0]})")
        marker.write_text(json.dumps({"want": want}, indent=1), encoding="utf-8")
    return site


def cross_env(spec: BuildSpec, vpy: str, env: dict[str, str], rep: Reporter) -> dict[str, str]:
    """The variables that turn the build into a cross build for ``spec.platform`` (see the module text)."""
    cc, cxx = cross_compilers(spec.platform, env)
    site = ensure_target_files(spec, vpy, env, rep)
    libs = [str(site / "torch" / "lib"), *(str(p) for p in sorted(site.glob("nvidia/*/lib")))]
    nodot = spec.python.replace(".", "")
    triple = TRIPLES[spec.platform]
    rep.line(f"attnforge: cross-compiling for {spec.platform} with {cxx} against {site}")
    return {
        "CC": cc,
        "CXX": cxx,
        "LDSHARED": f"{cxx} -shared",
        "_PYTHON_HOST_PLATFORM": f"linux-{spec.platform}",
        "ATTNFORGE_CROSS_TORCH": str(site / "torch"),
        "ATTNFORGE_CROSS_LIBS": os.pathsep.join(libs),
        "ATTNFORGE_CROSS_EXT_SUFFIX": f".cpython-{nodot}-{triple}.so",
    }
