"""NGC PyTorch releases: which one an image of a cell uses, and what a base image really contains."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from ..errors import EnvironmentProblem
from ..matrix.compat import NgcRelease
from .docker import Docker

NGC_IMAGE_TEMPLATE = "nvcr.io/nvidia/pytorch:{release}-py3"
STANDIN_TEMPLATE = "attnforge-standin/ngc-pytorch:{release}"

# Run inside a base with its own python: what torch, Python, flash-attn and constraint file it has.
_PROBE = r"""
import json, os, sys
from importlib import metadata
out = {"python": "%d.%d" % sys.version_info[:2]}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["cxx11_abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
except Exception as exc:
    out["torch_error"] = repr(exc)
try:
    out["flash_attn"] = metadata.version("flash_attn")
except metadata.PackageNotFoundError:
    out["flash_attn"] = None
path = os.environ.get("PIP_CONSTRAINT") or "/etc/pip/constraint.txt"
out["constraint"] = path if os.path.exists(path) else None
if out["constraint"]:
    pins = [l.strip() for l in open(path) if l.split("==")[0].strip().lower().replace("_", "-") in ("torch", "flash-attn")]
    out["pins"] = pins
out["standin"] = os.environ.get("ATTNFORGE_STANDIN") == "1"
print(json.dumps(out))
"""


@dataclass(frozen=True)
class BaseFacts:
    """What an NGC (or stand-in) image holds, measured by running it."""

    python: str
    torch: str
    cuda: str | None
    cxx11_abi: bool | None
    flash_attn: str | None
    constraint: str | None
    pins: tuple[str, ...]
    standin: bool


def probe_base(docker: Docker, image: str) -> BaseFacts:
    """Run the probe in the image (no network)."""
    res = docker.run("run", "--rm", "--network", "none", image, "python", "-c", _PROBE)
    line = next((ln for ln in reversed(res.output.splitlines()) if ln.startswith("{")), "")
    if not res.ok or not line:
        raise EnvironmentProblem(f"cannot inspect {image}: {res.tail(4)}")
    data: dict[str, Any] = json.loads(line)
    if "torch" not in data:
        raise EnvironmentProblem(f"{image} has no importable torch: {data.get('torch_error')}")
    return BaseFacts(
        python=data["python"],
        torch=data["torch"],
        cuda=data.get("cuda"),
        cxx11_abi=data.get("cxx11_abi"),
        flash_attn=data.get("flash_attn"),
        constraint=data.get("constraint"),
        pins=tuple(data.get("pins") or ()),
        standin=bool(data.get("standin")),
    )


def _release_key(release: str) -> Version:
    try:
        return Version(release)
    except InvalidVersion:
        return Version("0")


def _family(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def _mm(version: str) -> str:
    return ".".join(version.split(".")[:2])


def select_release(
    rows: list[NgcRelease], *, torch: str, toolkit: str, cxx11_abi: bool, release: str | None = None
) -> tuple[NgcRelease | None, str]:
    """The newest NGC release whose torch family and CUDA (major.minor) match a cell, with the reason."""
    if release:
        row = next((r for r in rows if r.release == release), None)
        return (
            (row, "asked for") if row else (None, f"no [[ngc]] row for release {release} in the compat data")
        )
    if not toolkit.startswith("cuda"):
        return None, f"NGC PyTorch images are CUDA images; this cell is {toolkit}"
    cuda = _mm(toolkit[4:])
    fits = [
        r
        for r in rows
        if _family(r.torch) == _family(torch) and _mm(r.cuda) == cuda and r.cxx11_abi == cxx11_abi
    ]
    if fits:
        best = max(fits, key=lambda r: _release_key(r.release))
        return best, f"newest release with torch {_family(torch)} and CUDA {cuda}"
    near = (
        ", ".join(f"{r.release} (torch {_family(r.torch)}, CUDA {_mm(r.cuda)})" for r in rows[-6:]) or "none"
    )
    return None, f"no NGC release pairs torch {_family(torch)} with CUDA {cuda} (known: {near})"
