"""Read matrix.yaml into the schema, turning YAML and validation errors into one-line messages."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from attnforge.core.errors import ConfigurationError
from attnforge.matrix.schema import Matrix

DEFAULT_MATRIX = "matrix.yaml"


def _positions(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], yaml.Mark]) -> None:
    """Map every key path in the YAML tree to where it starts (for error messages)."""
    out[path] = node.start_mark
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            _positions(value_node, path + (key,), out)
            out[path + (key,)] = key_node.start_mark  # errors point at the key, not its value
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _positions(item, path + (i,), out)


def _known_fields(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names allowed at `loc` (the parent of an unknown key), for 'did you mean'."""
    from pydantic import BaseModel

    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            # dict[str, Model] values: the key is a user name, keep the value model
            continue
        annotation = fields[part].annotation
        current = _model_in(annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """Find the pydantic model inside an annotation such as dict[str, M], list[M] or M | None."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _format_loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "<top level>"


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop pydantic's union branch names (e.g. 'list[str]', 'str') from an error location."""
    return tuple(
        p for p in loc if isinstance(p, int) or ("[" not in p and p not in ("str", "int", "bool", "float"))
    )


def parse_matrix(text: str, filename: str = DEFAULT_MATRIX) -> Matrix:
    """Parse and validate matrix text; every problem becomes a ConfigurationError naming file:line:col."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        raise ConfigurationError(f"{where}: invalid YAML: {exc.problem}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"{filename}: expected a mapping at the top level, got {type(data).__name__}"
        )
    positions: dict[tuple[Any, ...], yaml.Mark] = {}
    if node is not None:
        _positions(node, (), positions)
    try:
        return Matrix.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # an unknown key usually explains a missing one next to it (a typo): report it first
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = _clean_loc(tuple(err["loc"]))
        mark = positions.get(loc) or positions.get(loc[:-1]) if loc else None
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        if err["type"] == "extra_forbidden":
            key = str(loc[-1])
            known = _known_fields(Matrix, loc[:-1])
            guess = difflib.get_close_matches(key, known, n=1)
            hint = (
                f"; did you mean '{guess[0]}'?"
                if guess
                else (f"; allowed: {', '.join(known)}" if known else "")
            )
            msg = f"{where}: unknown key '{key}' in {_format_loc(loc[:-1])}{hint}"
        else:
            reason = err["msg"].removeprefix("Value error, ")
            msg = f"{where}: {_format_loc(loc)}: {reason}"
        more = len(exc.errors()) - 1
        if more:
            msg += f" (and {more} more problem{'s' if more > 1 else ''})"
        raise ConfigurationError(msg) from None


def load_matrix(path: str | Path = DEFAULT_MATRIX) -> Matrix:
    """Load matrix.yaml from disk."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigurationError(f"{p}: no such matrix file (pass --matrix PATH)") from None
    except OSError as exc:
        raise ConfigurationError(f"{p}: cannot read: {exc.strerror}") from None
    return parse_matrix(text, str(p))
