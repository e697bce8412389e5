"""Push an image set all-or-nothing: every tag lands, or the registry is put back as it was.

Before pushing, the manifest each tag has in the registry (if any) is saved. Tags are pushed immutable
ones first, moving aliases last. If any push fails, every tag already pushed is rolled back through the
registry API: a tag that existed gets its old manifest back (PUT), a new one is removed by deleting the
manifest it points at (DELETE needs `storage.delete.enabled: true`), re-putting any other tag that shared
that digest. Layers (blobs) stay until the registry's garbage collection. The report says what happened.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from attnforge.core.docker_cli import Docker, docker_executable, pushed_digest
from attnforge.core.errors import PublishError
from attnforge.images.record import ImageSet
from attnforge.images.registry import Manifest, Registry, RegistryAuthError

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass
class PushReport:
    """What a push did: tags pushed (with digests), and what a rollback undid."""

    registry: str
    repository: str
    pushed: list[tuple[str, str]] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: str | None = None
    error: str = ""
    restored: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)
    rollback_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed is None

    def lines(self) -> list[str]:
        out = [f"registry {self.registry}, repository {self.repository}"]
        out += [f"  pushed   {t}  {d}" for t, d in self.pushed]
        if self.failed:
            out.append(f"  FAILED   {self.failed}: {self.error}")
            out += [f"  restored {t} -> {d} (its previous manifest)" for t, d in self.restored]
            out += [f"  removed  {t} (deleted manifest {d})" for t, d in self.deleted]
            out += [f"  rollback problem: {p}" for p in self.rollback_problems]
            state = (
                "rolled back: the registry holds what it held before"
                if not self.rollback_problems
                else ("rollback INCOMPLETE: see the problems above")
            )
            out.append(f"  {state} (layers stay until the registry's garbage collection)")
        else:
            out.append(f"  all {len(self.pushed)} tags pushed")
        return out


def rollback(
    reg: Registry, repo: str, report: PushReport, before: dict[str, Manifest | None], log: Log
) -> None:
    """Undo the pushed tags of report (newest first); problems are collected, not raised."""
    to_delete: dict[str, list[str]] = {}
    for tag, digest in reversed(report.pushed):
        old = before.get(tag)
        try:
            if old is not None and old.digest == digest:
                continue
            if old is not None:
                reg.put_manifest(repo, tag, old)
                report.restored.append((tag, old.digest))
                log(f"rollback: {tag} restored to {old.digest[:19]}")
            else:
                to_delete.setdefault(digest, []).append(tag)
        except PublishError as exc:
            report.rollback_problems.append(f"{tag}: {exc}")
    for digest, tags in to_delete.items():
        try:
            keep: dict[str, Manifest] = {}
            for other in reg.tags(repo):
                if other in tags:
                    continue
                m = reg.get_manifest(repo, other)
                if m is not None and m.digest == digest:
                    keep[other] = m
            reg.delete_manifest(repo, digest)
            for tag in tags:
                report.deleted.append((tag, digest))
                log(f"rollback: {tag} removed ({digest[:19]})")
            for other, m in keep.items():
                reg.put_manifest(repo, other, m)
                log(f"rollback: {other} shared {digest[:19]}; put back")
        except PublishError as exc:
            report.rollback_problems.append(f"{', '.join(tags)}: {exc}")


def push_set(
    images: ImageSet,
    registry: str,
    *,
    username: str | None,
    password: str | None,
    repository: str | None = None,
    docker: str | None = None,
    log: Log = _quiet,
    hook: Callable[[str], None] | None = None,
) -> PushReport:
    """Push every tag of images to registry/repository; all or nothing (see the module docstring).

    `hook(tag)` runs just before each tag's push (progress display; tests inject failures with it).
    Raises PublishError (exit 7) with the report's lines when anything failed.
    """
    reg = Registry(registry, username, password)
    repo = repository or images.repository
    report = PushReport(reg.host, repo)
    if not images.images:
        raise PublishError("the image set is empty: nothing to push")
    try:
        reg.ping()
    except RegistryAuthError as exc:
        raise PublishError(f"{exc}; nothing was pushed") from None
    secrets = [password] if password else []
    with Docker(docker or docker_executable(), private_config=True, secrets=secrets) as dk:
        if username and password:
            res = dk.login(reg.host, username, password)
            if not res.ok:
                raise PublishError(
                    f"docker login to {reg.host} as {username!r} failed: {res.tail(2)}; nothing was pushed"
                )
        missing = [
            images.local_ref(i.tag) for i in images.images if dk.image_id(images.local_ref(i.tag)) is None
        ]
        if missing:
            raise PublishError(f"local images missing: {', '.join(missing)}; nothing was pushed")
        before = {tag: reg.get_manifest(repo, tag) for tag, _ in images.tags()}
        remote_refs: list[str] = []
        for tag, img in images.tags():
            remote = f"{reg.host}/{repo}:{tag}"
            if hook:
                hook(tag)
            log(f"push {remote}")
            res = dk.tag(images.local_ref(img.tag), remote)
            if res.ok:
                remote_refs.append(remote)
                res = dk.push(remote)
            digest = pushed_digest(res.output) if res.ok else None
            if not res.ok or digest is None:
                report.failed = tag
                report.error = res.tail(3) if not res.ok else "docker push printed no digest"
                break
            report.pushed.append((tag, digest))
        if report.failed is None:
            for tag, digest in report.pushed:  # the registry must now say what we pushed
                have = reg.digest(repo, tag)
                if have != digest:
                    report.failed, report.error = tag, f"registry has {have} after pushing {digest}"
                    break
        if report.failed is not None:
            rollback(reg, repo, report, before, log)
        for remote in remote_refs:
            dk.rmi(remote)
    if not report.ok:
        raise PublishError("push failed, rolled back:\n" + "\n".join(report.lines()))
    return report
