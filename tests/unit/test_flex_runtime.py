"""The attnforge_flex loader: never imports torch at import, never crashes on stale or broken artifacts."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from attnforge.flex.runtime import envkeys
from attnforge.names import flex_local

SRC = Path(__file__).resolve().parents[2] / "src"


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, attnforge.flex.runtime as r; print('torch' in sys.modules, r.variants('/nonexistent'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": str(SRC)}
    ).stdout.split()
    assert out == ["False", "{}"]


def test_local_version_and_mismatches() -> None:
    cuda = {
        "device": "cuda",
        "torch": "2.11.0+cu130",
        "cuda": "13.0",
        "capability": "9.0",
        "triton": "3.6.0",
        "python": "3.12",
    }
    assert flex_local(cuda).local_version == "torch2.11.cu130.sm90"
    cpu = {"device": "cpu", "torch": "2.13.0+cpu", "cpu_capability": "AVX512", "python": "3.11"}
    assert flex_local(cpu).local_version == "torch2.13.cpu.avx512"
    assert envkeys.mismatches(cuda, dict(cuda)) == []
    diff = envkeys.mismatches(cuda, cuda | {"triton": "3.5.0", "driver": "12.8"})
    assert diff == ["triton: built with '3.6.0', here '3.5.0'"]


from attnforge.flex import runtime  # noqa: E402  (imports no torch)


def _artifacts(tmp_path: Path, env: dict, blob: bytes = b"x") -> Path:
    art = tmp_path / "artifacts"
    art.mkdir()
    (art / "v.megacache.bin").write_bytes(blob)
    import hashlib

    spec = {
        "name": "v",
        "mask": "causal",
        "score_mod": "none",
        "dtype": "bf16",
        "head_dim": 16,
        "heads_q": 2,
        "heads_kv": 2,
        "seq_len": 32,
        "batch": 1,
        "backward": False,
        "device": "cpu",
    }
    (art / "manifest.json").write_text(
        json.dumps(
            {
                "schema": 1,
                "env": env,
                "variants": [
                    {
                        "name": "v",
                        "spec": spec,
                        "aoti": None,
                        "megacache": {
                            "file": "v.megacache.bin",
                            "sha256": hashlib.sha256(b"x").hexdigest(),
                            "size": 1,
                        },
                    }
                ],
            }
        )
    )
    return art


def test_missing_artifacts_warn_once_and_load_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    runtime.artifact_manifest._warned.clear()
    with pytest.warns(runtime.FlexCacheWarning, match="no usable artifacts"):
        res = runtime.load(tmp_path / "none")
    assert not res.ok and res.loaded == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runtime.load(tmp_path / "none")  # the same problem warns only once


def test_stale_environment_falls_back(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    runtime.artifact_manifest._warned.clear()
    env = envkeys.collect("cpu") | {"torch": "2.0.0+cpu"}
    art = _artifacts(tmp_path, env)
    with pytest.warns(runtime.FlexCacheWarning, match="another environment: torch"):
        res = runtime.load(art)
    assert res.loaded == [] and "torch" in str(res.reason)


def test_corrupted_artifact_is_skipped_not_fatal(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    runtime.artifact_manifest._warned.clear()
    art = _artifacts(tmp_path, envkeys.collect("cpu"), blob=b"corrupted")
    with pytest.warns(runtime.FlexCacheWarning, match="sha256 differs"):
        res = runtime.load(art)
    assert res.loaded == [] and "v" in res.skipped


def test_attention_runs_eager_fallback_values(tmp_path: Path) -> None:
    """Without usable artifacts the variant still computes the right thing (compiled normally)."""
    pytest.importorskip("torch")
    runtime.artifact_manifest._warned.clear()
    art = _artifacts(tmp_path, envkeys.collect("cpu") | {"torch": "0"})
    fn = runtime.attention("v", art)
    with pytest.raises(KeyError):
        runtime.attention("nope", art)
    assert fn.packaged is None and fn.spec["mask"] == "causal"
