"""The pytest plugin that samples upstream's own tests: copied as ``conftest.py`` beside the test file.

Its instructions come in ``ATTNFORGE_UPSTREAM_SAMPLE`` (JSON: the kernel, the tests to draw from, what the wheel
compiled, the sample's size and seed, where to write the summary). It keeps the items the wheel's profile can
run, leaves out the ``excluded`` ones, draws a fixed-seed sample (uniform, or ``stratified``: the same share from
every test function so each one is exercised) and writes collected / eligible / sampled counts. For FA2 it
narrows the ``d`` and ``dtype`` parametrizations before collection, since upstream's file parametrizes about
400,000 cases. Standard library and pytest only (it runs in the venv holding the wheel).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from typing import Any

import pytest

FA2_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # FA2 runs a head dim on the smallest compiled kernel that fits
DTYPE_NAMES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float8_e4m3fn": "fp8"}


def _spec() -> dict[str, Any]:
    return dict(json.loads(os.environ["ATTNFORGE_UPSTREAM_SAMPLE"]))


def fa2_kernel_dim(d: int) -> int | None:
    """The FA2 kernel head dim that runs head dim ``d`` (None above 256)."""
    return next((h for h in FA2_HEAD_DIMS if d <= h), None)


def _fa2_eligible(name: str, params: dict[str, Any], spec: dict[str, Any]) -> bool:
    off = set(spec["disabled"])
    d = params.get("d")
    if d is not None:
        if not isinstance(d, int) or fa2_kernel_dim(d) not in spec["head_dims"]:  # not int: an emptied set
            return False
        if "uneven_k" in off and d != fa2_kernel_dim(d):
            return False
    dtype = params.get("dtype")
    if dtype is not None and DTYPE_NAMES.get(str(dtype), str(dtype)) not in spec["dtypes"]:
        return False
    features = {
        "dropout": params.get("dropout_p", 0.0) > 0.0,
        "alibi": bool(params.get("alibi")),
        "local": bool(params.get("local")),
        "softcap": params.get("softcap", 0.0) > 0.0,
        "backward": name not in spec.get("forward_only", ()),
    }
    return not any(used and feature in off for feature, used in features.items())


def _fa3_eligible(name: str, params: dict[str, Any], spec: dict[str, Any]) -> bool:
    d, built = params.get("d"), spec["head_dims"]
    if name == "test_flash_attn_combine":
        return "split" not in spec["disabled"]
    if "varlen" in spec["disabled"] and name in ("test_flash_attn_varlen_output", "test_flash_attn_kvcache"):
        return False
    if d is None:
        return True
    if d % 8 or not any(h >= d for h in built):
        return False
    if name in ("test_flash_attn_output", "test_flash_attn_varlen_output"):
        if d <= 64 and "hdimdiff64" in spec["disabled"]:
            return False  # the test loops over V head dims 256 and 512 for Q/K head dim 64
        if 128 < d <= 192 and "hdimdiff192" in spec["disabled"]:
            return False
    return True


def eligible(name: str, params: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Whether the wheel's profile can run this test with these parameters (and it is not excluded)."""
    if name not in spec["tests"]:
        return False
    if any(
        x["test"] == name and all(params.get(k) == v for k, v in x["params"].items())
        for x in spec["excluded"]
    ):
        return False
    return (_fa2_eligible if spec["kernel"] == "flash-attn" else _fa3_eligible)(name, params, spec)


def draw(groups: dict[str, list[Any]], n: int, seed: int, stratified: bool) -> list[Any]:
    """A fixed-seed sample of ``n`` items: uniform over all, or round-robin over the shuffled groups."""
    rng = random.Random(seed)
    everything = [i for g in groups.values() for i in g]
    if not stratified:
        return rng.sample(everything, min(n, len(everything)))
    queues = {k: rng.sample(v, len(v)) for k, v in sorted(groups.items())}
    chosen: list[Any] = []
    while len(chosen) < n and any(queues.values()):
        for q in queues.values():
            if q and len(chosen) < n:
                chosen.append(q.pop())
    rng.shuffle(chosen)  # a run cut short by the budget still mixes the tests
    return chosen


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: Any) -> None:
    """FA2: drop head dims and dtypes the wheel did not compile from the parametrize marks before they expand."""
    spec = _spec()
    if spec["kernel"] != "flash-attn":
        return
    keep: dict[str, Callable[[Any], bool]] = {
        "d": lambda d: fa2_kernel_dim(d) in spec["head_dims"],
        "dtype": lambda t: DTYPE_NAMES.get(str(t), str(t)) in spec["dtypes"],
    }
    marks = metafunc.definition.own_markers
    for i, mark in enumerate(marks):
        if mark.name == "parametrize" and mark.args and mark.args[0] in keep:
            values = [v for v in mark.args[1] if keep[mark.args[0]](v)]
            marks[i] = pytest.mark.parametrize(mark.args[0], values).mark


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Keep the sample only, in its (random) order; write the counts."""
    spec = _spec()
    collected = len(items)
    groups: dict[str, list[Any]] = {}
    for item in items:
        name = item.originalname or item.name.split("[")[0]
        params = getattr(getattr(item, "callspec", None), "params", {})
        if eligible(name, params, spec):
            groups.setdefault(name, []).append(item)
    chosen = draw(groups, spec["n"], spec["seed"], bool(spec.get("stratified")))
    keep = {id(i) for i in chosen}
    config.hook.pytest_deselected(items=[i for i in items if id(i) not in keep])
    items[:] = chosen
    by_test: dict[str, int] = {}
    for item in chosen:
        key = item.originalname or item.name
        by_test[key] = by_test.get(key, 0) + 1
    with open(spec["summary"], "w", encoding="utf-8") as f:
        json.dump(
            {
                "collected": collected,
                "eligible": sum(len(g) for g in groups.values()),
                "eligible_by_test": {k: len(v) for k, v in sorted(groups.items())},
                "sampled": len(chosen),
                "seed": spec["seed"],
                "by_test": by_test,
                "excluded": spec["excluded"],
            },
            f,
        )
