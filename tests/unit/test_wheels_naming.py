"""Variant names, local versions and the torch pin derived from a manifest, and parsed back."""

from __future__ import annotations

from typing import Any

import pytest

from attnforge.core.errors import BuildError
from attnforge.wheels.naming import expected_names, parse_local, torch_family, torch_requirement


def manifest(**inputs: Any) -> dict[str, Any]:
    base = {
        "toolkit": "cuda13.0",
        "torch": "2.14.1",
        "python": "3.11",
        "cxx11_abi": True,
        "arches": ["sm_90"],
    }
    return {"kernel": "flash-attn", "kernel_version": "2.8.3", "inputs": {**base, **inputs}}


def test_full_profile_names() -> None:
    n = expected_names(manifest(profile="full"))
    assert n.version == "2.8.3+cu130torch2.14cxx11abiTRUE"
    assert n.variant == "cu130-torch2.14"
    assert n.torch_requirement == "torch==2.14.*"
    assert (n.dist, n.python_tag, n.platform) == ("flash_attn", "cp311", "x86_64")


@pytest.mark.parametrize(
    ("inputs", "extra", "local"),
    [
        ({"profile": "inference", "profile_tag": "infer"}, {}, "cu130torch2.14cxx11abiTRUE.infer"),
        ({"profile": "hd128"}, {}, "cu130torch2.14cxx11abiTRUE.hd128"),
        # the planner's local version in the manifest carries the profile's tag
        (
            {"profile": "inference"},
            {"local_version": "cu130torch2.14cxx11abiTRUE.infer"},
            "cu130torch2.14cxx11abiTRUE.infer",
        ),
        ({"cxx11_abi": False, "toolkit": "cuda12.8", "torch": "2.8.0"}, {}, "cu128torch2.8cxx11abiFALSE"),
    ],
)
def test_profiles_and_abi(inputs: dict[str, Any], extra: dict[str, Any], local: str) -> None:
    n = expected_names({**manifest(**inputs), **extra})
    assert n.local_version == local


def test_old_abi_and_rocm_variants() -> None:
    assert expected_names(manifest(cxx11_abi=False)).variant == "cu130-torch2.14-cxx11abiFALSE"
    rocm = expected_names(manifest(toolkit="rocm6.4", torch="2.8.0", arches=["gfx942"], profile="ck"))
    assert rocm.variant == "rocm6.4-torch2.8" and rocm.local_version.startswith("rocm6.4torch2.8cxx11abiTRUE")


def test_missing_inputs_refused() -> None:
    data = manifest()
    del data["inputs"]["torch"]
    with pytest.raises(BuildError, match="lack torch"):
        expected_names(data)


@pytest.mark.parametrize(
    ("local", "parsed"),
    [
        ("cu130torch2.14cxx11abiTRUE", ("cu130", "2.14", True, None)),
        ("cu130torch2.14cxx11abitrue.infer", ("cu130", "2.14", True, "infer")),
        ("cu128torch2.8cxx11abiFALSE", ("cu128", "2.8", False, None)),
        ("rocm6.4torch2.8cxx11abiTRUE.triton", ("rocm6.4", "2.8", True, "triton")),
    ],
)
def test_parse_local(local: str, parsed: tuple[Any, ...]) -> None:
    p = parse_local(local)
    assert p is not None and (p.accel, p.torch_family, p.cxx11_abi, p.profile_tag) == parsed


@pytest.mark.parametrize("local", ["", "cpu", "cu130torch2.14", "cu130torch2.14cxx11abiTRUE.Bad-Tag"])
def test_parse_local_rejects_others(local: str) -> None:
    assert parse_local(local) is None


def test_torch_pin_is_the_release_family() -> None:
    assert torch_family("2.14.1+cu130") == "2.14"
    assert torch_requirement("2.8.0") == "torch==2.8.*"


def test_profile_tag_from_the_build_when_the_manifest_has_none() -> None:
    data = manifest(profile="inference")  # profile `inference` has `tag: infer` in matrix.yaml
    assert expected_names(data).local_version.endswith(".inference")  # nothing says otherwise
    built = "cu130torch2.14cxx11abiTRUE.infer"  # what FLASH_ATTN_LOCAL_VERSION made the build say
    assert expected_names(data, built).local_version == built
