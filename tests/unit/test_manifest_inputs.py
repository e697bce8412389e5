"""One helper builds the manifest's `inputs` for wheel manifests and for NGC image requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from attnforge.builder.settings import BuildSettings
from attnforge.builder.spec import Source
from attnforge.engine.jobs import CellJob, make_spec
from attnforge.engine.wheel_record import build_manifest
from attnforge.matrix.cell import Cell
from attnforge.matrix.compat import CompatData
from attnforge.matrix.file import parse_matrix
from attnforge.matrix.plan import plan_target
from attnforge.wheels.manifest import manifest_inputs

SHA = "1" * 64
MATRIX = f"""\
version: 1
kernels:
  flash-attn: {{version: "2.8.3", source: {{sha256: "{SHA}"}}}}
profiles:
  full: {{}}
  lean: {{tag: lean, head_dims: [128], dtypes: [bf16], disable: [backward]}}
  alldims: {{tag: alldims, head_dims: [32, 64, 96, 128, 192, 256]}}
defaults: {{kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: full}}
targets:
  t:
    matrix: {{toolkit: [cuda13.0], torch: ['2.14'], python: ['3.11'], arch: [sm_90], profile: [full, lean, alldims]}}
"""


@pytest.fixture
def cells(mini_compat: CompatData) -> dict[str, Cell]:
    return {c.profile: c for c in plan_target(parse_matrix(MATRIX), "t", mini_compat).valid}


def _old_build_inputs(cell: Cell) -> dict[str, Any]:
    """build/manifest.py's `inputs` before the helper (the shape existing manifests have), plus the tag."""
    return {
        "source": "pypi-sdist",
        "source_sha256": cell.source_sha256,
        "toolkit": str(cell.toolkit),
        "torch": cell.torch,
        "torch_variant": cell.torch_variant,
        "python": cell.python,
        "cxx11_abi": cell.cxx11_abi,
        "arches": list(cell.arches),
        "profile": cell.profile,
        "profile_flags": cell.compile_flags(),
        "head_dims": cell.profile_spec.head_dims,
        "dtypes": cell.profile_spec.dtypes,
        "patches": list(cell.patches),
        "profile_tag": cell.profile_tag,  # added since: the tag its names carry, so no reader parses it
    }


def test_build_manifest_inputs_unchanged(cells: dict[str, Cell], tmp_path: Path) -> None:
    cell = cells["lean"]
    wheel = tmp_path / cell.wheel_name
    wheel.write_bytes(b"PK")
    par = BuildSettings(2, 1, 4.5, "test")
    spec = make_spec(
        cell,
        source=Source(str(tmp_path / "s.tar.gz"), "0" * 64),
        workdir=tmp_path / "w",
        objects_dir=tmp_path / "o",
        ccache_dir=tmp_path / "c",
        settings=par,
    )
    job = CellJob(cell, spec, tmp_path / "w", tmp_path / "log", par, "hash")
    manifest = build_manifest(cell, wheel, {}, job, "docker", 1.0)
    assert manifest["inputs"] == _old_build_inputs(cell)
    assert list(manifest["inputs"]) == list(_old_build_inputs(cell))  # key order too (the JSON file's)
    assert manifest["inputs"]["head_dims"] == [128] and manifest["inputs"]["dtypes"] == ["bf16"]


@pytest.mark.parametrize("profile", ["full", "lean", "alldims"])
def test_image_inputs_unchanged(cells: dict[str, Cell], profile: str) -> None:
    cell = cells[profile]
    old = {
        k: v for k, v in _old_build_inputs(cell).items() if k not in ("source", "source_sha256", "patches")
    }
    head_dims = cell.profile_spec.head_dims
    old["head_dims"] = head_dims if head_dims and set(head_dims) != {32, 64, 96, 128, 192, 256} else None
    got = manifest_inputs(cell, for_image=True)
    assert got == old and list(got) == list(old)


def test_image_inputs_read_every_head_dim_as_all(cells: dict[str, Cell]) -> None:
    assert manifest_inputs(cells["alldims"])["head_dims"] == [32, 64, 96, 128, 192, 256]
    assert manifest_inputs(cells["alldims"], for_image=True)["head_dims"] is None
    assert manifest_inputs(cells["lean"], for_image=True)["head_dims"] == [128]
