"""End to end on CPU (what CI runs): build a CPU FlexAttention variant ahead of time, package it as the
attnforge-flex-kernels wheel with a real build backend, install it into a fresh venv, ``load()`` it, and show
the first call is faster than a cold compile; stale or broken artifacts fall back with a warning."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from attnforge.flex.aot_build import BuildOptions, build_and_package, build_variants  # noqa: E402
from attnforge.parity.venv import install, make_venv  # noqa: E402

pytestmark = pytest.mark.slow

VARIANT = {
    "name": "cpu-causal-bf16",
    "mask": "causal",
    "window": None,
    "prefix": None,
    "score_mod": "none",
    "softcap": None,
    "dtype": "bf16",
    "head_dim": 64,
    "heads_q": 4,
    "heads_kv": 4,
    "seq_len": 256,
    "batch": 1,
    "dynamic": False,
    "backward": False,
    "mode": "default",
    "device": "cpu",
}

FIRST_CALL = """
import json, sys, time, warnings
import torch
mode = sys.argv[1]
q, k, v = (torch.randn(1, h, 256, 64, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
           for i, h in enumerate((4, 4, 4)))
t0 = time.perf_counter()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    used = "compile"
    if mode == "cold":
        from attnforge.flex.runtime import mods
        out = mods.FlexCall(json.loads(sys.argv[2]), "cpu")(q, k, v)
    else:
        import attnforge_flex
        res = attnforge_flex.load()
        fn = attnforge_flex.attention("cpu-causal-bf16")
        out = fn(q, k, v)
        used = fn.used
dt = time.perf_counter() - t0
ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
print(json.dumps({"s": dt, "err": float((out.float() - ref).abs().max()), "warnings": [str(x.message) for x in w
      if "attnforge_flex" in str(x.message)], "loaded": None if mode == "cold" else res.loaded, "used": used}))
"""


def _run(python: Path | str, *args: str, cache: Path, extra_env: dict[str, str] | None = None) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "TORCHINDUCTOR_CACHE_DIR": str(cache),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        }
    )
    env.update(extra_env or {})
    p = subprocess.run(
        [str(python), "-c", FIRST_CALL, *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("flex")
    opts = BuildOptions(out_dir=root / "out", jobs=1, log=print)
    manifest, wheel = build_and_package([VARIANT], opts, root / "dist")
    assert wheel is not None
    venv = make_venv(root / "venv")
    install(venv, [wheel])
    return {"root": root, "manifest": manifest, "wheel": wheel, "venv": venv}


def test_wheel_holds_loader_artifacts_and_versions(built: dict) -> None:
    wheel: Path = built["wheel"]
    assert wheel.name.startswith("attnforge_flex_kernels-0.1.0+torch") and ".cpu." in wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert "attnforge_flex/__init__.py" in names and "attnforge_flex/mods.py" in names
    assert "attnforge_flex/artifacts/manifest.json" in names
    assert "attnforge_flex/artifacts/cpu-causal-bf16.megacache.bin" in names
    assert "attnforge_flex/artifacts/cpu-causal-bf16.pt2" in names
    # session 4 found the precompiled function missing from the wheel: the loader then compiled
    assert "attnforge_flex/artifacts/cpu-causal-bf16.precompiled.bin" in names
    [entry] = built["manifest"]["variants"]
    assert entry["megacache"]["max_err"] < 0.05
    env = built["manifest"]["env"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["cpu_capability"]


def test_installed_wheel_loads_its_precompiled_function(built: dict) -> None:
    # attnforge cannot be imported in that process (blocked in sys.modules, whatever the machine's Python has
    # installed; no PYTHONPATH to the sources): the saved guards must name the wheel's modules
    code = (
        "import sys; sys.modules['attnforge'] = None; import attnforge_flex, json; "
        "fn = attnforge_flex.precompiled_function('cpu-causal-bf16'); "
        "print(json.dumps({'pre': fn is not None, 'from': attnforge_flex.__file__, "
        "'attnforge': any(m == 'attnforge' or m.startswith('attnforge.') for m, v in sys.modules.items() if v)}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(built["root"] / "cache-pre")
    p = subprocess.run([str(built["venv"]), "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert not r["attnforge"], r
    assert r["pre"] and "site-packages" in r["from"], (r, p.stderr[-2000:])


def test_loaded_first_call_is_faster_than_cold(built: dict) -> None:
    root: Path = built["root"]
    cold = _run(sys.executable, "cold", json.dumps(VARIANT), cache=root / "cache-cold")
    loaded = _run(built["venv"], "loaded", cache=root / "cache-loaded")
    assert loaded["loaded"] == ["cpu-causal-bf16"] and not loaded["warnings"]
    assert loaded["used"] == "aoti", loaded  # the forward-only variant runs its AOTInductor package
    assert cold["err"] < 0.05 and loaded["err"] < 0.05
    assert loaded["s"] < cold["s"], f"first call with the wheel {loaded['s']:.1f} s, cold {cold['s']:.1f} s"
    print(f"first call: cold {cold['s']:.2f} s, with attnforge-flex-kernels {loaded['s']:.2f} s")


def test_stale_artifacts_warn_and_still_compute(built: dict) -> None:
    venv: Path = built["venv"]
    site = subprocess.run(
        [str(venv), "-c", "import attnforge_flex, os; print(os.path.dirname(attnforge_flex.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stale = built["root"] / "stale"
    shutil.copytree(site, stale / "attnforge_flex")
    m = stale / "attnforge_flex" / "artifacts" / "manifest.json"
    data = json.loads(m.read_text())
    data["env"]["torch"] = "1.0.0"
    m.write_text(json.dumps(data))
    r = _run(venv, "loaded", cache=built["root"] / "cache-stale", extra_env={"PYTHONPATH": str(stale)})
    assert r["loaded"] == [] and r["err"] < 0.05
    assert any("another environment" in w and "torch" in w for w in r["warnings"])


def test_a_crashing_aoti_load_is_isolated_and_not_retried(tmp_path: Path) -> None:
    v2 = VARIANT | {"name": "cpu-swa-bf16", "mask": "sliding_window", "window": 32}
    os.environ["ATTNFORGE_FLEX_FAULT"] = "aoti-run"
    try:
        m = build_variants([VARIANT, v2], BuildOptions(out_dir=tmp_path, jobs=2, aoti_probe=False, log=print))
    finally:
        del os.environ["ATTNFORGE_FLEX_FAULT"]
    first, second = m["variants"]
    assert first["megacache"] and second["megacache"]
    assert (
        first["aoti"]["kind"] == "crash" and first["aoti"]["signal"] == "SIGSEGV" and not first["aoti"]["ok"]
    )
    assert second["aoti"]["kind"] == "skipped" and "crashed" in second["aoti"]["reason"]
