"""Upload to an index server (pypiserver, or anything speaking the upload API) with twine.

All or nothing as far as a server allows: every wheel is checked first (its bytes, its metadata as
twine reads it, and against what the server already holds); then each is uploaded; if one fails,
the files this run uploaded are removed again (pypiserver's `remove_pkg`) and the report says what
is left. The password never appears in a log line or an exception text. The whole conversation runs under
one deadline (`server_deadline`): listings are read within it, each upload runs in a child process
stopped at it, and a redirect to another host (pypiserver's fallback to the public index) is refused.
"""

from __future__ import annotations

import contextlib
import io
import logging
import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urljoin

from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge.core.errors import EnvironmentProblem, PublishError
from attnforge.matrix.destinations import Credentials, redact
from attnforge.publish.index import Bundle, PublishReport, check_conflicts
from attnforge.publish.server_deadline import Deadline, bounded_request, fallback_host
from attnforge.publish.simple_html import sha256_by_name
from attnforge.wheels.wheelio import read_wheel

Log = Callable[[str], None]
ROLLBACK_S = 30.0


class UploadFailed(Exception):
    """An upload the child process reported as failed: the HTTP status when there was one."""

    def __init__(self, status: int | None, text: str) -> None:
        super().__init__(text)
        self.status = status


