"""The NGC stand-in base: `attnforge-standin/ngc-pytorch:<release>`, built from docker/ngc-standin/.

nvcr.io is unreachable from attnforge's development machines. The stand-in reproduces what matters of the
NGC PyTorch container for docker/ngc.Dockerfile: a preinstalled torch that reports a custom build's version
(`2.13.0a0+standin`, the CPU wheel relabelled), compilers and build modules, a bundled (fake) flash-attn and
a pip constraint file pinning both. It is labelled and named as a stand-in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnforge.core.docker_cli import Docker
from attnforge.core.errors import BuildError, EnvironmentProblem
from attnforge.core.pins import cpu_torch
from attnforge.engine.backends.debian_base import BaseImageError, bootstrap_debian_base
from attnforge.engine.backends.pipplan import PipPlan, pip_secrets
from attnforge.images.ngc import STANDIN_TEMPLATE
from attnforge.images.runtime_image import DEFAULT_RUNTIME_BASE, docker_dir

# The small CPU torch wheel keeps stand-in images (and tests) small; torch==2.14.1 (CUDA 13, 5 GB) also works.
DEFAULT_TORCH = cpu_torch()
DEFAULT_BUNDLED = "2.7.4+standin"
LAYOUT = "2"  # io.attnforge.standin.layout: a stand-in made by an older Dockerfile is rebuilt


def standin_torch_version(torch_requirement: str) -> str:
    """The custom-build version the stand-in's torch reports, NGC-shaped: `torch==2.13.0+cpu` -> `2.13.0a0+standin`."""
    release = torch_requirement.split("==")[-1].split("+")[0]
    return f"{release}a0+standin"


@dataclass(frozen=True)
class StandinResult:
    """The stand-in image and whether this call built it."""

    tag: str
    image_id: str
    created: bool


def ensure_local_base(dk: Docker, tag: str = DEFAULT_RUNTIME_BASE, log: Callable[[str], None] = print) -> str:
    """The local Debian base (bootstrapped with debootstrap when missing); its image ID."""
    iid = dk.image_id(tag)
    if iid:
        return iid
    log(f"bootstrapping {tag} (debootstrap + docker import, about a minute)")
    try:
        return bootstrap_debian_base(tag, docker=dk.docker).image_id
    except BaseImageError as exc:
        raise EnvironmentProblem(f"cannot make the local base image {tag}: {exc}") from None


def ensure_standin(
    release: str,
    *,
    plan: PipPlan,
    ca_bundle: Path | None = None,
    netrc: Path | None = None,
    torch_requirement: str = DEFAULT_TORCH,
    bundled_flash_attn: str = DEFAULT_BUNDLED,
    torch_version_as: str | None = None,
    base: str = DEFAULT_RUNTIME_BASE,
    force: bool = False,
    docker: Docker | None = None,
    log: Callable[[str], None] = print,
) -> StandinResult:
    """Build attnforge-standin/ngc-pytorch:<release> unless one made with the same arguments exists (force:
    rebuild). `torch_version_as`: the version its torch reports (default `standin_torch_version`; "" keeps
    the wheel's own)."""
    dk = docker or Docker()
    tag = STANDIN_TEMPLATE.format(release=release)
    version_as = standin_torch_version(torch_requirement) if torch_version_as is None else torch_version_as
    want = {
        "torch-requirement": torch_requirement,
        "bundled-flash-attn": bundled_flash_attn,
        "torch-version": version_as,
        "layout": LAYOUT,
    }
    iid = dk.image_id(tag)
    if iid and not force:
        labels = dk.labels(tag)
        if all(labels.get(f"io.attnforge.standin.{k}") == v for k, v in want.items()):
            return StandinResult(tag, iid, False)
        log(f"{tag} exists but was made with other arguments or an older Dockerfile: rebuilding")
    ensure_local_base(dk, base, log)
    folder = docker_dir() / "ngc-standin"
    log(
        f"building the NGC stand-in {tag} (torch {torch_requirement} as {version_as or 'itself'}, "
        f"bundled flash-attn {bundled_flash_attn})"
    )
    with pip_secrets(plan, ca_bundle=ca_bundle, netrc=netrc) as secrets:
        res = dk.build(
            folder,
            folder / "Dockerfile",
            [tag],
            build_args={
                "BASE_IMAGE": base,
                "NGC_RELEASE": release,
                "TORCH_REQUIREMENT": torch_requirement,
                "BUNDLED_FLASH_ATTN": bundled_flash_attn,
                "TORCH_VERSION_AS": version_as,
            },
            secrets=secrets,
        )
    if not res.ok:
        raise BuildError(f"the NGC stand-in {tag} did not build:\n{res.tail(12)}")
    return StandinResult(tag, dk.image_id(tag) or "", True)
