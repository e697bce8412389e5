"""Secrets in text: every spelling of a whole secret value replaced by `***`, and secrets too short to be
found safely refused where they are read (a one-letter password would be "found" inside ordinary words:
redacting it garbles every message and spells the password out by its gaps)."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from urllib.parse import quote

from attnforge.core.errors import ConfigurationError

MIN_SECRET_LENGTH = 8
MASK = "***"


def check_secret(value: str, what: str) -> str:
    """`value` when it is long enough to redact safely; else ConfigurationError naming `what` (the variable
    or file it came from), never the value."""
    if len(value) < MIN_SECRET_LENGTH:
        raise ConfigurationError(
            f"{what} holds a secret of {len(value)} character{'s' if len(value) != 1 else ''}: too short to "
            f"keep out of messages safely; use a real one (at least {MIN_SECRET_LENGTH} characters)"
        )
    return value


def spellings(secret: str, username: str | None = None) -> set[str]:
    """The ways a secret shows up in text: as it is, percent-encoded (in a URL), and inside HTTP basic
    auth's base64 (`user:password`) when the user name is known."""
    forms = {secret, quote(secret, safe="")}
    if username:
        forms.add(base64.b64encode(f"{username}:{secret}".encode()).decode())
    return forms


def redact(text: str, secrets: Iterable[str], username: str | None = None) -> str:
    """`text` with every spelling of every secret replaced by `***`, longest first (a secret that contains
    another is replaced whole). A secret shorter than MIN_SECRET_LENGTH is a caller's bug (check_secret
    refuses it where it is read): ValueError, rather than a garbled message."""
    forms: set[str] = set()
    for s in secrets:
        if not s:
            continue
        if len(s) < MIN_SECRET_LENGTH:
            raise ValueError("a secret shorter than MIN_SECRET_LENGTH reached redact(); check_secret() it")
        forms |= spellings(s, username)
    ordered = sorted(forms, key=len, reverse=True)
    while any(form in text for form in ordered):  # a replacement can join pieces into a secret again
        for form in ordered:
            text = text.replace(form, MASK)  # each pass shortens the text: every form is longer than MASK
    return text
