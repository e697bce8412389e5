"""Make a local Debian base image with debootstrap + ``docker import``.

For sites that cannot pull from a registry (air-gapped sites, this project's development machines):
``bootstrap_debian_base("local/debian:bookworm")`` builds a minimal Debian root file system and
imports it as a one-layer image. It is idempotent: an image that already exists is left alone.
Needs root (debootstrap) and a reachable Debian mirror (plain HTTP, so no CA bundle is involved).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnforge.core.docker_cli import docker_executable
from attnforge.core.pins import local_base

DEFAULT_TAG = local_base()
DEFAULT_MIRROR = "http://deb.debian.org/debian"

# Set in the imported image so that `docker run IMAGE cmd` behaves like an official base.
_IMAGE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["/bin/bash"]',
)


@dataclass(frozen=True)
class BaseImageResult:
    """What :func:`bootstrap_debian_base` did."""

    tag: str
    created: bool
    seconds: float
    image_id: str


class BaseImageError(RuntimeError):
    """debootstrap or docker import failed; the message carries the tail of the tool's output."""


def image_id(tag: str, *, docker: str | None = None) -> str | None:
    """Return the id of a local image, or None when it does not exist."""
    proc = subprocess.run(
        [docker or docker_executable(), "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def debootstrap_command(
    rootfs: Path,
    *,
    suite: str = "bookworm",
    mirror: str = DEFAULT_MIRROR,
    variant: str = "minbase",
    include: Sequence[str] = (),
) -> list[str]:
    """The debootstrap command line (exposed for dry runs and tests)."""
    cmd = ["debootstrap", f"--variant={variant}"]
    if include:
        cmd.append("--include=" + ",".join(include))
    cmd += [suite, str(rootfs), mirror]
    return cmd


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _clean_rootfs(rootfs: Path) -> None:
    """Drop caches that only make the layer bigger."""
    for rel in ("var/cache/apt/archives", "var/lib/apt/lists"):
        d = rootfs / rel
        if not d.is_dir():
            continue
        for entry in d.iterdir():
            if entry.is_file() and entry.name not in ("lock",):
                entry.unlink()


def bootstrap_debian_base(
    tag: str = DEFAULT_TAG,
    *,
    suite: str = "bookworm",
    mirror: str = DEFAULT_MIRROR,
    variant: str = "minbase",
    include: Sequence[str] = (),
    docker: str | None = None,
    workdir: Path | None = None,
    force: bool = False,
) -> BaseImageResult:
    """Create image ``tag`` from a debootstrapped Debian ``suite`` unless it already exists.

    ``workdir`` holds the temporary root file system (default: a directory under /tmp); it is
    removed afterwards. ``force`` rebuilds even when the image exists.
    """
    start = time.monotonic()
    docker = docker or docker_executable()
    existing = image_id(tag, docker=docker)
    if existing and not force:
        return BaseImageResult(tag=tag, created=False, seconds=0.0, image_id=existing)
    if shutil.which("debootstrap") is None:
        raise BaseImageError("debootstrap is not installed (apt-get install -y debootstrap)")
    if os.geteuid() != 0:
        raise BaseImageError("debootstrap needs root")
    tmp = Path(tempfile.mkdtemp(prefix="attnforge-rootfs-", dir=workdir))
    rootfs = tmp / "rootfs"
    try:
        proc = subprocess.run(
            debootstrap_command(rootfs, suite=suite, mirror=mirror, variant=variant, include=include),
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise BaseImageError(
                f"debootstrap failed ({proc.returncode}):\n{_tail(proc.stdout + proc.stderr)}"
            )
        _clean_rootfs(rootfs)
        import_cmd = [docker, "import"]
        for change in _IMAGE_CHANGES:
            import_cmd += ["--change", change]
        import_cmd += ["-", tag]
        with subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
        ) as tar:
            imp = subprocess.run(import_cmd, stdin=tar.stdout, capture_output=True, text=True, check=False)
            if tar.stdout is not None:
                tar.stdout.close()
            tar_rc = tar.wait()
        if tar_rc != 0 or imp.returncode != 0:
            raise BaseImageError(
                f"docker import failed (tar {tar_rc}, import {imp.returncode}):\n{_tail(imp.stderr)}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    new_id = image_id(tag, docker=docker) or ""
    return BaseImageResult(tag=tag, created=True, seconds=round(time.monotonic() - start, 1), image_id=new_id)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnforge.engine.backends.debian_base [TAG]``: make the base image if it is missing."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    tag = args[0] if args else DEFAULT_TAG
    try:
        res = bootstrap_debian_base(tag)
    except BaseImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 5
    state = "created" if res.created else "exists"
    print(f"{res.tag} {state} {res.image_id} ({res.seconds} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
