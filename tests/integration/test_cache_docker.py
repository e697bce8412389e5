"""`attnforge cache du|prune --docker` against the real engine: what counts as garbage, and removing it.

The test makes its own tiny images (`docker import`, no build) and a created-never-started container,
and removes only those: the engine is shared, other sessions' dangling images are not ours to delete.
"""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import tarfile
from collections.abc import Callable, Iterator

import pytest

from attnforge.cache import docker_items
from attnforge.core.docker_cli import docker_executable

DOCKER = docker_executable()  # ATTNFORGE_DOCKER, as attnforge itself
Run = Callable[..., tuple[int, str, str]]
pytestmark = pytest.mark.docker


def _docker(*args: str, data: bytes | None = None) -> str:
    proc = subprocess.run([DOCKER, *args], input=data, capture_output=True, check=True, timeout=120)
    return proc.stdout.decode().strip()


def _import(tag: str, content: bytes) -> str:
    """A one-file image with an attnforge label, made by `docker import` (no build, no pull)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("marker")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    out = _docker("import", "--change", "LABEL io.attnforge.test=cache", "-", tag, data=buf.getvalue())
    return out.removeprefix("sha256:")[:12]


@pytest.fixture
def garbage() -> Iterator[tuple[str, str, str, str]]:
    """(tag, tagged id, dangling id, container name)."""
    tag = f"attnforge/cache-test:{secrets.token_hex(4)}"
    old = _import(tag, b"old")
    new = _import(tag, b"new")  # takes the tag: `old` is now dangling
    name = f"attnforge-{secrets.token_hex(8)}"
    _docker("create", "--name", name, tag, "/marker")
    try:
        yield tag, new, old, name
    finally:
        subprocess.run([DOCKER, "rm", "-f", name], capture_output=True, check=False)
        subprocess.run([DOCKER, "rmi", "-f", tag, old], capture_output=True, check=False)


def test_du_and_prune_docker(run_cli: Run, garbage: tuple[str, str, str, str], tmp_path: object) -> None:
    tag, tagged, dangling, name = garbage
    code, out, err = run_cli(
        "cache", "du", "--cache-dir", f"{tmp_path}/c", "--output-dir", f"{tmp_path}/w", "--json", "--docker"
    )
    assert code == 0, err
    items = {i["id"]: i for i in json.loads(out)["docker"]}
    assert items[tagged]["name"] == tag and items[tagged]["garbage"] is False
    assert items[dangling]["name"] == "<none>" and items[dangling]["garbage"] is True
    containers = {i["name"]: i for i in items.values() if i["kind"] == "container"}
    assert containers[name]["garbage"] is True

    code, out, _ = run_cli("cache", "prune", "--cache-dir", f"{tmp_path}/c", "--docker", "--dry-run")
    assert code == 0
    assert f"would remove docker image {dangling}" in out and "would remove docker container" in out
    assert tagged not in out
    assert _docker("ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}") == name  # still there

    ours = [i for i in docker_items.inventory(DOCKER) if i.id == dangling or i.name == name]
    assert len(ours) == 2
    for item in sorted(ours, key=lambda i: i.kind):  # the container first
        assert docker_items.remove(DOCKER, item) is None
    assert _docker("ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}") == ""
    assert dangling not in _docker("images", "-q", "--filter", "dangling=true")
    assert _docker("images", "-q", tag) == tagged  # tagged images are never garbage
