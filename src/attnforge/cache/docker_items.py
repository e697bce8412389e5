"""attnforge's images and containers in Docker: builder images, and the garbage `prune --docker` removes.

Garbage: stopped build containers (`attnforge-<16 hex>`, normally removed by `docker run --rm`) and dangling
(untagged) images carrying an `io.attnforge.*` label, e.g. a builder image whose tag a rebuild moved on.
Tagged images are listed, never removed: another checkout on the same machine may use them.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from typing import Any

from attnforge.core.errors import EnvironmentProblem

BUILD_CONTAINER = re.compile(r"attnforge-[0-9a-f]{16}")
LABEL_PREFIX = "io.attnforge."
BUILDER_REPOS = "attnforge/*"


@dataclass
class DockerItem:
    kind: str  # image | container
    id: str
    name: str
    size: int
    created: str
    garbage: bool


def _docker(docker: str, *args: str) -> str:
    try:
        proc = subprocess.run([docker, *args], capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentProblem(f"cannot run {docker}: {exc}") from None
    if proc.returncode != 0:
        raise EnvironmentProblem(f"`docker {' '.join(args[:2])}` failed: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _inspect_images(docker: str, ids: list[str]) -> list[dict[str, Any]]:
    if not ids:
        return []
    data: list[dict[str, Any]] = json.loads(_docker(docker, "image", "inspect", *ids))
    return data


def _is_attnforge(image: dict[str, Any]) -> bool:
    labels = (image.get("Config") or {}).get("Labels") or {}
    return any(str(k).startswith(LABEL_PREFIX) for k in labels)


def inventory(docker: str) -> list[DockerItem]:
    """attnforge's tagged images, dangling attnforge images, and stopped build containers."""
    items: list[DockerItem] = []
    tagged = _json_lines(
        _docker(docker, "images", "--filter", f"reference={BUILDER_REPOS}", "--format", "{{json .}}")
    )
    dangling = _json_lines(_docker(docker, "images", "--filter", "dangling=true", "--format", "{{json .}}"))
    ids = sorted({str(r["ID"]) for r in tagged + dangling})
    names = {str(r["ID"]): f"{r['Repository']}:{r['Tag']}" for r in tagged}
    for image in _inspect_images(docker, ids):
        short = str(image["Id"]).removeprefix("sha256:")[:12]
        is_dangling = not image.get("RepoTags")
        if is_dangling and not _is_attnforge(image):
            continue
        name = names.get(short) or ", ".join(image.get("RepoTags") or []) or "<none>"
        items.append(
            DockerItem(
                "image",
                short,
                name,
                int(image.get("Size") or 0),
                str(image.get("Created", ""))[:19],
                is_dangling,
            )
        )
    stopped = ["--filter", "status=exited", "--filter", "status=created", "--filter", "status=dead"]
    for row in _json_lines(_docker(docker, "ps", "-a", *stopped, "--format", "{{json .}}")):
        if BUILD_CONTAINER.fullmatch(str(row.get("Names", ""))):
            items.append(
                DockerItem(
                    "container", str(row["ID"]), str(row["Names"]), 0, str(row.get("CreatedAt", "")), True
                )
            )
    return items


def remove(docker: str, item: DockerItem) -> str | None:
    """Remove a garbage item; None when removed, else docker's reason."""
    cmd = ["rm", item.id] if item.kind == "container" else ["rmi", item.id]
    try:
        _docker(docker, *cmd)
    except EnvironmentProblem as exc:
        return str(exc)
    return None
