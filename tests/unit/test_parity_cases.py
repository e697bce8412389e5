"""Which flash-attn cases a profile calls for, and where the profile comes from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from attnforge.parity import cases as C
from attnforge.parity import profile as P

ROOT = Path(__file__).resolve().parents[2]


def test_full_profile_has_every_entry_point_and_no_error_cases() -> None:
    cs = C.flash_cases(P.WheelProfile())
    kernels = {c.kernel for c in cs}
    assert kernels == {"func", "qkvpacked", "varlen", "kvcache"}
    assert not [c for c in cs if c.expect_error]
    assert {c.d for c in cs} >= set(P.ALL_HEAD_DIMS)
    assert any(c.paged for c in cs) and any(c.dropout for c in cs) and any(c.alibi for c in cs)
    assert any(c.softcap for c in cs) and any(c.window != (-1, -1) for c in cs)
    assert {c.heads for c in cs} == {"mha", "gqa", "mqa"}
    assert any(c.sq % 2 for c in cs)  # odd sequence lengths
    assert all(not c.backward for c in cs if c.kernel == "kvcache")
    assert len({c.id for c in cs}) == len(cs)


def test_excluded_head_dims_dtypes_and_features_become_expected_errors() -> None:
    prof = P.WheelProfile(
        name="x", head_dims=(128,), dtypes=("bf16",), disabled=frozenset({"dropout", "alibi"})
    )
    cs = C.flash_cases(prof)
    errs = [c for c in cs if c.expect_error]
    assert {c.d for c in errs if c.expect_error == C.ERR_HEAD_DIM} == {32, 64, 96, 192, 256}
    assert [c.dtype for c in errs if c.expect_error == C.ERR_DTYPE] == ["fp16"]
    feats = [c for c in errs if c.expect_error == C.ERR_FEATURE]
    assert feats and all(c.dropout or c.alibi for c in feats)
    assert all(c.d in (128, 120) for c in cs if not c.expect_error)


def test_inference_profile_skips_backward_with_a_reason() -> None:
    prof = P.from_manifest(
        {
            "inputs": {
                "profile": "inference",
                "profile_flags": ["-DFLASHATTENTION_DISABLE_BACKWARD", "-DFLASHATTENTION_DISABLE_DROPOUT"],
            }
        }
    )
    assert not prof.backward and prof.disabled == {"backward", "dropout"}
    cs = C.flash_cases(prof, quick=True)
    working = [c for c in cs if not c.expect_error and c.kernel != "kvcache"]
    assert working and all(c.skip_bwd and "without backward" in c.skip_bwd for c in working)
    assert any(c.expect_error_in == "bwd" for c in cs)


def test_profile_from_local_version_and_matrix() -> None:
    assert P.profile_tag("2.8.3+cu130torch2.14cxx11abiTRUE.hd128fwd") == "hd128fwd"
    assert P.profile_tag("2.8.3+cu130torch2.14cxx11abiTRUE") is None
    assert P.profile_tag("2.8.3") is None
    prof = P.resolve(None, "2.8.3+cu130torch2.14cxx11abiTRUE.fwd128", ROOT / "matrix.yaml")
    assert (
        prof.name == "fwd128" and prof.head_dims == (128,) and prof.dtypes == ("bf16",) and not prof.backward
    )
    assert P.resolve(None, "2.8.3+cu130torch2.14cxx11abiTRUE.zzz", None).name == "zzz"
    assert P.resolve().name == "full"


def test_uneven_dims_stay_in_their_bucket() -> None:
    assert C.uneven_dim(128) == 120 and C.uneven_dim(64) == 56 and C.uneven_dim(32) == 24


def test_a_broken_profile_fails_collection_instead_of_skipping(tmp_path: Path) -> None:
    """tests/gpu/test_flash_attn_parity.py with an unreadable manifest: pytest exits non-zero (it used to
    collect zero cases and pass)."""
    bad = tmp_path / "w.whl.manifest.json"
    bad.write_text("{not json")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            str(root / "tests" / "gpu" / "test_flash_attn_parity.py"),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "ATTNFORGE_PARITY_MANIFEST": str(bad)},
        check=False,
        timeout=300,
    )
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "w.whl.manifest.json" in proc.stdout + proc.stderr
