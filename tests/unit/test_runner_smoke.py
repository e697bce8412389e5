"""The smoke run's profile hint: a wheel that was never finalized carries no attnforge_build.json, so the
head dims and dtypes to try come from the manifest beside it (seen on the H100: a hd64 wheel was tried
with d128 and failed the smoke run with attnforge's own clear error)."""

from __future__ import annotations

import json
from pathlib import Path

from attnforge.runner.gpu_smoke import SMOKE_SCRIPT, profile_hint


def test_hint_from_the_manifest_beside_the_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "flash_attn-2.8.3+x.hd64bf16-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"")
    Path(str(wheel) + ".manifest.json").write_text(
        json.dumps({"inputs": {"head_dims": [64], "dtypes": ["bf16"], "torch": "2.11"}})
    )
    assert profile_hint(wheel) == {"head_dims": [64], "dtypes": ["bf16"]}


def test_no_manifest_no_hint(tmp_path: Path) -> None:
    assert profile_hint(tmp_path / "x.whl") == {} and profile_hint(None) == {}


def test_the_script_reads_the_hint() -> None:
    assert "sys.argv[1]" in SMOKE_SCRIPT and 'inputs.get("head_dims")' in SMOKE_SCRIPT
