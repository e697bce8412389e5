"""YAML read within bounds: size, nesting, aliases and the node count after alias expansion are checked on
the parser's event stream before any node or Python object is built, so an alias bomb or an oversize
document is refused in milliseconds instead of exhausting memory. Duplicate mapping keys (YAML keeps the last
one silently) are refused too. Every refusal is a ConfigurationError naming file:line:col and the limit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from attnforge.core.errors import ConfigurationError

# The C parser when PyYAML was built with libyaml (same events and marks, about 10x faster).
SafeLoader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Limits:
    """What a matrix file may hold. The shipped matrix.yaml is about 8 KB and 700 nodes."""

    max_bytes: int = 1024 * 1024
    max_depth: int = 64
    max_aliases: int = 1000
    max_number_chars: int = 100  # a numeric scalar: 10**99 is beyond any count or version a matrix holds
    max_nodes: int = 100_000  # scalars + sequences + mappings, every alias counted as what it expands to


LIMITS = Limits()


def where(filename: str, mark: Any) -> str:
    """`file:line:col` of a YAML mark (1-based), or the file name alone."""
    return f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark is not None else filename


def check_size(size: int, filename: str, limits: Limits = LIMITS) -> None:
    """Refuse a document larger than `limits.max_bytes` before it is read or parsed."""
    if size > limits.max_bytes:
        raise ConfigurationError(
            f"{filename}: {size:,} bytes is more than a matrix file may hold "
            f"(limit max_bytes = {limits.max_bytes:,} bytes)"
        )


@dataclass
class _Frame:
    """An open sequence or mapping while its events stream by."""

    anchor: str | None
    is_mapping: bool
    nodes: int = 1  # itself, then what it holds (aliases expanded)
    children: int = 0
    keys: dict[str, Any] = field(default_factory=dict)  # scalar key -> its mark (mappings only)


def check_events(text: str, filename: str, limits: Limits = LIMITS) -> None:
    """Walk the event stream once and refuse what would be too large or ambiguous once composed.

    Counts nodes as if every alias were expanded (an anchor's size is known when it closes), so a bomb of
    nine aliases nine levels deep is refused at the alias that crosses `max_nodes`, without expanding it.
    YAML syntax errors are left to the composer, which reports them with their position.
    """
    check_size(len(text.encode("utf-8")), filename, limits)
    sizes: dict[str, int] = {}  # anchor -> expanded node count of what it names
    stack: list[_Frame] = []
    open_anchors: set[str] = set()
    total = aliases = 0
    try:
        for event in yaml.parse(text, Loader=SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > limits.max_aliases:
                    raise ConfigurationError(
                        f"{where(filename, event.start_mark)}: more than {limits.max_aliases:,} aliases "
                        f"(limit max_aliases = {limits.max_aliases:,})"
                    )
                if event.anchor in open_anchors:
                    raise ConfigurationError(
                        f"{where(filename, event.start_mark)}: alias *{event.anchor} refers to a node that "
                        "contains it (a recursive alias)"
                    )
                size = sizes.get(event.anchor or "", 1)  # an undefined alias: the composer names it
                total = _add(stack, size, total, event, filename, limits)
            elif isinstance(event, yaml.ScalarEvent):
                _number(event, filename, limits)
                if stack and stack[-1].is_mapping and stack[-1].children % 2 == 0:
                    _key(stack[-1], event, filename)
                if event.anchor is not None:
                    sizes[event.anchor] = 1
                total = _add(stack, 1, total, event, filename, limits)
            elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(stack) >= limits.max_depth:
                    raise ConfigurationError(
                        f"{where(filename, event.start_mark)}: nested more than {limits.max_depth} levels deep "
                        f"(limit max_depth = {limits.max_depth})"
                    )
                total += 1
                _check_total(total, event, filename, limits)
                stack.append(_Frame(event.anchor, isinstance(event, yaml.MappingStartEvent)))
                if event.anchor is not None:
                    open_anchors.add(event.anchor)
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                frame = stack.pop()
                if frame.anchor is not None:
                    sizes[frame.anchor] = frame.nodes
                    open_anchors.discard(frame.anchor)
                if stack:
                    stack[-1].nodes += frame.nodes
                    stack[-1].children += 1
    except yaml.YAMLError:
        return  # the composer reports it with file:line:col


def _add(stack: list[_Frame], size: int, total: int, event: Any, filename: str, limits: Limits) -> int:
    """Count a scalar or an expanded alias into the open collection and the document's total."""
    if stack:
        stack[-1].nodes += size
        stack[-1].children += 1
    total += size
    _check_total(total, event, filename, limits)
    return total


def _check_total(total: int, event: Any, filename: str, limits: Limits) -> None:
    if total > limits.max_nodes:
        alias = isinstance(event, yaml.AliasEvent)
        raise ConfigurationError(
            f"{where(filename, event.start_mark)}: the document grows past {limits.max_nodes:,} nodes"
            + (f" at alias *{event.anchor} (an alias bomb?)" if alias else "")
            + f" (limit max_nodes = {limits.max_nodes:,}, aliases counted expanded)"
        )


_RESOLVER = yaml.resolver.Resolver()
_NUMERIC = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _number(event: Any, filename: str, limits: Limits) -> None:
    """Refuse a scalar that YAML reads as a number longer than `limits.max_number_chars` (Python refuses
    to convert integers of over 4,300 digits; no matrix field needs a fortieth of that)."""
    value = event.value
    long_plain = len(value) > limits.max_number_chars and event.implicit[0]
    if long_plain and _RESOLVER.resolve(yaml.ScalarNode, value, event.implicit) in _NUMERIC:  # type: ignore[no-untyped-call]
        raise ConfigurationError(
            f"{where(filename, event.start_mark)}: a number of {len(value):,} characters (at most "
            f"{limits.max_number_chars})"
        )


def _key(frame: _Frame, event: Any, filename: str) -> None:
    """Refuse a scalar key a mapping already has (YAML would keep only the last value)."""
    key = str(event.value)
    first = frame.keys.get(key)
    if first is not None:
        raise ConfigurationError(
            f"{where(filename, event.start_mark)}: duplicate key '{key}' (first at line {first.line + 1}); "
            "YAML would silently keep only the last one"
        )
    frame.keys[key] = event.start_mark


def load_bounded(text: str, filename: str, limits: Limits = LIMITS) -> tuple[yaml.Node | None, Any]:
    """(root node, Python data) of one YAML document, after `check_events` passed; parsed once more to
    compose, and the data constructed from that node (aliases shared, never copied)."""
    check_events(text, filename, limits)
    loader = SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    return node, data
