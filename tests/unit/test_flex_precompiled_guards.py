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


class FakeCall:
    """Stands in for mods.FlexCall (no torch): records that the normal compiled path ran."""

    score_mod = None
    gqa = False
    scale = None

    def block_mask(self, seq_len: int) -> str:
        return f"mask{seq_len}"

    def __call__(self, q: object, k: object, v: object) -> str:
        return "compiled"


class Q:
    shape = (1, 4, 256, 64)
    dtype = "torch.bfloat16"


def _guarded(pre: object) -> object:
    from attnforge.flex.runtime.loader import _Guarded

    spec = {"name": "v", "dtype": "bf16", "heads_q": 4, "heads_kv": 4, "seq_len": 256, "head_dim": 64}
    return _Guarded(FakeCall(), spec, None, pre)


def test_a_guard_mismatch_compiles_quietly_and_keeps_the_function() -> None:
    import warnings

    from attnforge.flex.runtime.precompiled import GuardMismatch

    def pre(*args: object) -> str:
        raise GuardMismatch("other shape")

    g = _guarded(pre)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g(Q(), Q(), Q()) == "compiled"  # type: ignore[operator]
    assert g.pre is pre and g.used == "compile"  # type: ignore[attr-defined]


def test_a_fitting_call_runs_the_precompiled_function_and_says_so() -> None:
    g = _guarded(lambda *args: "precompiled")
    assert g.used is None  # type: ignore[attr-defined]
    assert g(Q(), Q(), Q()) == "precompiled" and g.used == "precompiled"  # type: ignore[operator, attr-defined]


def test_a_precompiled_function_that_fails_warns_once_and_is_dropped() -> None:
    import pytest

    from attnforge.flex.runtime import FlexCacheWarning

    calls: list[tuple[object, ...]] = []

    def pre(*args: object) -> str:
        calls.append(args)
        raise RuntimeError("CUDA error: no kernel image is available\nmore")

    g = _guarded(pre)
    with pytest.warns(FlexCacheWarning, match="precompiled function failed .RuntimeError: CUDA error"):
        assert g(Q(), Q(), Q()) == "compiled"  # type: ignore[operator]
    assert g(Q(), Q(), Q()) == "compiled" and len(calls) == 1  # type: ignore[operator]
    assert calls[0][3] == "mask256"  # the variant's block mask for the call's sequence length