class ServerPublisher:
    """One upload session to `url` with `creds`."""

    def __init__(self, url: str, creds: Credentials, log: Log, deadline: Deadline | None = None) -> None:
        try:
            import requests
        except ImportError:  # pragma: no cover - twine depends on requests
            raise EnvironmentProblem(
                "requests is not installed", hint="pip install 'attnforge[publish]'"
            ) from None
        self.url = url.rstrip("/") + "/"
        self.creds = creds
        self.log = log
        self.deadline = deadline or Deadline()
        self.session = requests.Session()
        self.session.trust_env = False  # no proxies or netrc credentials picked up from the environment
        if creds.username and creds.password:
            self.session.auth = (creds.username, creds.password)

    def _fail(self, message: str, exc: BaseException | None = None) -> PublishError:
        secrets, user = self.creds.secrets(), self.creds.username
        detail = f": {redact(str(exc), secrets, user)}" if exc is not None else ""
        return PublishError(redact(message, secrets, user) + detail)

    def existing(self, project: str) -> dict[str, str]:
        """filename -> sha256 of what the server lists for `project` ({} when it has none)."""
        import requests

        page = urljoin(self.url, f"simple/{canonicalize_name(project)}/")
        try:
            status, headers, body = bounded_request(
                self.session, "GET", page, self.deadline, headers={"Accept": "text/html"}
            )
        except requests.RequestException as exc:
            raise self._fail(f"index {self.url} unreachable", exc) from None
        elsewhere = fallback_host(page, headers.get("Location")) if 300 <= status < 400 else None
        if elsewhere:
            raise self._fail(
                f"index {self.url} redirects to {elsewhere} for a project it does not hold (pypiserver's "
                "default fallback to the public index); nothing is uploaded or resolved through an index you "
                "did not name: start the server with --disable-fallback"
            )
        if status == 404:
            return {}
        if status in (401, 403):
            raise self._fail(f"index {self.url} refused the credentials (HTTP {status})")
        if status != 200:
            raise self._fail(f"index {self.url}: GET {page} answered HTTP {status}")
        return sha256_by_name(body.decode("utf-8", "replace"))

    def _twine_upload(self, bundle: Bundle) -> None:
        from twine.commands.upload import upload
        from twine.settings import Settings

        settings = Settings(
            repository_url=self.url,
            username=self.creds.username or "",
            password=self.creds.password or "",
            non_interactive=True,
            disable_progress_bar=True,
            config_file="/dev/null",
        )
        out = io.StringIO()
        # twine's own messages ("Retry with --verbose") are for twine's CLI: keep them out of ours
        twine_log = logging.getLogger("twine")
        saved = twine_log.propagate, list(twine_log.handlers)
        twine_log.handlers, twine_log.propagate = [logging.NullHandler()], False
        try:
            with contextlib.redirect_stdout(out):
                upload(settings, [str(bundle.wheel)])
        finally:
            twine_log.propagate, twine_log.handlers = saved[0], saved[1]

    def _upload_within_deadline(self, bundle: Bundle) -> None:
        """`_twine_upload` in a child process stopped at the deadline (twine's requests carry no total
        timeout: a server dripping its answer would hold it forever)."""
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=self._child_upload, args=(bundle, child), daemon=True)
        proc.start()
        child.close()
        try:
            left = self.deadline.left(f"upload of {bundle.filename}")
            if not parent.poll(left):
                raise self.deadline.expired(f"upload of {bundle.filename} to {self.url}")
            outcome = parent.recv()
        except EOFError:
            outcome = ("error", None, f"the upload process ended with code {proc.exitcode}")
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            parent.close()
        if outcome[0] != "ok":
            raise UploadFailed(outcome[1], outcome[2])

    def _child_upload(self, bundle: Bundle, conn: Any) -> None:
        """The child's side: upload, then send ("ok",) or ("error", HTTP status, redacted text)."""
        try:
            self._twine_upload(bundle)
            conn.send(("ok",))
        except BaseException as exc:
            status = getattr(getattr(exc, "response", None), "status_code", None)
            text = redact(str(exc), self.creds.secrets(), self.creds.username)
            conn.send(("error", status, f"{type(exc).__name__}: {text}"))
        finally:
            conn.close()

    def _remove(self, bundle: Bundle) -> bool:
        """pypiserver's `remove_pkg` (every file of name+version); True when the server says done."""
        name, version, _, _ = parse_wheel_filename(bundle.filename)
        try:
            status, _, _ = bounded_request(
                self.session,
                "POST",
                self.url,
                Deadline(ROLLBACK_S, "the rollback's own deadline"),  # runs after the main one ran out too
                data={":action": "remove_pkg", "name": str(name), "version": str(version)},
            )
        except Exception:
            return False
        return status < 300

    def preflight(self, bundles: Sequence[Bundle]) -> tuple[list[Bundle], list[str], set[tuple[str, str]]]:
        """Check everything before uploading anything: returns (to upload, unchanged, versions present)."""
        from twine.package import PackageFile

        existing: dict[str, str] = {}
        for project in sorted({b.project for b in bundles}):
            existing.update(self.existing(project))
        new, unchanged = check_conflicts(existing, [(b.filename, b.sha256) for b in bundles])
        by_name = {b.filename: b for b in bundles}
        for filename in new:
            try:
                read_wheel(by_name[filename].wheel)
                PackageFile.from_filename(str(by_name[filename].wheel), None).metadata_dictionary()
            except Exception as exc:  # twine raises its own and zipfile's errors
                raise self._fail(f"{filename}: not uploadable, nothing was published", exc) from None
        present = set()
        for filename in existing:
            with contextlib.suppress(ValueError):
                name, version, _, _ = parse_wheel_filename(filename)
                present.add((str(canonicalize_name(name)), str(version)))
        return [by_name[f] for f in new], unchanged, present

    def publish(self, bundles: Sequence[Bundle], *, dry_run: bool = False) -> PublishReport:
        """Preflight, then upload each wheel; on a failure roll back what this run uploaded."""
        report = PublishReport(destination=self.url)
        todo, report.unchanged, present = self.preflight(bundles)
        if not todo:
            report.notes.append("nothing new: the server already has every wheel")
            return report
        if dry_run:
            report.notes.append("dry run: would upload " + ", ".join(b.filename for b in todo))
            return report
        done: list[Bundle] = []
        for bundle in todo:
            self.log(f"uploading {bundle.filename}")
            try:
                self._upload_within_deadline(bundle)
            except BaseException as exc:
                kept = self._rollback(done, present)
                status = exc.status if isinstance(exc, UploadFailed) else None
                why = "the credentials were refused" if status in (401, 403) else "upload failed"
                msg = f"{bundle.filename}: {why}" + (f" (HTTP {status})" if status else "")
                cause: BaseException | None = exc if status is None else None
                if isinstance(exc, PublishError):  # the deadline
                    msg, cause = exc.message, None
                msg += (f"; rolled back {len(done)} earlier upload(s)" if not kept and done else "") + (
                    f"; still on the server: {', '.join(kept)}" if kept else ""
                )
                if not done:
                    msg += "; nothing was published"
                raise self._fail(msg, cause) from None
            done.append(bundle)
            if bundle.gate == "skipped":
                report.skipped_gate.append(bundle.filename)
        listed: dict[str, str] = {}
        for project in sorted({b.project for b in done}):
            listed.update(self.existing(project))
        for bundle in done:
            if listed.get(bundle.filename) not in (bundle.sha256, ""):
                raise self._fail(f"{bundle.filename}: uploaded but the server lists other bytes")
            report.added.append(bundle.filename)
        return report

    def _rollback(self, done: list[Bundle], present: set[tuple[str, str]]) -> list[str]:
        """Remove this run's uploads whose version had no file before; returns the files left behind."""
        kept = []
        for bundle in done:
            name, version, _, _ = parse_wheel_filename(bundle.filename)
            if (str(canonicalize_name(name)), str(version)) in present or not self._remove(bundle):
                kept.append(bundle.filename)
        return kept


def publish_to_server(
    url: str,
    creds: Credentials,
    bundles: Sequence[Bundle],
    log: Log,
    *,
    dry_run: bool = False,
    deadline: Deadline | None = None,
) -> PublishReport:
    """Upload `bundles` to the index at `url` (see the module docstring) within `deadline`."""
    return ServerPublisher(url, creds, log, deadline).publish(bundles, dry_run=dry_run)
