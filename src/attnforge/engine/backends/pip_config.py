"""pip options for installing torch inside a build: from matrix.yaml and, optionally, this machine's pip config.

Index credentials never stay in a URL: matrix.yaml refuses them (schema), and those of this machine's pip
configuration are scrubbed into netrc entries (`pip_credentials`), which reach pip as a file."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from attnforge.core.index_urls import config_values
from attnforge.engine.backends.pip_credentials import IndexLogin, NetrcFile, check_netrc, scrub
from attnforge.matrix.schema import PipSpec


@dataclass
class PipOptions:
    """Command-line arguments for pip, and the local paths they name (a container mounts them read-only)."""

    args: list[str] = field(default_factory=list)
    local_paths: list[Path] = field(default_factory=list)
    logins: list[IndexLogin] = field(default_factory=list)  # scrubbed from this machine's pip config
    netrc_file: Path | None = None  # build.pip.netrc
    notes: list[str] = field(default_factory=list)

    def netrc(self) -> NetrcFile:
        """The netrc to hand pip (build.pip.netrc plus what was scrubbed), written on first use."""
        return NetrcFile(list(self.logins), self.netrc_file)

    def add_scrubbed(self, flag: str, value: str, where: str) -> None:
        """`add`, with a credentialed URL's user and password moved into a netrc entry."""
        clean, login = scrub(value, where)
        if login is not None:
            self.logins.append(login)
            self.notes.append(
                f"{where}: the credentials for {login.host} reach pip through a netrc file, not the URL"
            )
        self.add(flag, clean)

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
    """`pip config list` as a dict (e.g. global.extra-index-url -> 'file:///a file:///b'): a value pip.conf
    spells over several lines comes back as a repr with `\\n`, each of its URLs kept apart."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    config: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if value:
            config[key.split(".", 1)[-1].split(".")[-1]] = " ".join(config_values(value))
    return config


def pip_options(spec: PipSpec, inherit: dict[str, str] | None = None, base: Path | None = None) -> PipOptions:
    """Explicit options from matrix.yaml win; the host's config fills in what they leave out (its credentialed
    URLs scrubbed). `base`: the folder a relative build.pip.netrc is read from (matrix.yaml's)."""
    host = (inherit if inherit is not None else host_pip_config()) if spec.inherit_host_config else {}
    opts = PipOptions()
    settings: list[tuple[str, list[str]]] = [
        ("index-url", [spec.index_url] if spec.index_url else []),
        ("extra-index-url", list(spec.extra_index_urls)),
        ("find-links", list(spec.find_links)),
    ]
    for (
        key,
        explicit,
    ) in settings:  # matrix.yaml's values as they are (schema: no credentials), else the host's
        for value in explicit:
            opts.add(f"--{key}", value)
        for value in [] if explicit else config_values(host.get(key, "")):
            opts.add_scrubbed(f"--{key}", value, f"this machine's pip config ({key})")
    if host.get("constraint"):
        opts.add("--constraint", host["constraint"])
    if spec.netrc:
        path = Path(os.path.expandvars(spec.netrc)).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        opts.netrc_file = check_netrc(path, "build.pip.netrc")
    return opts


def constraint_conflict(opts: PipOptions, torch: str) -> str | None:
    """Why a `--constraint` file the build hands pip (this machine's pip config) excludes torch==`torch`, or
    None: said before any image is built, instead of pip refusing the venv deep inside a build."""
    files = [opts.args[i + 1] for i, a in enumerate(opts.args[:-1]) if a == "--constraint"]
    for name in files:
        try:
            lines = Path(name).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue  # pip names an unreadable file itself
        for line in lines:
            text = line.split("#", 1)[0].strip()
            try:
                req = Requirement(text) if text else None
            except InvalidRequirement:
                continue
            if (
                req is not None
                and canonicalize_name(req.name) == "torch"
                and req.specifier
                and not req.specifier.contains(torch, prereleases=True)
            ):
                return (
                    f"this machine's pip constraint file {name} has `{text}`, which excludes torch=={torch}; "
                    "set `build.pip.inherit_host_config: false` in matrix.yaml (with the indexes the build "
                    "needs) or build that torch where the site's pip allows it"
                )
    return None
