"""Publish destinations (matrix.yaml `destinations:`) and their credentials, which never reach a log line.

    destinations:
      local:    {kind: static, path: wheels/index, require_parity: false}
      internal: {kind: pypiserver, url: http://pypi.internal:8080, username_env: ATTNFORGE_INDEX_USER,
                 password_env: ATTNFORGE_INDEX_PASSWORD, require_parity: true, records: /srv/records}

Credentials are named, never written: an environment variable or a file (first line) holds them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.core.index_urls import redact_urls, secret_params
from attnforge.core.secrets import check_secret, redact

__all__ = ["Credentials", "Destination", "ad_hoc", "redact", "resolve_credentials"]

DEFAULT_USER_ENV = "ATTNFORGE_INDEX_USER"
DEFAULT_PASSWORD_ENV = "ATTNFORGE_INDEX_PASSWORD"


class Destination(BaseModel):
    """Where `attnforge publish --to NAME` sends finalized wheels."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["static", "pypiserver", "registry"] = Field(
        description="static: a PEP 503/691 tree on disk; pypiserver: upload with twine; registry: images"
    )
    path: str | None = Field(None, description="static: the index folder (relative to matrix.yaml)")
    url: str | None = Field(None, description="pypiserver: the server's root URL (no credentials in it)")
    username_env: str | None = Field(None, description="environment variable holding the user name")
    password_env: str | None = Field(None, description="environment variable holding the password")
    password_file: str | None = Field(None, description="file whose first line is the password")
    require_parity: bool = Field(False, description="publish only wheels whose manifest has parity.passed")
    records: str | None = Field(
        None,
        description="pypiserver: a folder (relative to matrix.yaml) where publish writes each published "
        "wheel's signed records and manifest as <project>/<wheel><suffix>; serve it over HTTP and give its "
        "URL to `which --verify` / `doctor --verify` as --records-url (a static index serves them beside "
        "the wheels)",
    )

    @model_validator(mode="after")
    def _check(self) -> Destination:
        if self.kind == "static" and not self.path:
            raise ValueError("a 'static' destination needs 'path'")
        if self.kind in ("pypiserver", "registry"):
            if not self.url:
                raise ValueError(f"a '{self.kind}' destination needs 'url'")
            parts = urlsplit(self.url)
            if self.kind == "pypiserver" and parts.scheme not in ("http", "https"):
                raise ValueError(f"url {redact_urls(self.url)!r} must be http:// or https://")
            if parts.username or parts.password or secret_params(self.url):
                raise ValueError(
                    "put credentials in username_env/password_env or password_file, not in the url"
                )
        if self.records and self.kind != "pypiserver":
            raise ValueError(
                f"'records' is for a 'pypiserver' destination: a '{self.kind}' one "
                + ("serves the records beside its wheels" if self.kind == "static" else "holds images")
            )
        if self.password_env and self.password_file:
            raise ValueError("give password_env or password_file, not both")
        return self


@dataclass(frozen=True)
class Credentials:
    """A user name and password; the password is kept out of repr()."""

    username: str | None
    password: str | None = field(repr=False, default=None)

    def secrets(self) -> list[str]:
        return [self.password] if self.password else []


def resolve_credentials(dest: Destination, base: Path) -> Credentials:
    """Read the credentials a destination names; PublishError naming the variable or file, never its value."""
    username = None
    if dest.username_env:
        username = os.environ.get(dest.username_env) or None
        if username is None:
            raise PublishError(f"${dest.username_env} is not set (the destination's username_env)")
    password = None
    if dest.password_env:
        password = os.environ.get(dest.password_env) or None
        if password is None:
            raise PublishError(f"${dest.password_env} is not set (the destination's password_env)")
        check_secret(password, f"${dest.password_env}")
    elif dest.password_file:
        path = Path(dest.password_file).expanduser()
        path = path if path.is_absolute() else base / path
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise PublishError(f"password_file {path}: {exc.strerror or 'unreadable'}") from None
        password = lines[0].strip() if lines and lines[0].strip() else None
        if password is None:
            raise PublishError(f"password_file {path} is empty")
        check_secret(password, f"password_file {path}")
    if password and not username:
        raise PublishError("a password is configured but no username_env")
    return Credentials(username, password)


def ad_hoc(target: str) -> Destination | None:
    """`--to http://host:port` (pypiserver, $ATTNFORGE_INDEX_USER/PASSWORD) or `--to some/folder` (static)."""
    if target.startswith(("http://", "https://")):
        has_user = bool(os.environ.get(DEFAULT_USER_ENV))
        try:
            return Destination(
                kind="pypiserver",
                url=target,
                username_env=DEFAULT_USER_ENV if has_user else None,
                password_env=DEFAULT_PASSWORD_ENV if has_user else None,
            )
        except ValidationError as exc:  # only the message: the input would echo a password in the url
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise ConfigurationError(f"--to: {msg}") from None
    if "/" in target or target.startswith("."):
        return Destination(kind="static", path=target)
    return None
