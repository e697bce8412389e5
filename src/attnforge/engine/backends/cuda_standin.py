"""Local STAND-INS for `nvidia/cuda:<ver>-devel` builder bases, made where Docker Hub is unreachable.

PyPI's CUDA 12 wheels carry no nvcc, so a CUDA 12 cell needs a base that has the toolkit in
`/usr/local/cuda`, as NVIDIA's devel images do. `attnforge-standin/cuda:12.4.1-devel-debian12` is one: NVIDIA's
CUDA 12.4 binaries from Debian's non-free packages (trixie), unpacked onto the local bookworm base by
`docker/cuda-standin/Dockerfile`. It is NOT an NVIDIA image: its labels, its `/usr/local/cuda/ATTNFORGE-STANDIN`
file and its name say so. Names and package pins are data (`data/pins.toml`, `[cuda_standin."12.4"]`).
`python -m attnforge.engine.backends.cuda_standin [--cuda 12.4] [--base IMAGE] [--force]` makes it; the docker backend
makes it on demand for `build.local_base`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnforge.core.docker_cli import DEFAULT_CA, docker_executable
from attnforge.core.package_files import docker_dir
from attnforge.core.pins import cuda_standins, local_base
from attnforge.engine.backends.debian_base import BaseImageError, bootstrap_debian_base, image_id


@dataclass(frozen=True)
class CudaStandin:
    """One stand-in: its tag, the NVIDIA image it stands in for, and the Debian packages it unpacks."""

    cuda: str  # "12.4"
    cuda_full: str  # "12.4.1"
    tag: str
    stands_in_for: str
    suite: str  # the Debian suite whose non-free archive has the packages
    debs: tuple[str, ...]  # "name=version", pinned


def load_standins() -> dict[str, CudaStandin]:
    """Every stand-in in `data/pins.toml`, by CUDA version."""
    return {
        cuda: CudaStandin(
            cuda=cuda,
            cuda_full=str(row["cuda_full"]),
            tag=str(row["tag"]),
            stands_in_for=str(row["stands_in_for"]),
            suite=str(row.get("suite", "trixie")),
            debs=tuple(str(d) for d in row["debs"]),
        )
        for cuda, row in cuda_standins().items()
    }


STANDINS: dict[str, CudaStandin] = load_standins()


@dataclass(frozen=True)
class StandinResult:
    """The stand-in's tag and image ID, whether this call built it, and how long it took."""

    tag: str
    image_id: str
    created: bool
    seconds: float


def standin_dir() -> Path:
    """docker/cuda-standin/ of attnforge's docker/ folder (package data; ATTNFORGE_DOCKER_DIR overrides docker/)."""
    return docker_dir("cuda-standin") / "cuda-standin"


def standin_for(cuda: str) -> CudaStandin | None:
    """The stand-in of a CUDA version ("12.4"), or None when there is none."""
    return STANDINS.get(cuda)


def build_command(
    s: CudaStandin, *, base: str, tag: str, ca_bundle: Path | None, docker: str | None = None
) -> list[str]:
    """The `docker build` line (BuildKit; the CA bundle is a secret, never a layer)."""
    folder = standin_dir()
    args = {
        "BASE_IMAGE": base,
        "CUDA_SUITE": s.suite,
        "CUDA_VERSION": s.cuda,
        "CUDA_VERSION_FULL": s.cuda_full,
        "CUDA_DEBS": " ".join(s.debs),
        "STANDS_IN_FOR": s.stands_in_for,
    }
    cmd = [
        docker or docker_executable(),
        "build",
        "--progress",
        "plain",
        "-f",
        str(folder / "Dockerfile"),
        "--network",
        "host",
    ]
    for key, value in args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    if ca_bundle is not None:
        cmd += ["--secret", f"id=ca_bundle,src={ca_bundle}"]
    return [*cmd, "-t", tag, str(folder)]


def ensure_cuda_standin(
    cuda: str,
    *,
    base: str | None = None,
    tag: str | None = None,
    ca_bundle: Path | None = DEFAULT_CA,
    log_path: Path | None = None,
    docker: str | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> StandinResult:
    """Make the stand-in of CUDA `cuda` on `base` (default: the pinned local base) unless `tag` exists.

    `force` rebuilds. A missing `local/debian:*` base is bootstrapped with debootstrap. Raises BaseImageError
    naming the log when the build fails, or when there is no stand-in for `cuda`.
    """
    s = standin_for(cuda)
    if s is None:
        raise BaseImageError(
            f"no local stand-in for CUDA {cuda} (there is one for: {', '.join(sorted(STANDINS))})"
        )
    base = base or local_base()
    tag = tag or s.tag
    docker = docker or docker_executable()
    start = time.monotonic()
    existing = image_id(tag, docker=docker)
    if existing and not force:
        return StandinResult(tag, existing, False, 0.0)
    if base.startswith("local/debian:") and image_id(base, docker=docker) is None:
        suite = base.split(":", 1)[1]
        say(f"bootstrapping {base} (debootstrap {suite}, about a minute)")
        bootstrap_debian_base(base, suite=suite, docker=docker)
    ca = ca_bundle if ca_bundle is not None and ca_bundle.exists() else None
    cmd = build_command(s, base=base, tag=tag, ca_bundle=ca, docker=docker)
    say(f"building {tag}: a stand-in for {s.stands_in_for} (NOT an NVIDIA image), about 2-3 min")
    log = log_path or Path("/tmp") / f"attnforge-cuda-standin-{s.cuda}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-12:])
        raise BaseImageError(f"the CUDA {cuda} stand-in {tag} did not build (log {log}):\n{tail}")
    return StandinResult(tag, image_id(tag, docker=docker) or "", True, round(time.monotonic() - start, 1))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m attnforge.engine.backends.cuda_standin`: make the CUDA stand-in base if it is missing."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--cuda", default="12.4", help="CUDA version with a stand-in (default 12.4)")
    ap.add_argument("--base", default=None, help=f"image to unpack the toolkit onto (default {local_base()})")
    ap.add_argument("--tag", default=None, help="tag to give it (default: the stand-in's own name)")
    ap.add_argument(
        "--log", type=Path, default=None, help="build log (default /tmp/attnforge-cuda-standin-*.log)"
    )
    ap.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    args = ap.parse_args(argv)
    try:
        res = ensure_cuda_standin(
            args.cuda, base=args.base, tag=args.tag, log_path=args.log, force=args.force
        )
    except BaseImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 5
    print(f"{res.tag} {'created' if res.created else 'exists'} {res.image_id} ({res.seconds} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
