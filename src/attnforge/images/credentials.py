"""Registry credentials: a user name, and a password from an env var or a file (never a CLI argument)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from attnforge.core.errors import ConfigurationError
from attnforge.core.secrets import check_secret

USER_ENV = "ATTNFORGE_REGISTRY_USER"
PASSWORD_ENV = "ATTNFORGE_REGISTRY_PASSWORD"


@dataclass(frozen=True)
class Credentials:
    """username None = anonymous."""

    username: str | None
    password: str | None = None

    def __repr__(self) -> str:  # never print the password
        return f"Credentials(username={self.username!r}, password={'***' if self.password else None})"


def resolve_credentials(
    username: str | None, password_env: str | None, password_file: Path | None
) -> Credentials:
    """--username (or $ATTNFORGE_REGISTRY_USER) with the password from --password-file or the env var
    named by --password-env (default $ATTNFORGE_REGISTRY_PASSWORD)."""
    user = username or os.environ.get(USER_ENV) or None
    password: str | None = None
    if password_file is not None:
        try:
            password = password_file.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the password file {password_file}: {exc.strerror}"
            ) from None
    else:
        env = password_env or PASSWORD_ENV
        password = os.environ.get(env) or None
        if password_env and password is None and user:
            raise ConfigurationError(f"--password-env {password_env}: that environment variable is not set")
    if user and not password:
        raise ConfigurationError(
            f"a registry user ({user}) but no password: set ${password_env or PASSWORD_ENV} or give --password-file"
        )
    if password and not user:
        raise ConfigurationError(f"a registry password but no user: give --username or set ${USER_ENV}")
    if password:
        check_secret(password, str(password_file) if password_file else f"${password_env or PASSWORD_ENV}")
    return Credentials(user, password)
