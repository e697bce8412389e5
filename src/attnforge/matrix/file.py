"""Read matrix.yaml into the schema, turning YAML and validation errors into one-line messages: within
bounds (matrix/yaml_bounds.py), every problem at its file:line:col, undeclared kernels and profiles included."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from attnforge.core.errors import ConfigurationError
from attnforge.matrix.fa4_cells import KERNEL as FA4_KERNEL
from attnforge.matrix.schema import Matrix
from attnforge.matrix.yaml_bounds import LIMITS, Limits, check_size, load_bounded, where

DEFAULT_MATRIX = "matrix.yaml"


def _positions(root: yaml.Node) -> dict[tuple[Any, ...], yaml.Mark]:
    """Map every key path in the YAML tree to where it starts (for error messages).

    Iterative, and aliases are not expanded: a node met a second time (an alias) gets its own position but
    is not walked again, so the work is linear in the size of the file.
    """
    out: dict[tuple[Any, ...], yaml.Mark] = {}
    seen: set[int] = set()
    todo: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())]
    while todo:
        node, path = todo.pop()
        out.setdefault(path, node.start_mark)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = key_node.value
                out[path + (key,)] = key_node.start_mark  # errors point at the key, not its value
                todo.append((value_node, path + (key,)))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                todo.append((item, path + (i,)))
    return out


def _mark_of(positions: dict[tuple[Any, ...], yaml.Mark], loc: tuple[Any, ...]) -> yaml.Mark | None:
    """The position of `loc`, else of its nearest ancestor in the file (a default value has none)."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in positions:
            return positions[loc[:n]]
    return None


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


def parse_matrix(text: str, filename: str = DEFAULT_MATRIX, limits: Limits = LIMITS) -> Matrix:
    """Parse and validate matrix text; every problem becomes a ConfigurationError naming file:line:col.

    The document is checked against `limits` (bytes, nesting, aliases, nodes once aliases are expanded)
    before anything is built from it."""
    try:
        node, data = load_bounded(text, filename, limits)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise ConfigurationError(f"{where(filename, mark)}: invalid YAML: {exc.problem}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (control characters)
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        what = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        raise ConfigurationError(
            f"{filename}:{line}:{column}: invalid YAML: unacceptable character {what}: {exc.reason}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"{filename}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError(_validation_message(exc, node, filename, text)) from None
    problem = undeclared_reference(matrix)
    if problem is not None:
        loc, message = problem
        mark = _mark_of(_positions(node), loc) if node is not None else None
        raise ConfigurationError(f"{where(filename, mark)}: {_format_loc(loc)}: {message}")
    return matrix


def _unquoted_number_hint(err: Any, mark: yaml.Mark | None, text: str) -> str:
    """For a number where a string belongs (`python: [3.10]`): YAML read it as a number; say to quote it."""
    value = err.get("input")
    if err["type"] != "string_type" or isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    token = (
        re.match(r"[^\s,\]\}#]+", text[mark.index :]) if mark is not None and mark.index < len(text) else None
    )
    written = token.group(0) if token else str(value)
    return f"; YAML reads the unquoted {written} as the number {value!r}: quote it ('{written}')"


def _validation_message(exc: ValidationError, node: yaml.Node | None, filename: str, text: str = "") -> str:
    """One line for pydantic's errors: the first unknown key (it usually explains a missing one next to it,
    a typo), else the first error, at its file:line:col."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    raw = tuple(err["loc"])
    if err["type"] == "extra_forbidden" and raw:  # the last part is the user's own key, brackets and all
        loc = (*_clean_loc(raw[:-1]), raw[-1])
    else:
        loc = _clean_loc(raw) or raw
    mark = _mark_of(_positions(node), loc) if node is not None and loc else None
    at = where(filename, mark)
    if err["type"] == "extra_forbidden":
        key = str(loc[-1])
        known = _known_fields(Matrix, loc[:-1])
        guess = difflib.get_close_matches(key, known, n=1)
        hint = (
            f"; did you mean '{guess[0]}'?" if guess else (f"; allowed: {', '.join(known)}" if known else "")
        )
        msg = f"{at}: unknown key '{key}' in {_format_loc(loc[:-1])}{hint}"
    else:
        reason = err["msg"].removeprefix("Value error, ")
        msg = f"{at}: {_format_loc(loc)}: {reason}{_unquoted_number_hint(err, mark, text)}"
    more = len(errors) - 1
    if more:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return msg


def undeclared_reference(matrix: Matrix) -> tuple[tuple[Any, ...], str] | None:
    """(where, why) for the first kernel or profile a target or `defaults` names but the file does not
    declare, so the error points at the line that names it; None when every name is declared."""
    declared = {
        "kernel": [*matrix.kernels, *([FA4_KERNEL] if matrix.fa4 else [])],
        "profile": list(matrix.profiles),
    }
    uses: list[tuple[tuple[Any, ...], str, Any]] = []
    for axis in declared:  # a default matters only where a target's matrix leaves the axis out
        if any(getattr(t.matrix, axis) is None for t in matrix.targets.values()):
            uses.append((("defaults", axis), axis, getattr(matrix.defaults, axis)))
    for name, target in matrix.targets.items():
        for axis in declared:
            for i, value in enumerate(getattr(target.matrix, axis) or []):
                uses.append((("targets", name, "matrix", axis, i), axis, value))
            for kind in ("include", "exclude"):
                for i, entry in enumerate(getattr(target, kind)):
                    uses.append((("targets", name, kind, i, axis), axis, getattr(entry, axis)))
    for loc, axis, value in uses:
        if value is None or value in declared[axis]:
            continue
        names = declared[axis]
        guess = difflib.get_close_matches(str(value), names, n=1)
        hint = f"; did you mean '{guess[0]}'?" if guess else f"; declared: {', '.join(names)}"
        if value == FA4_KERNEL:
            return (
                loc,
                f"kernel '{value}' needs the top-level 'fa4' section (its stack; `attnforge docs fa4`)",
            )
        return loc, f"{axis} '{value}' is not declared under '{axis}s'{hint}"
    return None


def load_matrix(path: str | Path = DEFAULT_MATRIX, limits: Limits = LIMITS) -> Matrix:
    """Load matrix.yaml from disk (a file over `limits.max_bytes` is refused before it is read)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            check_size(os.fstat(fh.fileno()).st_size, str(p), limits)
            raw = fh.read(limits.max_bytes + 1)
    except FileNotFoundError:
        raise ConfigurationError(f"{p}: no such matrix file (pass --matrix PATH)") from None
    except OSError as exc:
        raise ConfigurationError(f"{p}: cannot read: {exc.strerror}") from None
    check_size(len(raw), str(p), limits)  # a pipe or a file that grew while it was read
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    return parse_matrix(text, str(p), limits)
