"""docker/bases.toml: every base image of attnforge's images, pinned (cibuildwheel's habit).

A registry base is pinned by its manifest digest and used as `name@digest`. A local base (debootstrap +
`docker import`, the NGC stand-ins) has no registry digest: it is pinned by image ID, which only holds on the
machine that made it, so a different local ID is reported, not fatal, unless `strict`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from attnforge.core.docker_cli import Docker
from attnforge.core.errors import ConfigurationError, EnvironmentProblem

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HEADER = """\
# Base images of attnforge's images, pinned (cibuildwheel's habit: one file, rewritten by a command).
# kind = "registry": pinned by manifest digest, used as name@digest; `attnforge images bases --update NAME`
#   pulls the name and records its digest (needs the registry: nvcr.io and Docker Hub are unreachable from
#   attnforge's development machines, so those rows stay unpinned there and a build refuses them).
# kind = "local": made on this machine (debootstrap + docker import, NGC stand-ins); pinned by image ID, which
#   differs on every machine that bootstraps it: a different ID is reported, and `--update` rewrites it.
schema = 1
"""


@dataclass
class BaseRecord:
    """One base: its name, kind, pin and why it is there."""

    name: str
    kind: str  # "registry" | "local"
    pin: str = ""  # sha256:... (registry digest or local image ID); "" = unpinned
    role: str = ""
    note: str = ""

    def to_toml(self) -> str:
        q = json.dumps  # a JSON string is a valid TOML basic string
        rows = [f"name = {q(self.name)}", f"kind = {q(self.kind)}", f"pin = {q(self.pin)}"]
        if self.role:
            rows.append(f"role = {q(self.role)}")
        if self.note:
            rows.append(f"note = {q(self.note)}")
        return "[[base]]\n" + "\n".join(rows) + "\n"


@dataclass
class BaseCheck:
    """How a build will refer to its base, and whether the pin held."""

    name: str
    ref: str  # what FROM gets
    digest: str  # what the labels record
    status: str  # "pinned" | "pin differs" | "unpinned" | "not listed"
    message: str = ""


def load_bases(path: Path) -> dict[str, BaseRecord]:
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path}: {exc}") from None
    out: dict[str, BaseRecord] = {}
    for row in data.get("base", []):
        try:
            rec = BaseRecord(**row)
        except TypeError as exc:
            raise ConfigurationError(f"{path}: bad [[base]] row {row}: {exc}") from None
        out[rec.name] = rec
    return out


def write_bases(path: Path, bases: dict[str, BaseRecord]) -> None:
    body = "\n".join(b.to_toml() for b in sorted(bases.values(), key=lambda b: (b.kind, b.name)))
    path.write_text(HEADER + "\n" + body, encoding="utf-8")


LOCAL_PREFIXES = ("local/", "attnforge-standin/", "attnforge/")


def is_local_name(name: str) -> bool:
    """Names made on this machine (debootstrap bases, stand-ins, attnforge's own images)."""
    return name.startswith(LOCAL_PREFIXES)


def check_base(
    docker: Docker,
    name: str,
    bases: dict[str, BaseRecord],
    *,
    strict: bool = False,
    allow_unpinned: bool = False,
) -> BaseCheck:
    """The FROM reference for a base and the state of its pin (EnvironmentProblem when it cannot be used).

    strict: a local base whose image ID is not the pinned one is an error too.
    allow_unpinned: build on a registry base that has no digest pin (logged).
    """
    rec = bases.get(name)
    local_id = docker.image_id(name)
    kind = rec.kind if rec is not None else ("local" if is_local_name(name) else "registry")
    if kind == "local":
        if local_id is None:
            raise EnvironmentProblem(f"local base image {name} does not exist (bootstrap it first)")
        if rec is None or not rec.pin:
            msg = f"{name} is not pinned in docker/bases.toml (image ID {local_id[:19]}): `attnforge images bases --update {name}`"
            if strict:
                raise EnvironmentProblem(msg)
            return BaseCheck(name, name, local_id, "not listed" if rec is None else "unpinned", msg)
        if rec.pin != local_id:
            msg = (
                f"{name}: this machine's image ID {local_id[:19]} differs from the pin {rec.pin[:19]} "
                "(local bases are per machine; `attnforge images bases --update` records this one)"
            )
            if strict:
                raise EnvironmentProblem(msg)
            return BaseCheck(name, name, local_id, "pin differs", msg)
        return BaseCheck(name, name, local_id, "pinned")
    # registry base
    if rec is None or not rec.pin:
        msg = f"registry base {name} has no digest in docker/bases.toml: `attnforge images bases --update {name}`"
        if not allow_unpinned:
            raise EnvironmentProblem(msg, hint="or build with --allow-unpinned-base")
        return BaseCheck(name, name, local_id or "", "unpinned", msg)
    return BaseCheck(name, f"{name}@{rec.pin}", rec.pin, "pinned")


def current_pin(docker: Docker, name: str, kind: str) -> str:
    """The pin an image has now: local image ID, or the registry digest (after a pull)."""
    if kind == "local":
        iid = docker.image_id(name)
        if iid is None:
            raise EnvironmentProblem(f"no local image {name}")
        return iid
    res = docker.pull(name)
    if not res.ok:
        raise EnvironmentProblem(f"cannot pull {name} to pin it: {res.tail(3)}")
    digests = docker.inspect(name).get("RepoDigests") or []
    repo = name.rsplit(":", 1)[0] if ":" in name.split("/")[-1] else name
    for d in digests:
        if str(d).startswith(repo + "@"):
            return str(d).split("@", 1)[1]
    raise EnvironmentProblem(f"{name} has no repo digest after pulling it")
