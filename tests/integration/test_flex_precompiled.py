"""Precompiled FlexAttention functions on CPU (what CI runs): ``attnforge flex build`` saves one per variant,
the ``attnforge_flex`` loader uses it without tracing, other shapes fall back to torch.compile, and a
corrupted file is refused with a warning. (On CPU the kernels' C++ is still compiled at load; on CUDA the
Triton kernels travel in the file. The speed is measured by benchmarks/flex_first_call.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from attnforge.flex.aot_build import BuildOptions, build_variants  # noqa: E402
from attnforge.flex.runtime import precompiled  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(precompiled.supported() is not None, reason=str(precompiled.supported())),
]

VARIANT = {
    "name": "cpu-doc-alibi-bf16",
    "mask": "document",
    "window": None,
    "prefix": None,
    "score_mod": "alibi",
    "softcap": None,
    "dtype": "bf16",
    "head_dim": 64,
    "heads_q": 4,
    "heads_kv": 2,
    "seq_len": 256,
    "batch": 1,
    "dynamic": False,
    "backward": False,
    "mode": "default",
    "device": "cpu",
}

CHILD = """
import json, sys, warnings
import torch
from torch._dynamo.utils import counters
from attnforge.flex import runtime
from attnforge.flex.runtime import mods
spec = json.loads(sys.argv[2])
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    fn = runtime.attention(spec["name"], artifacts=sys.argv[1], device="cpu")
    out = {"pre": fn.pre is not None}
    for s in (256, 128):
        q, k, v = mods.make_inputs(spec, "cpu", seq_len=s)
        fn.call.block_mask(s)  # eager flex_attention and block masks run Dynamo themselves: not counted
        before = counters["stats"]["calls_captured"]
        o = fn(q, k, v)
        traced = counters["stats"]["calls_captured"] - before
        ref = mods.FlexCall(spec, "cpu", compiled=False)(q, k, v)
        out[str(s)] = {"traced": traced, "err": float((o.float() - ref.float()).abs().max())}
out["warnings"] = [str(x.message) for x in w if "attnforge_flex" in str(x.message)]
print(json.dumps(out))
"""


def _child(art: Path, cache: Path) -> dict:
    env = dict(
        os.environ,
        TORCHINDUCTOR_CACHE_DIR=str(cache),
        PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"),
    )
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(art), json.dumps(VARIANT)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("flexpre")
    m = build_variants([VARIANT], BuildOptions(out_dir=root, aoti=False, jobs=1, log=print))
    [e] = m["variants"]
    assert e["precompiled"]["ok"], e["precompiled"]
    assert (
        e["precompiled"]["max_err"] < 0.05
        and e["precompiled"]["file"] == "cpu-doc-alibi-bf16.precompiled.bin"
    )
    return root / "artifacts"


def test_the_loader_runs_the_precompiled_function_without_tracing(built: Path, tmp_path: Path) -> None:
    r = _child(built, tmp_path / "cache")
    assert r["pre"] and not r["warnings"], r
    # the shape it was built for: no Dynamo trace in this process at all (the function was loaded)
    assert r["256"]["traced"] == 0 and r["256"]["err"] < 0.05, r
    # another sequence length fails the saved guards and is compiled as usual, still correct
    assert r["128"]["traced"] >= 1 and r["128"]["err"] < 0.05, r


def test_a_corrupted_precompiled_file_is_refused_and_compiles(built: Path, tmp_path: Path) -> None:
    import shutil

    art = tmp_path / "artifacts"
    shutil.copytree(built, art)
    f = art / "cpu-doc-alibi-bf16.precompiled.bin"
    f.write_bytes(f.read_bytes()[:-100] + b"x" * 100)
    r = _child(art, tmp_path / "cache")
    assert not r["pre"] and r["256"]["traced"] >= 1 and r["256"]["err"] < 0.05, r
    assert any("precompiled function not used" in w and "sha256" in w for w in r["warnings"]), r
