"""NGC PyTorch releases: which one an image of a cell uses, and what a base image really contains."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from attnforge.core.docker_cli import Docker
from attnforge.core.errors import EnvironmentProblem
from attnforge.engine import env_probe as probe
from attnforge.engine.environment import PROBE_MARK, Env
from attnforge.matrix.compat import NgcRelease
from attnforge.names import cuda_version

NGC_IMAGE_TEMPLATE = "nvcr.io/nvidia/pytorch:{release}-py3"
STANDIN_TEMPLATE = "attnforge-standin/ngc-pytorch:{release}"

# Run inside a base after engine/env_probe.py (the probe `attnforge build --python` reads an environment with):
# what pip's constraint file (NGC: /etc/pip/constraint.txt, PIP_CONSTRAINT) pins, and the stand-in's mark.
_NGC_PROBE = r"""
import json, os
path = os.environ.get("PIP_CONSTRAINT") or "/etc/pip/constraint.txt"
out = {"constraint": path if os.path.exists(path) else None, "standin": os.environ.get("ATTNFORGE_STANDIN") == "1"}
if out["constraint"]:
    names = ("torch", "flash-attn")
    out["pins"] = [l.strip() for l in open(path) if l.split("==")[0].strip().lower().replace("_", "-") in names]
print("ATTNFORGE-NGC " + json.dumps(out))
"""
_NGC_MARK = "ATTNFORGE-NGC "


@dataclass(frozen=True)
class BaseFacts:
    """What an NGC (or stand-in) image holds, measured by running it: its Python and torch as the env
    backend reads an environment, the bundled flash-attn and the constraint file."""

    env: Env
    executable: str  # the image's `python`, which the builder builds with (spec.python)
    cuda: str | None  # torch.version.cuda (None: a CPU torch, only in the stand-in)
    flash_attn: str | None
    constraint: str | None
    pins: tuple[str, ...]
    standin: bool

    @property
    def python(self) -> str:
        return self.env.python

    @property
    def torch(self) -> str:
        assert self.env.torch is not None
        return self.env.torch


def probe_base(docker: Docker, image: str) -> BaseFacts:
    """Run engine/env_probe.py and the constraint probe in the image (one container, no network)."""
    script = 'python -c "$1" flash-attn && python -c "$2"'
    source = Path(probe.__file__).read_text(encoding="utf-8")
    res = docker.run("run", "--rm", "--network", "none", image, "sh", "-c", script, "sh", source, _NGC_PROBE)
    lines = res.output.splitlines()
    env_line = next((ln for ln in lines if ln.startswith(PROBE_MARK)), "")
    ngc_line = next((ln for ln in lines if ln.startswith(_NGC_MARK)), "")
    if not res.ok or not env_line or not ngc_line:
        raise EnvironmentProblem(f"cannot inspect {image}: {res.tail(4)}")
    data: dict[str, Any] = json.loads(env_line[len(PROBE_MARK) :])
    extra: dict[str, Any] = json.loads(ngc_line[len(_NGC_MARK) :])
    env = Env.from_probe(data)
    if env.torch is None:
        raise EnvironmentProblem(f"{image} has no importable torch: {(data.get('torch') or {}).get('error')}")
    flash_attn = data.get("flash_attn") or {}
    return BaseFacts(
        env=env,
        executable=str(data["executable"]),
        cuda=(data.get("torch") or {}).get("cuda"),
        flash_attn=flash_attn.get("version") if flash_attn.get("installed") else None,
        constraint=extra.get("constraint"),
        pins=tuple(extra.get("pins") or ()),
        standin=bool(extra.get("standin")),
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
    version = cuda_version(toolkit)
    if version is None:
        return None, f"NGC PyTorch images are CUDA images; this cell is {toolkit}"
    cuda = _mm(version)
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
