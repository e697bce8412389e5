"""The static index: one PEP 503/691 tree per variant plus `all`, swapped in atomically under a lock.

Layout of a destination path (e.g. `wheels/index`), a symlink to the current generation beside it:

    wheels/index -> .index.gen-<id>/
        index.html                                  landing page (variants; `publish.coverage` writes the
                                                    coverage page here instead, with coverage.json)
        attnforge-index.json                        what the index holds (the source of the pages)
        <variant>/simple/index.html|index.json      PEP 503 / PEP 691 project list
        <variant>/simple/<project>/index.html|.json PEP 503 / PEP 691 (+ PEP 658/714 metadata, PEP 700)
        <variant>/simple/<project>/<wheel>          the wheel (hard links: one copy on disk)
        <variant>/simple/<project>/<wheel>.metadata its core metadata (PEP 658)
        <variant>/simple/<project>/<wheel>.manifest.json
        <variant>/simple/<project>/<wheel>.provenance.intoto.json|.parity.intoto.json|.cdx.json
                                                    its signed records and SBOM (docs/records.md)
        all/simple/...                              every variant together

A publish builds a new generation beside the current one (hard-linking the files it keeps), then
replaces the symlink with `rename(2)`: readers see the old index or the new one, never a mix, and a
failure (or a kill) before the rename leaves the old index byte for byte. `fcntl.flock` on
`.index.lock` serializes publishers; each merges into whatever generation is current when it holds the lock.
Yanking (PEP 592) changes only the records and the pages, through the same lock and swap (`update`).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import html
import json
import os
import secrets
import shutil
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.publish.index_marker import checked_records, read_marker, safe_variant
from attnforge.wheels.manifest import dumps
from attnforge.wheels.records import RECORD_SUFFIXES, TORCH_CHECKS_SUFFIX
from attnforge.wheels.zip_limits import read_member

MARKER = "attnforge-index.json"
ALL = "all"
API_VERSION = "1.1"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"
LOCK_TIMEOUT_S = 900.0


@dataclass
class Bundle:
    """A finalized wheel and its manifest, ready to publish."""

    wheel: Path
    manifest: dict[str, Any]
    gate: str = "not-required"  # parity gate outcome: passed | not-required | skipped
    signed: str = "unsigned"  # the key id (16 hex) its provenance verified with, or "unsigned"
    records: list[Path] = field(default_factory=list)  # signed records and SBOM, served beside the wheel

    @property
    def filename(self) -> str:
        return self.wheel.name

    @property
    def sha256(self) -> str:
        return str(self.manifest["sha256"])

    @property
    def variant(self) -> str:
        return str(self.manifest["variant"])

    @property
    def project(self) -> str:
        return str(canonicalize_name(parse_wheel_filename(self.filename)[0]))


@dataclass
class FileRecord:
    """One wheel in the index (the marker file holds these; pages are generated from them)."""

    filename: str
    project: str
    version: str
    variant: str
    sha256: str
    size: int
    metadata_sha256: str
    requires_python: str | None
    upload_time: str
    parity: str
    yanked: str | None = None  # PEP 592: the reason it was withdrawn (None: not yanked)
    yanked_time: str | None = None


@dataclass
class PublishReport:
    """What a publish did."""

    destination: str
    added: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped_gate: list[str] = field(default_factory=list)
    generation: str | None = None
    notes: list[str] = field(default_factory=list)


_ARCHES = ("x86_64", "aarch64", "ppc64le", "s390x", "armv7l", "i686", "riscv64")


def slot(filename: str) -> tuple[str, str, str, str, str]:
    """(project, version, python, abi, arch): two files in one slot would make pip's choice arbitrary."""
    name, version, _, tags = parse_wheel_filename(filename)
    t = sorted(tags, key=str)[0]
    arch = next((a for a in _ARCHES if t.platform.endswith(a)), t.platform)
    return (str(canonicalize_name(name)), str(version).lower(), t.interpreter, t.abi, arch)


