"""One toolkit spelling (`builder.toolkits`): CUDA "13.0" <-> "cu130", ROCm "6.4" <-> "rocm6.4", and the
matrix names; the matrix's Toolkit, the environment probe and the wheel names use it."""

from __future__ import annotations

import pytest

from attnforge.builder.toolkits import (
    cuda_of_variant,
    cuda_variant,
    rocm_variant,
    toolkit_of_variant,
    toolkit_variant,
)
from attnforge.builder.torchenv import variant_mismatch
from attnforge.engine.environment import Env
from attnforge.matrix.cell import Toolkit
from attnforge.wheels.naming import cuda_minor_compatible


@pytest.mark.parametrize(("version", "variant"), [("13.0", "cu130"), ("12.8", "cu128"), ("11.8", "cu118")])
def test_cuda_round_trip(version: str, variant: str) -> None:
    assert cuda_variant(version) == variant and cuda_of_variant(variant) == version
    assert toolkit_variant(f"cuda{version}") == variant == Toolkit.parse(f"cuda{version}").short
    assert toolkit_of_variant(variant) == f"cuda{version}"


def test_patch_levels_and_others() -> None:
    assert cuda_variant("13.0.88") == "cu130" and rocm_variant("6.4.43482") == "rocm6.4"
    assert toolkit_variant("rocm6.4") == "rocm6.4" == toolkit_of_variant("rocm6.4")
    for other in ("cpu", "cu", "cuX1", "rocm"):
        assert cuda_of_variant(other) is None
    assert toolkit_variant("cpu") is None and toolkit_of_variant("cpu") is None


def test_call_sites_agree() -> None:
    env = Env.from_probe({"python": "3.12", "torch": {"cuda": "13.0", "version": "2.11.0"}})
    assert env.accel == "cu130"
    assert Env.from_probe({"python": "3.12", "torch": {"hip": "6.4.43482"}}).accel == "rocm6.4"
    assert variant_mismatch("cu130", {"torch": "2.11.0", "cuda": "13.0"}) is None
    assert "CUDA 12.8" in str(variant_mismatch("cu130", {"torch": "2.9.1", "cuda": "12.8"}))
    assert cuda_minor_compatible("cu131", "cu130") and not cuda_minor_compatible("cu130", "cu131")
    assert not cuda_minor_compatible("cu130", "cu128") and not cuda_minor_compatible("rocm6.4", "rocm6.4")


def test_arch_facts_have_one_home() -> None:
    from attnforge.client.pull import host_from_args
    from attnforge.core.arches import arch_number, sm_of_compute_cap

    assert sm_of_compute_cap("9.0") == "sm_90" and sm_of_compute_cap("12.0") == "sm_120"
    env = Env.from_probe({"python": "3.12", "torch": {"cuda": "13.0", "gpus": [{"capability": [12, 0]}]}})
    assert env.gpus == ("sm_120",)
    assert [a for _, a in host_from_args(("9.0", "sm_100a"), None, None).gpus] == ["sm_90", "sm_100a"]
    assert (arch_number("sm_90a"), arch_number("sm_100"), arch_number("gfx942")) == (90, 100, -1)
