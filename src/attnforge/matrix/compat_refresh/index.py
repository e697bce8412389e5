"""Where `compat refresh` reads the package index: a live simple API (PEP 691 JSON, else PEP 503 HTML) or a
recorded snapshot of it (JSON: the file list of each project and the few wheel members read)."""

from __future__ import annotations

import datetime
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.matrix.compat_refresh.rangezip import read_members
from attnforge.matrix.source_lock import PYPI_SIMPLE, simple_files

_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
_TIMEOUT = 60


@dataclass(frozen=True)
class IndexFile:
    """One file of a project on the index (what the simple API tells)."""

    filename: str
    url: str = ""
    requires_python: str | None = None
    upload_time: str | None = None  # ISO 8601, PEP 700; None where the index does not say


class Index(Protocol):
    """What refresh asks of an index."""

    @property
    def name(self) -> str: ...

    def files(self, project: str) -> list[IndexFile]: ...

    def members(self, file: IndexFile, names: list[str]) -> dict[str, str | None]: ...


def ssl_context() -> ssl.SSLContext:
    """The CA bundle pip is told to use (an intercepting proxy's), else the system's trust store."""
    for key in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        value = os.environ.get(key)
        if value and Path(value).is_file():
            return ssl.create_default_context(cafile=value)
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    return ssl.create_default_context(cafile=str(system) if system.is_file() else None)


def _kept(filename: str) -> bool:
    """Linux wheels, pure-Python wheels and sdists: the files attnforge's cells can use."""
    if filename.endswith((".tar.gz", ".zip")):
        return True
    return filename.endswith(".whl") and ("manylinux" in filename or filename.endswith("-any.whl"))


class LiveIndex:
    """A simple API at `url` (PyPI's by default)."""

    def __init__(self, url: str = PYPI_SIMPLE) -> None:
        self.name = url.rstrip("/")
        self.context = ssl_context()

    def files(self, project: str) -> list[IndexFile]:
        page_url = f"{self.name}/{project}/"
        req = urllib.request.Request(page_url, headers={"Accept": _ACCEPT})
        try:
            with urllib.request.urlopen(req, timeout=_TIMEOUT, context=self.context) as resp:
                body, ctype = resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise EnvironmentProblem(f"cannot read the package index {page_url}: {exc}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise EnvironmentProblem(f"cannot reach the package index {self.name}: {exc}") from None
        try:
            if "json" in ctype:
                return [
                    IndexFile(
                        f["filename"],
                        urllib.parse.urljoin(page_url, f["url"]),
                        f.get("requires-python"),
                        f.get("upload-time"),
                    )
                    for f in json.loads(body).get("files", [])
                    if _kept(f["filename"]) and not f.get("yanked")
                ]
            return [IndexFile(n, u) for n, u, _ in simple_files(body, ctype, page_url) if _kept(n)]
        except (ValueError, KeyError, TypeError) as exc:
            raise EnvironmentProblem(f"{page_url}: not a simple-index page ({ctype}): {exc}") from None

    def members(self, file: IndexFile, names: list[str]) -> dict[str, str | None]:
        raw = read_members(file.url, names, self.context)
        return {n: None if b is None else b.decode("utf-8", errors="replace") for n, b in raw.items()}


def _trim(name: str, text: str | None) -> str | None:
    """What a snapshot keeps of a member: a wheel's METADATA headers but its description, a CMake
    config's C++ flag lines; other members (a few headers) whole."""
    if text is None:
        return None
    if name.endswith(".dist-info/METADATA"):
        head = text.split("\n\n", 1)[0]
        return "\n".join(
            line for line in head.splitlines() if line.startswith(("Name:", "Version:", "Requires-"))
        )
    if name.endswith(".cmake"):
        return "\n".join(line for line in text.splitlines() if "CXX" in line)
    return text


@dataclass
class Recorder:
    """Wraps an index and keeps what was read, to be written as a snapshot (`--record FILE`)."""

    inner: LiveIndex
    projects: dict[str, list[IndexFile]] = field(default_factory=dict)
    read: dict[str, dict[str, str | None]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.inner.name

    def files(self, project: str) -> list[IndexFile]:
        self.projects[project] = self.inner.files(project)
        return self.projects[project]

    def members(self, file: IndexFile, names: list[str]) -> dict[str, str | None]:
        got = self.inner.members(file, names)
        self.read.setdefault(file.filename, {}).update({n: _trim(n, t) for n, t in got.items()})
        return got

    def snapshot(self) -> dict[str, Any]:
        """The snapshot: its date, the index, each project's files (no URLs) and the members read."""
        return {
            "taken": datetime.date.today().isoformat(),
            "index": self.name,
            "projects": {
                p: [{k: v for k, v in asdict(f).items() if k != "url" and v is not None} for f in files]
                for p, files in sorted(self.projects.items())
            },
            "members": self.read,
        }


class SnapshotIndex:
    """A recorded snapshot (`--snapshot FILE`): the same answers, offline."""

    def __init__(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
            self.taken: str = data["taken"]
            self.name = f"{data['index']} (snapshot {path.name})"
            self._projects = {p: [IndexFile(**f) for f in files] for p, files in data["projects"].items()}
            self._members: dict[str, dict[str, str | None]] = data.get("members", {})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(f"index snapshot {path}: {exc}") from None

    def files(self, project: str) -> list[IndexFile]:
        return list(self._projects.get(project, []))

    def members(self, file: IndexFile, names: list[str]) -> dict[str, str | None]:
        have = self._members.get(file.filename, {})
        missing = [n for n in names if n not in have]
        if missing:
            raise EnvironmentProblem(
                f"index snapshot {self.name}: {file.filename}: {', '.join(missing)} not recorded"
            )
        return {n: have[n] for n in names}