def check_conflicts(
    existing: dict[str, str], incoming: Sequence[tuple[str, str]]
) -> tuple[list[str], list[str]]:
    """Compare (filename, sha256) pairs with what an index holds: returns (new, unchanged); raises on conflict.

    Refused: the same file name with other bytes, and another file for the same version, Python, ABI
    and architecture (a re-finalized wheel with a new platform tag is a new version, not a replacement).
    """
    new: list[str] = []
    unchanged: list[str] = []
    problems: list[str] = []
    slots = {slot(f): f for f in existing}
    seen: dict[str, str] = {}
    for filename, sha in incoming:
        if filename in seen:
            if seen[filename] != sha:
                problems.append(f"{filename}: given twice with different bytes")
            continue
        seen[filename] = sha
        if filename in existing:
            if existing[filename] == sha:
                unchanged.append(filename)
            else:
                problems.append(
                    f"{filename}: already published with other bytes (sha256 {existing[filename][:12]}..., "
                    f"new {sha[:12]}...); a version is never replaced: bump the version or the build tag"
                )
            continue
        other = slots.get(slot(filename))
        if other is not None and other != filename:
            problems.append(f"{filename}: version already published as {other}")
            continue
        slots[slot(filename)] = filename
        new.append(filename)
    if problems:
        raise PublishError("refused, nothing was published: " + "; ".join(problems))
    return new, unchanged


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _write(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _copy_verified(src: Path, dst: Path, sha256: str) -> int:
    """Copy and hash in one pass; PublishError when the bytes are not the manifest's."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    size = 0
    try:
        with src.open("rb") as fin, dst.open("wb") as fout:
            while chunk := fin.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
    except OSError as exc:
        raise PublishError(f"{src.name}: cannot read: {exc.strerror or exc}") from None
    if h.hexdigest() != sha256:
        raise PublishError(f"{src.name}: bytes changed since finalize (sha256 differs from its manifest)")
    return size


def core_metadata(wheel: Path) -> bytes:
    """The wheel's `<name>-<version>.dist-info/METADATA` (PEP 658 serves it beside the wheel)."""
    name = parse_wheel_filename(wheel.name)[0]
    try:
        with zipfile.ZipFile(wheel) as zf:
            candidates = [
                n
                for n in zf.namelist()
                if n.count("/") == 1
                and n.endswith(".dist-info/METADATA")
                and canonicalize_name(n.split("-", 1)[0]) == canonicalize_name(name)
            ]
            if len(candidates) != 1:
                raise PublishError(f"{wheel.name}: expected one .dist-info/METADATA, found {len(candidates)}")
            return read_member(wheel, zf, candidates[0])
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise PublishError(f"{wheel.name}: not a readable wheel: {exc}") from None


def _requires_python(metadata: bytes) -> str | None:
    from email.parser import BytesParser
    from email.policy import compat32

    value = BytesParser(policy=compat32).parsebytes(metadata).get("Requires-Python")
    return str(value).strip() if value else None


# ---------------------------------------------------------------- pages


def _html(title: str, body: list[str]) -> bytes:
    lines = [
        "<!DOCTYPE html>",
        "<html>",
        "  <head>",
        f'    <meta name="pypi:repository-version" content="{API_VERSION}">',
        f"    <title>{html.escape(title)}</title>",
        "  </head>",
        "  <body>",
        f"    <h1>{html.escape(title)}</h1>",
        *[f"    {b}" for b in body],
        "  </body>",
        "</html>",
        "",
    ]
    return "\n".join(lines).encode("utf-8")


def _json(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode("utf-8")


def project_pages(project: str, records: list[FileRecord]) -> tuple[bytes, bytes]:
    """(HTML, JSON) of one project's page: PEP 503 + 658/714 attributes, PEP 691 + 700 keys."""
    from packaging.version import Version

    records = sorted(records, key=lambda r: (Version(r.version), r.filename))
    links = []
    files = []
    for r in records:
        attrs = [f'href="{quote(r.filename)}#sha256={r.sha256}"']
        if r.requires_python:
            attrs.append(f'data-requires-python="{html.escape(r.requires_python)}"')
        attrs.append(f'data-dist-info-metadata="sha256={r.metadata_sha256}"')
        attrs.append(f'data-core-metadata="sha256={r.metadata_sha256}"')
        if r.yanked is not None:
            attrs.append(f'data-yanked="{html.escape(r.yanked)}"')
        links.append(f"<a {' '.join(attrs)}>{html.escape(r.filename)}</a><br>")
        files.append(
            {
                "filename": r.filename,
                "url": quote(r.filename),
                "hashes": {"sha256": r.sha256},
                "requires-python": r.requires_python,
                "core-metadata": {"sha256": r.metadata_sha256},
                "dist-info-metadata": {"sha256": r.metadata_sha256},
                "size": r.size,
                "upload-time": r.upload_time,
                "yanked": (r.yanked or True) if r.yanked is not None else False,
            }
        )
    versions = sorted({r.version for r in records}, key=Version)
    page = {"meta": {"api-version": API_VERSION}, "name": project, "versions": versions, "files": files}
    return _html(f"Links for {project}", links), _json(page)


def root_pages(projects: Sequence[str]) -> tuple[bytes, bytes]:
    """(HTML, JSON) of a `simple/` root."""
    links = [f'<a href="{quote(p)}/">{html.escape(p)}</a><br>' for p in sorted(projects)]
    page = {"meta": {"api-version": API_VERSION}, "projects": [{"name": p} for p in sorted(projects)]}
    return _html("Simple index", links), _json(page)


def landing_page(variants: Sequence[str]) -> bytes:
    body = [
        "<p>pip install flash-attn (or flash-attn-3) --index-url &lt;this URL&gt;/&lt;variant&gt;/simple</p>",
        "<ul>",
    ]
    body += [
        f'  <li><a href="{quote(v)}/simple/">{html.escape(v)}</a></li>' for v in [ALL, *sorted(variants)]
    ]
    body.append("</ul>")
    return _html("attnforge wheel index", body)


# ---------------------------------------------------------------- the index


class RootPage(Protocol):
    """Writes the root page(s) of a new generation, after its per-variant pages and before the swap."""

    def __call__(self, gen: Path, previous: Path | None, records: dict[str, FileRecord]) -> None: ...


class StaticIndex:
    """A static index at `root` (see the module docstring); `root_page` replaces the landing page."""

    def __init__(self, root: Path, root_page: RootPage | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        self.parent = self.root.parent
        self.lock_path = self.parent / f".{self.root.name}.lock"
        self.gen_prefix = f".{self.root.name}.gen-"
        self.root_page = root_page

    # -- reading

    def current(self) -> Path | None:
        """The directory the index currently is (its generation), or None when there is none yet."""
        if not self.root.exists():
            return None
        if not (self.root / MARKER).is_file():
            if self.root.is_dir() and not any(self.root.iterdir()):
                return None
            raise ConfigurationError(f"{self.root} exists but is not an attnforge index (no {MARKER})")
        return self.root.resolve()

    def records(self, gen: Path | None = None) -> dict[str, FileRecord]:
        """filename -> record of what the index holds."""
        gen = gen if gen is not None else self.current()
        if gen is None:
            return {}
        path = gen / MARKER
        return {f: FileRecord(**r) for f, r in checked_records(path, read_marker(path)["files"]).items()}

    # -- locking

    @contextmanager
    def locked(self, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        """Hold the destination's lock (fcntl.flock, released by the kernel if the process dies)."""
        self.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise PublishError(f"{self.root}: another publish holds {self.lock_path}") from None
                    time.sleep(0.2)
            yield
        finally:
            os.close(fd)

    # -- writing

    def publish(self, bundles: Sequence[Bundle]) -> PublishReport:
        """Add wheels; identical files are a no-op, conflicting ones refuse the whole publish."""
        report = PublishReport(destination=str(self.root))
        with self.locked():
            self._sweep()
            current = self.current()
            records = self.records(current)
            new, unchanged = check_conflicts(
                {f: r.sha256 for f, r in records.items()}, [(b.filename, b.sha256) for b in bundles]
            )
            report.unchanged = unchanged
            refreshed = [
                b for b in bundles if b.filename in unchanged and self._new_checks(current, records, b)
            ]
            if not new and not refreshed:
                report.notes.append("nothing new: the index is unchanged")
                return report
            by_name = {b.filename: b for b in bundles}
            report.generation = self._commit(current, records, [by_name[f] for f in new], report, refreshed)
            report.notes += [f"{b.filename}: its torch checks updated" for b in refreshed]
        return report

    @staticmethod
    def _new_checks(current: Path | None, records: dict[str, FileRecord], b: Bundle) -> bool:
        """Whether a wheel the index already holds brings torch checks the index does not have."""
        mine = [p for p in b.records if p.name == b.filename + TORCH_CHECKS_SUFFIX]
        if not mine or current is None:
            return False
        rec = records[b.filename]
        there = current / rec.variant / "simple" / rec.project / mine[0].name
        return not there.is_file() or there.read_bytes() != mine[0].read_bytes()

    def update(self, change: Callable[[dict[str, FileRecord]], list[str]]) -> PublishReport:
        """Change what the index records about files it holds (yank, unyank) in a new generation.

        `change` edits the records in place and returns the files it changed (none: the index is left as
        it is). Same lock, same atomic swap as `publish`; the files themselves are only hard-linked.
        """
        report = PublishReport(destination=str(self.root))
        with self.locked():
            self._sweep()
            current = self.current()
            records = self.records(current)
            if not change(records):
                report.notes.append("nothing changed: the index is unchanged")
                return report
            report.generation = self._commit(current, records, [], report)
        return report

    def _commit(
        self,
        current: Path | None,
        records: dict[str, FileRecord],
        bundles: Sequence[Bundle],
        report: PublishReport,
        refreshed: Sequence[Bundle] = (),
    ) -> str:
        """Write a new generation from `records` plus `bundles` and swap it in; returns its name. `refreshed`:
        wheels the index keeps whose torch checks are replaced."""
        gen = (
            self.parent
            / f"{self.gen_prefix}{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        gen.mkdir()
        try:
            self._fill(gen, current, records, bundles, report)
            for b in refreshed:
                rec = records[b.filename]
                for path in (p for p in b.records if p.name == b.filename + TORCH_CHECKS_SUFFIX):
                    for v in (rec.variant, ALL):
                        dst = gen / v / "simple" / rec.project / path.name
                        dst.unlink(missing_ok=True)  # a hard link to the previous generation's copy
                        _write(dst, path.read_bytes())
            if refreshed and self.root_page is not None:
                self.root_page(gen, current, records)
            self._swap(gen)
        except BaseException:
            shutil.rmtree(gen, ignore_errors=True)
            raise
        self._sweep()
        return gen.name

    def _fill(
        self,
        gen: Path,
        current: Path | None,
        records: dict[str, FileRecord],
        bundles: Sequence[Bundle],
        report: PublishReport,
    ) -> None:
        """Write the new generation: kept files hard-linked, new files copied and checked, pages regenerated."""
        suffixes = ("", ".metadata", ".manifest.json")
        for rec in records.values():
            assert current is not None
            for sfx in (*suffixes, *RECORD_SUFFIXES):
                for v in (rec.variant, ALL):
                    rel = Path(v, "simple", rec.project, rec.filename + sfx)
                    if sfx in suffixes or (current / rel).is_file():
                        _link_or_copy(current / rel, gen / rel)
        for b in bundles:
            variant = b.variant
            if variant == ALL or not safe_variant(variant):
                raise PublishError(f"{b.filename}: invalid variant name {variant!r}")
            home = gen / variant / "simple" / b.project
            size = _copy_verified(b.wheel, home / b.filename, b.sha256)
            metadata = core_metadata(home / b.filename)
            _write(home / (b.filename + ".metadata"), metadata)
            _write(home / (b.filename + ".manifest.json"), dumps(b.manifest).encode("utf-8"))
            kept = [p.name.removeprefix(b.filename) for p in b.records if p.name.startswith(b.filename)]
            for record in b.records:
                _write(home / record.name, record.read_bytes())
            for sfx in (*suffixes, *kept):
                _link_or_copy(
                    home / (b.filename + sfx), gen / ALL / "simple" / b.project / (b.filename + sfx)
                )
            records[b.filename] = FileRecord(
                filename=b.filename,
                project=b.project,
                version=b.filename.split("-")[1],  # as spelled in the file name (cxx11abiTRUE)
                variant=variant,
                sha256=b.sha256,
                size=size,
                metadata_sha256=hashlib.sha256(metadata).hexdigest(),
                requires_python=_requires_python(metadata),
                upload_time=_now(),
                parity=b.gate,
            )
            report.added.append(b.filename)
            if b.gate == "skipped":
                report.skipped_gate.append(b.filename)
        self._pages(gen, records)
        if self.root_page is not None:
            self.root_page(gen, current, records)
        marker: dict[str, Any] = {"schema": 1, "files": {f: asdict(r) for f, r in sorted(records.items())}}
        if current is not None and current.name.startswith(self.gen_prefix):
            marker["previous"] = current.name
        _write(gen / MARKER, _json(marker))

    @staticmethod
    def _pages(gen: Path, records: dict[str, FileRecord]) -> None:
        groups: dict[str, dict[str, list[FileRecord]]] = {}
        for r in records.values():
            for v in (r.variant, ALL):
                groups.setdefault(v, {}).setdefault(r.project, []).append(r)
        for variant, projects in groups.items():
            simple = gen / variant / "simple"
            root_html, root_json = root_pages(list(projects))
            _write(simple / "index.html", root_html)
            _write(simple / "index.json", root_json)
            for project, recs in projects.items():
                page_html, page_json = project_pages(project, recs)
                _write(simple / project / "index.html", page_html)
                _write(simple / project / "index.json", page_json)
        _write(gen / "index.html", landing_page([v for v in groups if v != ALL]))

    def _swap(self, gen: Path) -> None:
        """Point `root` at `gen` with one rename (a symlink replaced atomically)."""
        if self.root.exists() and not self.root.is_symlink():
            if any(self.root.iterdir()):
                # an index written as a plain directory (by hand or an older tool): move it aside once
                legacy = self.parent / f"{self.gen_prefix}legacy-{secrets.token_hex(3)}"
                os.rename(self.root, legacy)
            else:
                self.root.rmdir()
        tmp_link = self.parent / f".{self.root.name}.link-{os.getpid()}-{secrets.token_hex(3)}"
        os.symlink(gen.name, tmp_link)
        os.replace(tmp_link, self.root)
        dir_fd = os.open(self.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _sweep(self) -> None:
        """Remove generations and temporary links nobody points at (left by failed or killed publishes).

        The current generation and the one before it (for readers still walking it) are kept.
        """
        keep: set[Path] = set()
        if self.root.is_symlink() and (current := self.root.resolve()).is_dir():
            keep.add(current)
            try:
                previous = json.loads((current / MARKER).read_text(encoding="utf-8")).get("previous")
            except (OSError, ValueError):
                previous = None
            if isinstance(previous, str) and previous.startswith(self.gen_prefix) and "/" not in previous:
                keep.add(self.parent / previous)
        for entry in self.parent.iterdir():
            if entry.name.startswith(f".{self.root.name}.link-"):
                entry.unlink(missing_ok=True)
            elif entry.name.startswith(self.gen_prefix) and entry not in keep:
                shutil.rmtree(entry, ignore_errors=True)
