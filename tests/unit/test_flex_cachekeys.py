"""Cache-key diagnostics (attnforge.flex.cachekeys): records from torch's cache loggers, and their comparison.

The records are logged through the loggers and message formats Inductor and AOTAutograd use (checked against
torch 2.13's sources: ``FX graph cache hash details for key ...`` in torch/_inductor/codecache.py and
``Autograd graph cache hash details for key ...`` in torch/_functorch/_aot_autograd/autograd_cache.py); a real
compile's records are compared across processes in docs/flex.md ("Cache keys")."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from attnforge.flex import cachekeys

FX = logging.getLogger("torch._inductor.codecache")
AOT = logging.getLogger("torch._functorch._aot_autograd.autograd_cache")


def _log(fx_lines: list[str], key: str) -> None:
    FX.debug(f"FX graph cache hash details for key {key}:\n" + "\n".join(fx_lines))
    AOT.debug(
        "Autograd graph cache hash details for key %s:\n%s", "aot1", "[h1] config: x\n[h2] grad_enabled: True"
    )
    FX.info("fx graph cache miss for key %s", key)


def test_capture_writes_keys_and_messages_and_restores_the_loggers(tmp_path: Path) -> None:
    level, propagate = FX.level, FX.propagate
    out = tmp_path / "keys.jsonl"
    with cachekeys.capture(out) as recs:
        _log(["[aaa] gm: <graph>", "[bbb] fx_kwargs[x]: <function f at 0x7f01>"], "fkey1")
        logging.getLogger("torch._inductor.codecache.other").debug("not a key")
    assert (FX.level, FX.propagate) == (level, propagate)
    got = cachekeys.read(out)
    assert got == recs and [r["kind"] for r in got] == ["fx", "aot", "log"]
    assert got[0] == {
        "kind": "fx",
        "key": "fkey1",
        "lines": ["[aaa] gm: <graph>", "[bbb] fx_kwargs[x]: <function f at 0x7f01>"],
    }
    assert got[2]["msg"] == "fx graph cache miss for key fkey1"
    assert json.loads(out.read_text().splitlines()[1])["key"] == "aot1"


def test_diff_names_components_whose_hash_differs_not_those_whose_repr_does(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    with cachekeys.capture(a):
        _log(
            ["[aaa] gm: <graph>", "[bbb] fx_kwargs[x]: <function f at 0x7f01>", "[ccc] example_inputs[0]: T"],
            "k1",
        )
    with cachekeys.capture(b):
        _log(
            ["[aaa] gm: <graph>", "[bbb] fx_kwargs[x]: <function f at 0x7e99>", "[ddd] example_inputs[0]: T"],
            "k2",
        )
    fx, aot = cachekeys.diff(cachekeys.read(a), cachekeys.read(b))
    assert (fx["kind"], fx["same"], [d["component"] for d in fx["differs"]]) == (
        "fx",
        False,
        ["example_inputs[0]"],
    )
    assert aot == {"kind": "aot", "index": 0, "a": "aot1", "b": "aot1", "same": True, "differs": []}
    assert cachekeys.main(["diff", str(a), str(b)]) == 1 and cachekeys.main(["diff", str(a), str(a)]) == 0
