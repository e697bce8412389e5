"""Whether the installed wheel was yanked from its index since it was installed (PEP 592), for `doctor`.

The index's PEP 691 project page is read as `which` reads it (`index_fetch`: bounded, failures named); the
installed distribution's version names the file (attnforge's local versions name the variant and profile),
and among that version's files the one for this interpreter's Python tags is the installed one.
"""

from __future__ import annotations

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from attnforge.client.doctor_check import Check
from attnforge.client.index_fetch import IndexReader
from attnforge.client.which import fetch_project, yanked_files
from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.engine.environment import Env, interpreter_abis

NAME = "yanked"


def _same_version(filename: str, installed: Version) -> bool:
    try:
        return parse_wheel_filename(filename)[1] == installed
    except (InvalidWheelFilename, InvalidVersion):
        return False


def _fits_python(filename: str, env: Env) -> bool:
    accepted = interpreter_abis(env.python)
    return any((t.interpreter, t.abi) in accepted for t in parse_wheel_filename(filename)[3])


def yank_check(
    index_url: str, project: str, installed_version: str, env: Env, reader: IndexReader | None = None
) -> Check:
    """`warn` when the installed version's file is yanked in the index at `index_url`, `ok` when it is
    offered, `skip` when the index cannot be read (within `reader`'s budget; why, with the URL) or does not
    hold that version."""
    try:
        installed = Version(installed_version)
    except InvalidVersion:
        return Check(NAME, "skip", f"installed version {installed_version!r} is not a PEP 440 version")
    try:
        _, page = fetch_project(index_url, project, reader or IndexReader())
    except (ConfigurationError, EnvironmentProblem) as exc:
        return Check(NAME, "skip", f"index not readable: {exc}")
    files = [
        f["filename"] for f in page["files"] if isinstance(f, dict) and isinstance(f.get("filename"), str)
    ]
    same = [f for f in files if f.endswith(".whl") and _same_version(f, installed)]
    mine = [f for f in same if _fits_python(f, env)] or same
    if not mine:
        return Check(NAME, "skip", f"{project} {installed_version} is not in the index at {index_url}")
    yanked = yanked_files(page)
    withdrawn = [f for f in mine if f in yanked]
    if withdrawn:
        reason = yanked[withdrawn[0]] or "no reason given"
        return Check(
            NAME,
            "warn",
            f"{withdrawn[0]} was yanked from {index_url}: {reason}; "
            f"`attnforge which --index-url {index_url}` names the wheel to install instead",
        )
    return Check(NAME, "ok", f"{mine[0]} is offered by {index_url} (not yanked)")
