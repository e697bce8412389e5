"""The environment a wheel must fit: run the probe (`env_probe.py`) with an interpreter and read its axes
(Python, platform, torch and its accelerator, C++ ABI, GPUs, driver) into an `Env`."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.tags import compatible_tags, cpython_tags

from attnforge.core.arches import sm_of_compute_cap
from attnforge.core.errors import EnvironmentProblem
from attnforge.engine import env_probe as probe
from attnforge.names import cuda_variant, rocm_variant

PROBE_MARK = "ATTNFORGE-PROBE "


def run_probe(
    python: str | None = None, project: str | None = None, module: str | None = None, timeout: float = 600
) -> dict[str, Any]:
    """Run `probe.py` with `python` (default: this interpreter) and return what it found, within `timeout`
    seconds."""
    exe = python or sys.executable
    source = Path(probe.__file__).read_text(encoding="utf-8")
    args = [a for a in (project, module) if a is not None]
    try:
        proc = subprocess.run(
            [exe, "-c", source, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"inspecting {exe} took longer than {timeout:g} s") from None
    except OSError as exc:
        raise EnvironmentProblem(f"cannot run {exe}: {exc.strerror or exc}") from None
    for line in proc.stdout.splitlines():
        if line.startswith(PROBE_MARK):
            data: dict[str, Any] = json.loads(line[len(PROBE_MARK) :])
            return data
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise EnvironmentProblem(f"inspecting {exe} failed (exit {proc.returncode}): {tail}")


@dataclass(frozen=True)
class Env:
    """The axes of an environment that decide which wheel fits."""

    python: str  # "3.11", "3.14t" (a free-threaded CPython)
    machine: str
    glibc: tuple[int, int] | None
    torch: str | None  # "2.14.1+cu130"
    accel: str | None  # "cu130" | "rocm6.4" | None (CPU-only torch)
    cxx11_abi: bool | None
    gpus: tuple[str, ...]  # "sm_90" / "gfx942"
    driver_cuda: str | None

    @classmethod
    def from_probe(cls, data: dict[str, Any]) -> Env:
        t = data.get("torch") or {}
        accel = None
        if t.get("cuda"):
            accel = cuda_variant(str(t["cuda"]))
        elif t.get("hip"):
            accel = rocm_variant(str(t["hip"]))
        gpus = []
        for g in t.get("gpus") or []:
            if str(g.get("gcn_arch") or "").startswith("gfx"):
                gpus.append(str(g["gcn_arch"]).split(":")[0])
            else:
                major, minor = g["capability"]
                gpus.append(sm_of_compute_cap(f"{major}.{minor}"))
        glibc = None
        if data.get("glibc"):
            major, minor = str(data["glibc"]).split(".")[:2]
            glibc = (int(major), int(minor))
        driver = data.get("driver") or {}
        return cls(
            python=".".join(str(data["python"]).split(".")[:2]) + ("t" if data.get("free_threaded") else ""),
            machine=str(data.get("machine") or ""),
            glibc=glibc,
            torch=t.get("version") if t.get("installed") else None,
            accel=accel,
            cxx11_abi=t.get("cxx11_abi") if t.get("installed") else None,
            gpus=tuple(gpus),
            driver_cuda=driver.get("cuda"),
        )

    @property
    def python_tag(self) -> str:
        return "cp" + self.python.replace(".", "")

    def describe(self) -> str:
        abi = "?" if self.cxx11_abi is None else ("TRUE" if self.cxx11_abi else "FALSE")
        gpu = ", ".join(self.gpus) or "no GPU"
        torch = (
            f"torch {self.torch} [{self.accel or 'CPU-only'}], cxx11abi {abi}" if self.torch else "no torch"
        )
        return f"Python {self.python} ({self.machine}), {torch}, {gpu}" + (
            f", driver CUDA {self.driver_cuda}" if self.driver_cuda else ""
        )


def interpreter_abis(python: str) -> frozenset[tuple[str, str]]:
    """The (interpreter, ABI) tag pairs pip installs on CPython `python` ("3.11", "3.14t"), whatever the platform.

    `cp311-cp311`, `cp311-abi3` … `cp32-abi3`, `cp311-none`, `py311-none`, `py3-none`, `py310-none` …
    `py30-none`: `packaging.tags`, with the ABI named here rather than read from this process.
    """
    major, minor = (int(p) for p in python.removesuffix("t").split(".")[:2])
    cp = f"cp{major}{minor}"
    abi = cp + (
        "t" if python.endswith("t") else ""
    )  # free-threaded: cp314t, and no abi3 (packaging drops it)
    supported = [
        *cpython_tags((major, minor), abis=[abi], platforms=["any"]),
        *compatible_tags((major, minor), cp, platforms=["any"]),
    ]
    return frozenset((t.interpreter, t.abi) for t in supported)
