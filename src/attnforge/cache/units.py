"""Sizes (`20G`) and durations (`7d`) as the `cache` command reads and prints them."""

from __future__ import annotations

import re

from attnforge.core.errors import ConfigurationError

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)(ib|b)?", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(text: str, option: str = "--max-size") -> int:
    """Bytes from `20G`, `20GiB` (powers of 1024, like `du -h`), `20GB` (powers of 1000) or `1048576`."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise ConfigurationError(
            f"{option}: cannot read {text!r} as a size",
            hint="e.g. 20G or 20GiB (2^30 bytes each), 20GB (10^9), 500M, 1.5T",
        )
    number, prefix, suffix = match.groups()
    base = 1000 if (suffix or "").lower() == "b" and prefix else 1024
    return int(float(number) * base ** _POWERS[prefix.lower()])


def parse_duration(text: str, option: str = "--older-than") -> float:
    """Seconds from `7d`, `12h`, `90m`, `2w`, `30s` or a sum of them (`1d12h`); a unit is required."""
    compact = text.strip().replace(" ", "")
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ConfigurationError(
            f"{option}: cannot read {text!r} as a duration",
            hint="a number with a unit s, m, h, d or w: 7d, 12h, 1d12h",
        )
    return sum(float(n) * _SECONDS[u.lower()] for n, u in parts)


def format_size(size: float) -> str:
    """`du -h`-style: 512B, 4.0K, 5.4G, 43G."""
    value, unit = float(size), "B"
    for unit in ("B", "K", "M", "G", "T", "P"):
        if value < 1024 or unit == "P":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)}B"
    return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"


def format_age(seconds: float) -> str:
    """45s, 12m, 5h, 3d."""
    seconds = max(0.0, seconds)
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit}"
    return f"{seconds:.0f}s"
