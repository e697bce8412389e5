"""A small deterministic YAML writer: insertion order kept, scalars quoted only when needed, comments.

PyYAML cannot write comments and quotes GitHub's `on:` key; workflows read better with both right.
Every value this writes reads back (yaml.safe_load) as the same data; the tests check that.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True, eq=False)
class Comment:
    """A mapping key that writes `# text` lines at its place (its value is ignored)."""

    text: str
    blank_before: bool = False


@dataclass(frozen=True)
class Literal:
    """A string written verbatim as the key (e.g. GitHub's `on`, which YAML 1.1 reads as a bool)."""

    text: str


def _plain_ok(text: str) -> bool:
    if not text or text != text.strip() or "\n" in text or text.startswith(("'", '"', "{", "[", "#")):
        return False
    if ": " in text or " #" in text or text.endswith(":"):
        return False
    try:
        return bool(yaml.safe_load(text) == text)
    except yaml.YAMLError:
        return False


def scalar(value: Any) -> str:
    """One scalar: bools and numbers as YAML writes them, strings plain when that reads back the same."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if _plain_ok(text):
        return text
    if "\n" not in text and all(ch.isprintable() for ch in text):
        return "'" + text.replace("'", "''") + "'"
    return json.dumps(text)


def _key(key: Any) -> str:
    return key.text if isinstance(key, Literal) else scalar(key)


def _is_block_string(value: Any) -> bool:
    return isinstance(value, str) and "\n" in value.rstrip("\n")


def _block(value: str, indent: int) -> list[str]:
    pad = " " * indent
    chomp = "" if value.endswith("\n") and not value.endswith("\n\n") else "-"
    body = value[:-1] if value.endswith("\n") else value
    return [f"|{chomp}"] + [f"{pad}{line}" if line else "" for line in body.split("\n")]


def _emit(value: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, Comment):
                if key.blank_before:
                    out.append("")
                if key.text:
                    out.extend(f"{pad}# {line}".rstrip() for line in key.text.split("\n"))
                continue
            _emit_pair(_key(key), item, indent, out)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for item in value:
            _emit_item(item, indent, out)
    else:  # pragma: no cover - callers pass containers
        out.append(pad + scalar(value))


def _emit_pair(key: str, item: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if _is_block_string(item):
        lines = _block(item, indent + 2)
        out.append(f"{pad}{key}: {lines[0]}")
        out.extend(lines[1:])
    elif isinstance(item, Mapping) and item:
        out.append(f"{pad}{key}:")
        _emit(item, indent + 2, out)
    elif isinstance(item, Sequence) and not isinstance(item, str) and item:
        if all(not isinstance(i, (Mapping, list, tuple)) for i in item) and len(item) <= 8:
            out.append(f"{pad}{key}: [{', '.join(_flow(i) for i in item)}]")
        else:
            out.append(f"{pad}{key}:")
            _emit(item, indent + 2, out)
    elif isinstance(item, Mapping):
        out.append(f"{pad}{key}: {{}}")
    elif isinstance(item, Sequence) and not isinstance(item, str):
        out.append(f"{pad}{key}: []")
    else:
        out.append(f"{pad}{key}: {scalar(item)}")


def _flow(value: Any) -> str:
    """A scalar inside [a, b]: commas and brackets need quotes there too."""
    text = scalar(value)
    if isinstance(value, str) and text == value and any(ch in value for ch in ",[]{}"):
        return "'" + value.replace("'", "''") + "'"
    return text


def _emit_item(item: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(item, Mapping) and item:
        sub: list[str] = []
        _emit(item, indent + 2, sub)
        first = next(i for i, line in enumerate(sub) if not line.lstrip().startswith("#") and line.strip())
        out.extend(pad + line.lstrip() if line.strip() else line for line in sub[:first])
        out.append(pad + "- " + sub[first][indent + 2 :])
        out.extend(sub[first + 1 :])
    elif _is_block_string(item):
        lines = _block(item, indent + 2)
        out.append(f"{pad}- {lines[0]}")
        out.extend(lines[1:])
    elif isinstance(item, (Mapping, list, tuple)):
        out.append(f"{pad}- {'{}' if isinstance(item, Mapping) else '[]'}")
    else:
        out.append(f"{pad}- {scalar(item)}")


def dump(data: Mapping[Any, Any], header: str = "") -> str:
    """The YAML text of `data` (a mapping), with `header` as leading comment lines."""
    out: list[str] = [f"# {line}".rstrip() for line in header.splitlines()] if header else []
    top: list[str] = []
    _emit(data, 0, top)
    # a blank line before each top-level section (and its leading comments) reads better and is stable
    starts: set[int] = set()
    for i, line in enumerate(top):
        if line and not line.startswith((" ", "#", "-")):
            j = i
            while j > 0 and top[j - 1].startswith("#"):
                j -= 1
            starts.add(j)
    for i, line in enumerate(top):
        if i in starts and i and top[i - 1].strip():
            out.append("")
        out.append(line)
    return "\n".join(out).rstrip("\n") + "\n"


class _NoBoolOnLoader(yaml.SafeLoader):
    """SafeLoader that reads `on`/`off`/`yes`/`no` as strings (YAML 1.2, as GitHub does)."""


_NoBoolOnLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.copy().items()
}
_NoBoolOnLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|false)$"), list("tf"))


def load(text: str) -> Any:
    """Read workflow YAML the way GitHub does (only true/false are booleans)."""
    return yaml.load(text, Loader=_NoBoolOnLoader)
