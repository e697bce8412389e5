"""Index credentials for pip inside builds: taken out of index URLs and handed to pip as a netrc file.

pip reads the file named by `$NETRC` (its vendored requests does), so a build's index URLs carry no user
or password: nothing secret reaches a command line (`ps`), `spec.json`, a build log, the venv's marker or an
image layer. The docker backend mounts the file read-only at /run/secrets/pip_netrc, `images build` passes it
as the BuildKit secret `pip_netrc`. Credentials come from `build.pip.netrc` (a netrc file the user keeps) and
from this machine's pip configuration, whose credentialed URLs are scrubbed into netrc entries.
"""

from __future__ import annotations

import atexit
import netrc
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from attnforge.core.errors import ConfigurationError
from attnforge.core.index_urls import split_auth
from attnforge.core.secrets import check_secret

CONTAINER_NETRC = "/run/secrets/pip_netrc"
NETRC_HINT = (
    "put the credentials in a netrc file (`machine HOST login USER password PASSWORD`, mode 600) and name it "
    "in build.pip.netrc: pip reads it inside the build, so no command line, spec.json, log or image layer "
    "holds them"
)


@dataclass(frozen=True)
class IndexLogin:
    """One index host's credentials, as a netrc `machine` entry (the password is kept out of repr())."""

    host: str
    login: str
    password: str

    def __repr__(self) -> str:
        return f"IndexLogin(host={self.host!r}, login={self.login!r}, password='***')"

    def netrc_line(self) -> str:
        for word in (self.host, self.login, self.password):
            if not word or any(c.isspace() or c in "\"'#" for c in word):
                raise ConfigurationError(
                    f"the credentials of index host {self.host}: a user or password with spaces, quotes or "
                    f"'#' cannot go into a netrc; {NETRC_HINT}"
                )
        return f"machine {self.host} login {self.login} password {self.password}"


def has_credentials(url: str) -> bool:
    """Whether `url` carries a user or password (`https://user:pw@host/...`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return bool(parts.username or parts.password)


def scrub(url: str, where: str) -> tuple[str, IndexLogin | None]:
    """(the URL without its user and password, the netrc entry they make, or None when it had none), by
    `core.index_urls.split_auth` (a query-string secret or URLs run together are refused).

    `where` names the setting for errors (never the URL, which holds the secret)."""
    try:
        clean, auth = split_auth(url, where)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc.message}; {NETRC_HINT}") from None
    if auth is None:
        return clean, None
    if not auth.user:
        raise ConfigurationError(f"{where}: an index URL with a password but no user; {NETRC_HINT}")
    check_secret(auth.password, where)
    return clean, IndexLogin(urlsplit(clean).hostname or auth.netloc, auth.user, auth.password)


def check_netrc(path: Path, where: str) -> Path:
    """`path` when it is a readable netrc; ConfigurationError naming `where` and the line at fault (never
    its text: it holds passwords)."""
    if not path.is_file():
        raise ConfigurationError(f"{where}: {path} is not a file")
    try:
        netrc.netrc(str(path))
    except netrc.NetrcParseError as exc:
        raise ConfigurationError(f"{where}: {path} line {exc.lineno} is not valid netrc syntax") from None
    except OSError as exc:
        raise ConfigurationError(f"{where}: cannot read {path}: {exc.strerror}") from None
    return path


class NetrcFile:
    """The netrc a build hands pip: the user's own file as it is when nothing was scrubbed, else a private
    copy (mode 600, in a folder of mode 700, removed by `close()` or when the process ends) holding the
    scrubbed entries followed by the user's file (whose entries then win)."""

    def __init__(self, logins: list[IndexLogin], user_file: Path | None) -> None:
        self.logins = logins
        self.user_file = user_file
        self._path: Path | None = None

    def path(self) -> Path | None:
        """The file to give pip, written on first use; None when there are no credentials at all."""
        if not self.logins:
            return self.user_file
        if self._path is None:
            folder = Path(tempfile.mkdtemp(prefix="attnforge-netrc-"))
            atexit.register(shutil.rmtree, folder, True)
            lines = [login.netrc_line() for login in self.logins]
            if self.user_file is not None:
                lines.append(self.user_file.read_text(encoding="utf-8").rstrip("\n"))
            target = folder / "netrc"
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
            self._path = target
        return self._path

    def close(self) -> None:
        """Remove the private copy now (the user's own file is never touched)."""
        if self._path is not None:
            shutil.rmtree(self._path.parent, ignore_errors=True)
        self._path = None
