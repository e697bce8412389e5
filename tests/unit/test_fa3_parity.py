"""FA3 parity without a GPU: the cases a profile calls for, the profile read from a manifest, and the sampler of
upstream's tests (its pytest plugin run for real on a stand-in test file, the extraction from the snapshot)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.parity import fa3cases, upstream
from attnforge.parity.cases import ERR_FEATURE, ERR_HEAD_DIM
from attnforge.parity.parity_report import FAILED, PASSED, SKIPPED
from attnforge.parity.profile import WheelProfile, from_manifest, profile_tag

ROOT = Path(__file__).resolve().parents[2]
INFER = frozenset({"appendkv", "local", "softcap", "packgqa", "cluster", "hdimdiff64", "hdimdiff192", "sm80"})


def profile(**kw: object) -> WheelProfile:
    base: dict[str, object] = dict(
        name="fa3hd64128", head_dims=(64, 128), dtypes=("bf16", "fp16"), disabled=INFER, kernel="flash-attn-3"
    )
    base.update(kw)
    return WheelProfile(**base)  # type: ignore[arg-type]


def test_manifest_profile_of_an_fa3_wheel() -> None:
    data = {
        "kernel": "flash-attn-3",
        "inputs": {
            "profile": "fa3hd64128",
            "head_dims": [64, 128],
            "dtypes": ["bf16", "fp16"],
            "arches": ["sm_90a"],
            "profile_flags": ["-DFLASHATTENTION_DISABLE_APPENDKV", "-DFLASHATTENTION_DISABLE_HDIMDIFF64"],
        },
    }
    p = from_manifest(data)
    assert p.kernel == "flash-attn-3" and p.disabled == {"appendkv", "hdimdiff64", "sm80"}
    full = from_manifest({"kernel": "flash-attn-3", "inputs": {"arches": ["sm_80", "sm_90a"]}})
    assert (
        full.head_dims == (64, 96, 128, 192, 256)
        and full.dtypes == ("fp16", "bf16", "fp8")
        and not full.disabled
    )
    assert profile_tag("3.0.0+cu130sm90atorch2.9abi3.fa3hd64128") == "fa3hd64128"
    assert profile_tag("3.0.0+cu130sm90atorch2.9abi3") is None


def test_inference_profile_cases() -> None:
    cases = fa3cases.fa3_cases(profile())
    assert all(c.impl == "fa3" for c in cases)
    working = [c for c in cases if not c.expect_error]
    errors = [c for c in cases if c.expect_error]
    # what servers call works: paged KV with cache_seqlens and the split heuristic, varlen, split-KV
    assert any(c.kernel == "kvcache" and c.paged and c.splits == 0 and not c.append for c in working)
    assert any(c.kernel == "varlen" and c.backward for c in working)
    assert any(c.kernel == "func" and c.splits == 3 for c in working)
    assert {(c.dtype, c.d) for c in working if c.kernel == "func" and c.backward and not c.note} == {
        (dt, d) for dt in ("bf16", "fp16") for d in (64, 128)
    }
    # the compiled-out features raise FA3's own message; appending K/V into the cache is one of them
    assert all(
        c.expect_error == ERR_FEATURE
        for c in errors
        if c.window != (-1, -1) or c.softcap or (c.kernel == "kvcache" and c.append)
    )
    assert any(c.kernel == "kvcache" and c.append and c.expect_error for c in cases)
    # head dims above the largest compiled one: a clear error; 96 runs the 128 kernel; fp8 is not built
    assert sorted(c.d for c in errors if c.expect_error == ERR_HEAD_DIM) == [192, 256]
    rounded = [c for c in working if c.note]
    assert [(c.d, "hdim128" in c.note) for c in rounded] == [(96, True)]
    assert any(c.dtype == "fp8" and c.expect_error == ERR_FEATURE for c in errors)
    # V head dim 256/512 with Q/K 64: refused (hdimdiff64 not built), via the dispatch-guard patch
    assert {c.dv for c in errors if c.dv} == {256, 512}
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)) and all(c.kernel_name.startswith("fa3.") for c in cases)


def test_profile_without_backward_or_varlen() -> None:
    p = profile(
        head_dims=(64,), dtypes=("bf16",), disabled=INFER | {"backward", "varlen", "pagedkv", "split"}
    )
    cases = fa3cases.fa3_cases(p)
    assert all(c.skip_bwd for c in cases if not c.expect_error and c.backward)
    assert all(c.expect_error for c in cases if c.kernel in ("varlen", "kvcache") or c.splits > 1)
    assert not any(c.paged and c.sq > 1 for c in cases)  # FA3's TMA paged path needs no paged-KV switch
    assert any(c.expect_error_in == "bwd" for c in cases)


def test_fp8_is_forward_only() -> None:
    cases = fa3cases.fa3_cases(profile(dtypes=("bf16", "fp16", "fp8"), head_dims=(128,)))
    fp8 = [c for c in cases if c.dtype == "fp8" and not c.expect_error]
    assert fp8 and not any(c.backward for c in fp8)


STANDIN = """
import pytest

