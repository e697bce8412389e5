"""pip options for installing torch inside a build: from matrix.yaml and, optionally, this machine's pip config."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from attnforge.matrix.schema import PipSpec


@dataclass
class PipOptions:
    """Command-line arguments for pip, and the local paths they name (a container mounts them read-only)."""

    args: list[str] = field(default_factory=list)
    local_paths: list[Path] = field(default_factory=list)

    def add(self, flag: str, value: str) -> None:
        self.args += [flag, value]
        parsed = urlparse(value)
        path = (
            Path(parsed.path) if parsed.scheme == "file" else Path(value) if value.startswith("/") else None
        )
        if path is None:
            return
        # a PEP 503 tree's pages link to files beside `simple/` (../../files/...): mount the index root
        self.local_paths.append(path.parent if path.name == "simple" else path)


def host_pip_config() -> dict[str, str]:
    """`pip config list` as a dict (e.g. global.extra-index-url -> 'file:///a file:///b')."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    config: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if value:
            config[key.split(".", 1)[-1].split(".")[-1]] = value.strip().strip("'\"")
    return config


def pip_options(spec: PipSpec, inherit: dict[str, str] | None = None) -> PipOptions:
    """Explicit options from matrix.yaml win; the host's config fills in what they leave out."""
    host = (inherit if inherit is not None else host_pip_config()) if spec.inherit_host_config else {}
    opts = PipOptions()
    index = spec.index_url or host.get("index-url")
    if index:
        opts.add("--index-url", index)
    for url in spec.extra_index_urls or host.get("extra-index-url", "").split():
        opts.add("--extra-index-url", url)
    for link in spec.find_links or host.get("find-links", "").split():
        opts.add("--find-links", link)
    if host.get("constraint"):
        opts.add("--constraint", host["constraint"])
    return opts
