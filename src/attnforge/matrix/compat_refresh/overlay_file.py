"""Write refreshed rows into the user's compat overlay (compat.overlay.toml): rows with the same key are
replaced, new rows added, the file rewritten atomically (never a file inside the installed package)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from attnforge.builder.files import atomic_write_text
from attnforge.core.errors import ConfigurationError
from attnforge.matrix.compat import ROW_KEYS, merge_overlay

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_OVERLAY = "compat.overlay.toml"
HEADER = (
    "# attnforge compat overlay: rows here replace the packaged rows with the same key, new rows are added.\n"
    "# `attnforge compat refresh --write` rewrites this file (comments are not kept).\n"
)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def render(tables: dict[str, Any]) -> str:
    """TOML text of an overlay: [meta] first, then each table's rows in ROW_KEYS order."""
    parts = [HEADER]
    meta = tables.get("meta") or {}
    if meta:
        parts.append("[meta]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in meta.items()))
    for table in ROW_KEYS:
        for row in tables.get(table, []):
            parts.append(f"[[{table}]]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in row.items()))
    return "\n".join(parts)


def read_overlay(path: Path) -> dict[str, Any]:
    """The overlay's tables (a missing file is an empty overlay)."""
    if not path.exists():
        return {}
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text())
        return data
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"compatibility overlay {path}: {exc}") from None


def write_rows(path: Path, rows: list[tuple[str, dict[str, Any]]]) -> None:
    """Merge (table, row) pairs into the overlay at `path` and rewrite it."""
    current = read_overlay(path)
    if (current.get("meta") or {}).get("standalone") is True:
        current["meta"] = {k: v for k, v in current["meta"].items() if k != "standalone"}
        merged = merge_overlay(current, _as_tables(rows), str(path))
        merged["meta"]["standalone"] = True
    else:
        merged = merge_overlay(current, _as_tables(rows), str(path))
    atomic_write_text(path, render(merged))


def _as_tables(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, list[dict[str, Any]]] = {}
    for table, row in rows:
        out.setdefault(table, []).append(row)
    return out