@pytest.mark.parametrize("d", [32, 59, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_output(d, causal):
    assert d != 96 or causal  # one real failure among the eligible ones

@pytest.mark.parametrize("d", [128])
def test_flash_attn_kvcache(d):
    pass

def test_flash_attn_combine():
    pass

def test_other():
    raise AssertionError("not a sampled test")
"""


def test_the_sampling_plugin_keeps_what_the_profile_can_run(tmp_path: Path) -> None:
    (tmp_path / "test_flash_attn.py").write_text(STANDIN)
    (tmp_path / "conftest.py").write_text(upstream.PLUGIN)
    summary = tmp_path / "sample.json"
    p = profile(disabled=frozenset({"split", "hdimdiff192", "sm80"}))  # 64 x 256/512 built: d 64 eligible
    env = {**os.environ, **upstream.sample_env(p, 50, 7, summary)}
    assert env["FLASH_ATTENTION_DISABLE_SPLIT"] == "TRUE" and env["FLASH_ATTENTION_DISABLE_HDIM256"] == "TRUE"
    assert "FLASH_ATTENTION_DISABLE_HDIMDIFF64" not in env
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-v",
            "-rfE",
            "--no-header",
            "test_flash_attn.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    outcomes, reasons = upstream.parse_output(proc.stdout)
    # eligible: d in {32, 64, 96, 128} (multiple of 8, at most 128) x causal, kvcache d128; not combine (no split)
    assert sorted(outcomes) == sorted(
        [
            f"test_flash_attn.py::test_flash_attn_output[{c}-{d}]"
            for c in ("False", "True")
            for d in (32, 64, 96, 128)
        ]
        + ["test_flash_attn.py::test_flash_attn_kvcache[128]"]
    )
    sample = json.loads(summary.read_text())
    assert sample["eligible"] == sample["sampled"] == 9 and sample["collected"] == 17
    results = upstream.to_results(outcomes, reasons, sample, 7, timed_out=False)
    bad = [r for r in results if r.status == FAILED]
    assert [r.kernel for r in bad[:1]] == [
        "upstream-sample:test_flash_attn.py::test_flash_attn_output[False-96]"
    ]
    assert "assert (96 != 96 or False)" in bad[0].reason
    assert results[-1].kernel.startswith(
        "upstream hopper/test_flash_attn.py: sampled 9 of 9 eligible (17 collected)"
    )
    assert results[-1].status == FAILED and results[-1].reason == "1 failed"
    cut = upstream.to_results(
        {k: v for k, v in outcomes.items() if "96" not in k}, {}, sample, 7, timed_out=True
    )
    assert cut[-1].status == PASSED and cut[-1].reason == "time budget reached: 7 of the sample ran"


def test_a_combine_of_one_split_is_never_sampled(tmp_path: Path) -> None:
    (tmp_path / "test_flash_attn.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('num_splits', [1, 2, 3])\n"
        "def test_flash_attn_combine(num_splits):\n    pass\n"
    )
    (tmp_path / "conftest.py").write_text(upstream.PLUGIN)
    summary = tmp_path / "sample.json"
    env = {**os.environ, **upstream.sample_env(profile(), 50, 0, summary)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "test_flash_attn.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    outcomes, reasons = upstream.parse_output(out)
    assert sorted(outcomes) == [f"test_flash_attn.py::test_flash_attn_combine[{n}]" for n in (2, 3)]
    sample = json.loads(summary.read_text())
    named = upstream.to_results(outcomes, reasons, sample, 0, timed_out=False)[-1].kernel
    assert "sampled 2 of 2 eligible (3 collected)" in named
    assert "never sampled: test_flash_attn_combine[num_splits=1] (the combine kernel called directly" in named


def test_the_sample_is_a_fixed_seed_subset(tmp_path: Path) -> None:
    (tmp_path / "test_flash_attn.py").write_text(STANDIN)
    (tmp_path / "conftest.py").write_text(upstream.PLUGIN)
    runs = []
    for _ in range(2):
        env = {**os.environ, **upstream.sample_env(profile(), 3, 11, tmp_path / "s.json")}
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "test_flash_attn.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        ).stdout
        runs.append(sorted(upstream.parse_output(out)[0]))
    assert len(runs[0]) == 3 and runs[0] == runs[1]
    # hdimdiff64 not built: upstream's output test for d 64 also calls V head dims 256/512, so it is left out
    assert not any("-64]" in n for n in runs[0])


def test_upstream_files_come_from_the_snapshot_only(tmp_path: Path) -> None:
    folder = Path(os.environ.get("ATTNFORGE_SOURCES") or ROOT.parent / "shared" / "sources")
    got = upstream.extract(folder / "flash-attention-3-0251105a.tar.gz", tmp_path)
    assert sorted(p.name for p in got.iterdir()) == sorted(upstream.FA3.files)
    assert "def test_flash_attn_output" in (got / "test_flash_attn.py").read_text()
    with pytest.raises(FileNotFoundError, match="no hopper/"):
        upstream.extract(_empty_tar(tmp_path), tmp_path / "e")


def _empty_tar(tmp: Path) -> Path:
    import tarfile

    path = tmp / "empty.tar.gz"
    with tarfile.open(path, "w:gz"):
        pass
    return path


def test_a_profile_no_upstream_test_fits_is_skipped_not_failed(tmp_path: Path) -> None:
    """fa3min (head dim 64 without hdimdiff64, no varlen, no split) deselects every upstream test: the sample
    is skipped with the reason; a run whose collection broke (no sample summary) still fails."""
    (tmp_path / "test_flash_attn.py").write_text(STANDIN)
    (tmp_path / "conftest.py").write_text(upstream.PLUGIN)
    fa3min = profile(
        name="fa3min",
        head_dims=(64,),
        dtypes=("bf16",),
        disabled=INFER | {"backward", "split", "pagedkv", "varlen"},
    )
    summary = tmp_path / "s.json"
    env = {**os.environ, **upstream.sample_env(fa3min, 40, 0, summary)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "test_flash_attn.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert upstream.parse_output(proc.stdout)[0] == {}
    sample = json.loads(summary.read_text())
    assert sample["eligible"] == 0 and sample["collected"] == 17
    skipped = upstream.no_test_ran(fa3min, sample, proc.stdout)
    assert (
        skipped.status == SKIPPED and "none of the 17 upstream tests fits profile 'fa3min'" in skipped.reason
    )
    broken = upstream.no_test_ran(fa3min, {}, "ERROR collecting test_flash_attn.py")
    assert broken.status == FAILED and broken.reason.startswith("pytest ran no test: ERROR collecting")
