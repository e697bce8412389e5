"""FA2's upstream-test sampler without a GPU: the plugin run for real by pytest on a stand-in shaped like
upstream's tests/test_flash_attn.py (head dims round up to the compiled kernel, dtypes and features the profile
left out are dropped, every test function gets its share), and the files taken from a checkout or the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.parity import upstream
from attnforge.parity.parity_report import FAILED, PASSED
from attnforge.parity.profile import WheelProfile

# dtypes as the strings torch's dtypes print as (the plugin reads str(dtype)): no torch import in the child
STANDIN = """
import pytest

FP16, BF16 = "torch.float16", "torch.bfloat16"

@pytest.mark.parametrize("dtype", [FP16, BF16])
@pytest.mark.parametrize("d", [32, 59, 111, 128, 256])
@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
def test_flash_attn_qkvpacked(dropout_p, d, dtype):
    assert not (d == 111 and dropout_p > 0 and dtype == BF16), "a wrong answer"

@pytest.mark.parametrize("dtype", [FP16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("paged_kv_block_size", [None, 256])
def test_flash_attn_kvcache(paged_kv_block_size, d, dtype):
    pass

@pytest.mark.parametrize("dtype", [FP16])
@pytest.mark.parametrize("d", [16, 32, 64])
def test_flash_attn_bwd_overflow(d, dtype):
    pass

def test_not_upstreams():
    raise AssertionError("never sampled")
"""


def hd128(**kw: object) -> WheelProfile:
    base: dict[str, object] = dict(name="hd128", head_dims=(128,), dtypes=("fp16", "bf16"))
    base.update(kw)
    return WheelProfile(**base)  # type: ignore[arg-type]


def sample(tmp: Path, p: WheelProfile, n: int, seed: int = 0) -> tuple[dict[str, str], dict[str, str], dict]:
    (tmp / "test_flash_attn.py").write_text(STANDIN)
    (tmp / "conftest.py").write_text(upstream.PLUGIN)
    summary = tmp / "sample.json"
    env = {**os.environ, **upstream.sample_env(p, n, seed, summary)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rfE", "test_flash_attn.py"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
    )
    outcomes, reasons = upstream.parse_output(proc.stdout)
    return outcomes, reasons, json.loads(summary.read_text())


def test_an_hd128_wheel_runs_head_dims_that_round_up_to_128(tmp_path: Path) -> None:
    outcomes, reasons, summary = sample(tmp_path, hd128(), 100)
    # d 111 and 128 run on the 128 kernel; 32/59/256 and bwd_overflow's 16/32/64 are dropped before collection
    assert summary["collected"] == 2 * 2 * 2 + 2 + 1 + 1  # + bwd_overflow's emptied set + test_not_upstreams
    assert summary["eligible_by_test"] == {"test_flash_attn_kvcache": 2, "test_flash_attn_qkvpacked": 8}
    assert all("-111-" in n or "-128-" in n for n in outcomes)
    bad = [n for n, o in outcomes.items() if o == "FAILED"]
    assert bad == ["test_flash_attn.py::test_flash_attn_qkvpacked[0.17-111-torch.bfloat16]"]
    results = upstream.to_results(outcomes, reasons, summary, 0, False, upstream.FA2)
    assert results[-1].suite == "fa2_upstream" and results[-1].status == FAILED
    assert results[-1].kernel.startswith("upstream tests/test_flash_attn.py: sampled 10 of 10 eligible")


def test_the_sample_takes_every_test_functions_share(tmp_path: Path) -> None:
    outcomes, _, summary = sample(tmp_path, hd128(), 4, seed=3)
    assert summary["by_test"] == {"test_flash_attn_kvcache": 2, "test_flash_attn_qkvpacked": 2}
    again, _, _ = sample(tmp_path, hd128(), 4, seed=3)
    assert sorted(again) == sorted(outcomes)


def test_features_and_dtypes_left_out_of_the_wheel_are_not_sampled(tmp_path: Path) -> None:
    p = hd128(dtypes=("bf16",), disabled=frozenset({"dropout"}))
    outcomes, reasons, summary = sample(tmp_path, p, 100)
    assert summary["eligible_by_test"] == {"test_flash_attn_qkvpacked": 2}  # kvcache is fp16 only upstream
    assert sorted(outcomes) == [
        "test_flash_attn.py::test_flash_attn_qkvpacked[0.0-111-torch.bfloat16]",
        "test_flash_attn.py::test_flash_attn_qkvpacked[0.0-128-torch.bfloat16]",
    ]
    assert upstream.to_results(outcomes, reasons, summary, 0, False, upstream.FA2)[-1].status == PASSED


def test_fa2_tests_come_from_a_checkout_or_the_file(tmp_path: Path) -> None:
    checkout = tmp_path / "flash-attention"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "test_flash_attn.py").write_text("def test_flash_attn_output():\n    pass\n")
    for source in (checkout, checkout / "tests", checkout / "tests" / "test_flash_attn.py"):
        got = upstream.extract(source, tmp_path / source.name / "out", upstream.FA2)
        assert [p.name for p in got.iterdir()] == ["test_flash_attn.py"]
    with pytest.raises(FileNotFoundError, match="no tests/test_flash_attn.py"):
        empty = tmp_path / "empty.tar.gz"
        import tarfile

        with tarfile.open(empty, "w:gz"):
            pass
        upstream.extract(empty, tmp_path / "e", upstream.FA2)
