"""Index URLs as secrets may hide in them: one scrubber for every command that takes or reads an index URL
(a command-line option, `$ATTNFORGE_INDEX_URL`, pip's configuration in every form pip accepts).

A URL's user and password (`https://user:pw@host/simple`) are split off for an Authorization header or a
netrc entry and never printed; a secret in the query string (`?token=...`, `?api_key=...`) cannot be passed
on safely and is refused, naming the setting and the parameter, never the value. `redact_urls` is the last
line of defence for any text about to be shown: every `//user:pw@` and secret-named query value in it
becomes `***`.
"""

from __future__ import annotations

import ast
import base64
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from attnforge.core.errors import ConfigurationError
from attnforge.core.secrets import MASK

SECRET_PARAMS = frozenset(
    {"token", "access_token", "auth", "auth_token", "api_key", "apikey", "key", "password", "passwd", "pwd",
     "secret", "sig", "signature", "x-amz-signature", "x-goog-signature", "private_token", "session"}
)  # fmt: skip
# `scheme://user[:password]@` anywhere in a text (a password may hold `@` and `:`: up to the last `@` of the
# authority, which ends at `/`, whitespace or a quote)
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<info>[^/\s'\"<>]*)@")
_QUERY_SECRET = re.compile(
    r"(?P<key>[?&;](?:"
    + "|".join(re.escape(p) for p in sorted(SECRET_PARAMS, key=len, reverse=True))
    + r"))="
    r"(?P<value>[^&;#\s'\"<>]*)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class IndexAuth:
    """An index host's user and password (the password is kept out of repr())."""

    netloc: str  # host[:port] the credentials belong to
    user: str
    password: str

    def __repr__(self) -> str:
        return f"IndexAuth(netloc={self.netloc!r}, user={self.user!r}, password='***')"

    def header(self) -> str:
        """HTTP basic auth's Authorization value."""
        return "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()


def redact_urls(text: str) -> str:
    """`text` with every URL's user and password, and every secret-named query value, replaced by `***`."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['key']}={MASK}", text)


def secret_params(url: str) -> list[str]:
    """The names of the query parameters of `url` that hold a secret (token=, api_key=, ...)."""
    try:
        pairs = parse_qsl(urlsplit(url).query, keep_blank_values=True)
    except ValueError:
        return []
    return sorted({k for k, _ in pairs if k.lower() in SECRET_PARAMS})


def split_auth(url: str, where: str) -> tuple[str, IndexAuth | None]:
    """(`url` without user and password, the credentials it held or None). ConfigurationError naming
    `where` (never the URL) for a URL that hides a secret elsewhere: in its query string, or a second
    credentialed URL run into it (two values of pip's config joined by a newline)."""
    params = secret_params(url)
    if params:
        raise ConfigurationError(
            f"{where}: an index URL with a secret in its query string ({', '.join(params)}=...): it would "
            "show in logs and command lines; give the credentials as user:password in the URL or in a "
            "netrc file instead"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"{where}: not a valid URL: {redact_urls(url)[:200]}") from None
    if any(c.isspace() for c in url) or _USERINFO.search(parts.path + parts.query + parts.fragment):
        raise ConfigurationError(
            f"{where}: several URLs run into one value (one per line or separated by spaces are meant)"
        )
    if not (parts.username or parts.password):
        return url, None
    if not parts.hostname or parts.password is None:
        raise ConfigurationError(f"{where}: an index URL with a user but no password (or no host)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host + (f":{port}" if port else "")
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return clean, IndexAuth(netloc, unquote(parts.username or ""), unquote(parts.password))


def config_values(raw: str) -> list[str]:
    """The URLs one pip setting holds, as `pip config list` prints it (`key='a\\nb'`, a Python repr) or as
    pip.conf spells it (over several lines, or separated by spaces)."""
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        try:
            parsed = ast.literal_eval(value)
            value = parsed if isinstance(parsed, str) else value[1:-1]
        except (ValueError, SyntaxError):
            value = value[1:-1]
    return value.split()
