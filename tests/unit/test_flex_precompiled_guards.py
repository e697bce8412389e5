"""Which Dynamo guards a precompiled FlexAttention function keeps (no torch needed)."""

from __future__ import annotations

from typing import NamedTuple

from attnforge.flex.runtime.precompiled import guard_filter


class Entry(NamedTuple):
    guard_type: str
    derived_guard_types: tuple[str, ...]
    is_global: bool


def test_guards_another_process_can_check_are_kept() -> None:
    entries = [
        Entry("TENSOR_MATCH", (), False),  # shapes, dtype, device, requires_grad of q/k/v
        Entry("CONSTANT_MATCH", (), False),  # enable_gqa
        Entry("ID_MATCH", (), False),  # identity of an object of the building process
        Entry("CLOSURE_MATCH", (), False),
        Entry("DICT_KEYS_MATCH", ("DICT_VERSION",), False),  # pytree's registry: a dict version
        Entry("TYPE_MATCH", (), True),  # a global
    ]
    assert guard_filter(entries) == [True, True, False, False, False, False]
