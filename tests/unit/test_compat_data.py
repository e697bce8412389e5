"""The shipped compatibility data: complete enough for the release target, every row sourced."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from attnforge.matrix.compat import load_compat

Run = Callable[..., tuple[int, str, str]]


def test_every_row_names_its_source() -> None:
    data = load_compat()
    for table in (data.torch, data.cuda, data.rocm, data.kernel, data.ngc, data.driver):
        for row in table:
            assert row.source.strip(), row


def test_key_facts() -> None:
    data = load_compat()
    t214 = data.torch_release("2.14")
    assert t214 is not None and t214.cxx_std == 20 and t214.latest.startswith("2.14")
    cuda13 = data.cuda_toolkit("13.0")
    assert cuda13 is not None and "sm_90" in cuda13.arches and "sm_70" not in cuda13.arches
    cuda124 = data.cuda_toolkit("12.4")
    assert cuda124 is not None and "sm_100" not in cuda124.arches
    fa = data.kernel_release("flash-attn", "2.8.3")
    assert fa is not None and fa.min_arch == "sm_80"
    assert data.cuda_toolkit("12.7") is None  # never released
    for family in ("2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14"):
        assert data.torch_release(family) is not None, family


def test_release_target_covers_cuda_12_minors_and_rocm(run_cli: Run, root: Path) -> None:
    code, out, _ = run_cli("--matrix", str(root / "matrix.yaml"), "plan", "-t", "release", "--format", "json")
    assert code == 0
    plan = json.loads(out)
    valid = [c for c in plan["cells"] if c["valid"]]
    toolkits = {c["toolkit"] for c in valid}
    for minor in ("12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8"):
        assert f"cuda{minor}" in toolkits, minor
    assert any(t.startswith("rocm") for t in toolkits)
    assert {c["cxx11_abi"] for c in valid} == {True, False}
    assert {c["python"] for c in valid} == {"3.10", "3.11", "3.12", "3.13", "3.14", "3.14t", "3.15", "3.15t"}
    invalid = [c for c in plan["cells"] if not c["valid"]]
    assert invalid and all(c["reasons"] and c["reasons"][0].startswith("[") for c in invalid)
    # the target is `abi: stable`: from torch 2.10 on the stable binding (no torch C++ API, so no C++20 patch),
    # older torch releases keep the per-torch binding; the kernel units are torch-free in both
    cuda = [c for c in valid if c["toolkit"].startswith("cuda")]
    assert all("torch-free-kernels" in c["patches"] for c in cuda)
    new = [c for c in cuda if int(c["torch"].split(".")[1]) >= 10 and not c["python"].endswith("t")]
    assert new and all("stable-abi" in c["patches"] and "cxx20-binding" not in c["patches"] for c in new)
    # a free-threaded Python loads no abi3 wheel: its cells keep the per-torch binding (cp314t)
    ft = [c for c in cuda if c["python"] == "3.14t"]
    assert ft and all("stable-abi" not in c["patches"] and "-cp314-cp314t-linux_" in c["wheel"] for c in ft)
    assert all("stable-abi" not in c["patches"] for c in cuda if c not in new)
    # kernel sets: one per CUDA lane (toolkit, ABI, arches, profile), not per torch release
    assert len({c["kernel_set_key"] for c in cuda}) == len(
        {(c["toolkit"], c["cxx11_abi"], tuple(c["arches"]), c["profile"]) for c in cuda}
    )
