"""NGC images without Docker: the release a cell gets, the cell and builder spec made for a probed NGC base
(a real NGC-shaped torch `2.8.0a0+5228986c39`, and the stand-in's relabelled CPU torch), the exact torch pin
finalize gives such a wheel, the source archive handed to the builder, and docker/ngc.Dockerfile's stages
against the paths the spec uses. The Docker run itself: tests/integration/test_images_build.py."""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from email import message_from_bytes
from pathlib import Path

import pytest

from attnforge.builder.compiler import nvcc_problem
from attnforge.builder.patches import resolve_patches
from attnforge.builder.report import Reporter
from attnforge.builder.source import prepare_tree
from attnforge.builder.spec import BuildSpec, Source
from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.core.package_files import packaged_docker_dir
from attnforge.engine.environment import Env
from attnforge.engine.settings import Requested
from attnforge.images import ngc_image
from attnforge.images.ngc import NGC_IMAGE_TEMPLATE, STANDIN_TEMPLATE, BaseFacts
from attnforge.images.ngc_image import (
    apply_ngc_facts,
    ngc_request,
    ngc_settings,
    ngc_spec,
    source_archive,
    template_of,
)
from attnforge.images.requests import ImageRequest, Skipped
from attnforge.images.standin import standin_torch_version
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import NgcRelease
from attnforge.matrix.project import Project
from attnforge.wheels.finalize import _rewrite_metadata
from attnforge.wheels.manifest import manifest_inputs
from attnforge.wheels.naming import expected_names, parse_local

ROOT = Path(__file__).resolve().parents[2]
MINI_FA = ROOT / "tests" / "integration" / "data" / "mini_flash_attn"
NGC_TORCH = "2.8.0a0+5228986c39"
NGC_ROWS = [
    NgcRelease(release="25.01", torch="2.6.0a0+ecf3bae40a", cuda="12.8", python="3.12", source="t"),
    NgcRelease(release="25.06", torch=NGC_TORCH, cuda="12.9", python="3.12", source="t"),
    NgcRelease(release="25.08", torch="2.8.0a0+34c6371d24", cuda="12.9", python="3.12", source="t"),
]
STANDIN_ROW = NgcRelease(release="99.09", torch="2.13.0a0+standin", cuda="13.0", python="3.11", source="t")


@pytest.fixture(scope="module")
def project() -> Project:
    return Project(ROOT / "matrix.yaml")


def template(project: Project, profile: str = "full", **kw: object) -> Cell:
    base: dict[str, object] = dict(
        kernel="flash-attn",
        kernel_version="2.8.3",
        toolkit=Toolkit("cuda", "12.9"),
        torch="2.8.0",
        python="3.12",
        cxx11_abi=True,
        arches=("sm_90",),
        profile=profile,
        torch_variant="cu129",
        profile_spec=project.matrix.profiles[profile],
    )
    base.update(kw)
    return Cell(**base)  # type: ignore[arg-type]


def facts(
    torch: str = NGC_TORCH, accel: str | None = "cu129", python: str = "3.12", **kw: object
) -> BaseFacts:
    env = Env(
        python=python,
        machine="x86_64",
        glibc=(2, 39),
        torch=torch,
        accel=accel,
        cxx11_abi=True,
        gpus=(),
        driver_cuda=None,
    )
    base: dict[str, object] = dict(
        env=env,
        executable="/usr/bin/python",
        cuda="12.9" if accel else None,
        flash_attn="2.7.4.post1",
        constraint="/etc/pip/constraint.txt",
        pins=("torch==" + torch, "flash-attn==2.7.4.post1"),
        standin=False,
    )
    base.update(kw)
    return BaseFacts(**base)  # type: ignore[arg-type]


def quiet(_: str) -> None:
    return None


def test_release_is_the_newest_fit_and_a_miss_says_why(project: Project) -> None:
    req = ngc_request(template(project), NGC_ROWS, image_template=NGC_IMAGE_TEMPLATE, policy="replace")
    assert isinstance(req, ImageRequest)
    assert req.ngc is not None and req.ngc.release == "25.08"
    assert req.spec.tag == "flash-attn2.8.3-ngc25.08-py3.12"
    assert req.ngc_image == "nvcr.io/nvidia/pytorch:25.08-py3"
    skipped = ngc_request(
        template(project, toolkit=Toolkit("cuda", "13.0"), torch="2.14.1"),
        NGC_ROWS,
        image_template="{release}",
        policy="replace",
    )
    assert isinstance(skipped, Skipped) and "no NGC release pairs torch 2.14 with CUDA 13.0" in skipped.why
    fa3 = ngc_request(
        template(project, kernel="flash-attn-3"), NGC_ROWS, image_template="{release}", policy="keep"
    )
    assert isinstance(fa3, Skipped) and "flash-attn (FA2) only" in fa3.why


def test_a_head_dim_profile_gets_an_image_now(project: Project) -> None:
    """The builder applies attnforge's patches on the base: a head-dim profile is no longer skipped."""
    req = ngc_request(template(project, "hd128"), NGC_ROWS, image_template="{release}", policy="replace")
    assert isinstance(req, ImageRequest)
    assert req.spec.tag == "flash-attn2.8.3-ngc25.08-hd128-py3.12"


def test_cell_and_spec_for_a_real_ngc_torch(project: Project) -> None:
    """NGC's `2.8.0a0+<sha>`: the env cell names the build (`.pt<slug>`), the spec builds with the base's own
    python and torch (no venv, no shared objects), the profile's patches apply, and finalize pins exactly."""
    req = ngc_request(
        template(project, "hd128"),
        NGC_ROWS,
        image_template=NGC_IMAGE_TEMPLATE,
        policy="replace",
        release="25.06",
    )
    assert isinstance(req, ImageRequest)
    req = apply_ngc_facts(req, facts(), project, quiet)
    cell = req.cell
    assert cell is not None
    assert (cell.torch, cell.torch_build, cell.torch_variant) == ("2.8.0a0", NGC_TORCH, "cu129")
    assert cell.local_version == "cu129torch2.8cxx11abiTRUE.pt280a05228986c39.hd128"
    assert cell.variant == "cu129-torch2.8-pt280a05228986c39"
    assert req.spec.dist_version == f"2.8.3+{cell.local_version}"
    assert req.spec.torch == NGC_TORCH and req.spec.profile_tag == "hd128"
    assert req.expect == {
        "torch": NGC_TORCH,
        "flash_attn": req.spec.dist_version,
        "policy": "replace",
        "bundled": "2.7.4.post1",
        "kind": "ngc",
    }
    assert "re-pinned to ours" in req.spec.extra_labels["io.attnforge.ngc.constraint"]
    assert "io.attnforge.standin" not in req.spec.extra_labels

    src = Source(path=f"{ngc_image.MOUNT}/source/flash_attn-2.8.3.tar.gz", sha256="0" * 64)
    spec = ngc_spec(cell, facts(), src, ngc_settings(cell, Requested.of(max_jobs=3)))
    assert spec.use_interpreter and spec.python == "/usr/bin/python" and spec.torch == NGC_TORCH
    assert spec.torch_variant == "cu129" and spec.local_version == cell.local_version
    assert spec.head_dims == [128] and spec.arches == ["sm_90"] and spec.max_jobs == 3
    assert spec.kernel_objects_dir is None and spec.ccache_dir is None
    assert spec.output_dir == ngc_image.OUT
    assert all(p.startswith(ngc_image.WORK) for p in (spec.build_dir, spec.venv_dir))
    assert BuildSpec.from_json(json.loads(spec.dumps())) == spec
    assert resolve_patches(spec) == ["torch-free-kernels", "setup-hooks", "dispatch-subset"]

    manifest = {
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "local_version": cell.local_version,
        "variant": cell.variant,
        "inputs": manifest_inputs(cell),
    }
    names = expected_names(manifest)
    assert (names.local_version, names.variant) == (cell.local_version, cell.variant)
    assert names.torch_requirement == f"torch=={NGC_TORCH}"
    meta = _rewrite_metadata(
        message_from_bytes(
            b"Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3\nRequires-Dist: torch\n\n"
        ),
        names,
        [],
    )
    assert f"Requires-Dist: torch=={NGC_TORCH}".encode() in meta
    parts = parse_local(cell.local_version)
    assert parts is not None and (parts.torch_build, parts.profile_tag) == ("280a05228986c39", "hd128")
    assert parts.variant == cell.variant


def test_full_profile_spec_applies_only_the_torch_free_kernels_patch(project: Project) -> None:
    """No profile patch; the kernel units still go torch-free like every flash-attn 2.8.3 CUDA cell
    (rule `shared-kernels`), so an NGC wheel compiles the same kernel code as the matrix's wheels."""
    req = ngc_request(
        template(project), NGC_ROWS, image_template="{release}", policy="replace", release="25.06"
    )
    assert isinstance(req, ImageRequest)
    req = apply_ngc_facts(req, facts(), project, quiet)
    assert req.cell is not None
    spec = ngc_spec(req.cell, facts(), Source(path="/x.tar.gz", sha256="0" * 64), ngc_settings(req.cell))
    assert resolve_patches(spec) == ["torch-free-kernels"] and spec.disable == [] and spec.head_dims is None


def test_standin_cell_takes_its_rows_cuda_and_expects_a_cpu_torch(project: Project) -> None:
    """The stand-in's relabelled CPU torch: toolkit from its [[ngc]] row, the builder told to expect a CPU
    torch, the custom build named and labelled as a stand-in; a CPU torch in a real NGC base is refused."""
    torch = standin_torch_version("torch==2.13.0+cpu")
    assert torch == "2.13.0a0+standin"
    tmpl = template(
        project, toolkit=Toolkit("cuda", "13.0"), torch="2.13.0", python="3.11", torch_variant="cu130"
    )
    req = ngc_request(tmpl, [STANDIN_ROW], image_template=STANDIN_TEMPLATE, policy="replace")
    assert isinstance(req, ImageRequest) and req.ngc_image == "attnforge-standin/ngc-pytorch:99.09"
    standin = facts(torch, None, "3.11", standin=True, flash_attn="2.7.4+standin")
    req = apply_ngc_facts(req, standin, project, quiet)
    assert req.cell is not None
    assert (str(req.cell.toolkit), req.cell.torch_variant) == ("cuda13.0", "cpu")
    assert req.cell.local_version == "cu130torch2.13cxx11abiTRUE.pt2130a0standin"
    assert req.spec.extra_labels["io.attnforge.standin"].startswith("true")
    assert (
        ngc_spec(
            req.cell, standin, Source(path="/x.tar.gz", sha256="0" * 64), ngc_settings(req.cell)
        ).torch_variant
        == "cpu"
    )
    req2 = ngc_request(tmpl, [STANDIN_ROW], image_template="{release}", policy="replace")
    assert isinstance(req2, ImageRequest)
    with pytest.raises(EnvironmentProblem, match="CPU build, not an NGC"):
        apply_ngc_facts(req2, facts(torch, None, "3.11"), project, quiet)


def test_mini_fixture_takes_the_standin_cells_patches(project: Project, tmp_path: Path) -> None:
    """The integration tests compile tests/integration/data/mini_flash_attn on the stand-in: every patch the
    builder gives that cell (torch-free-kernels, as for every flash-attn 2.8.3 CUDA cell) applies to the
    packed fixture through the builder's own unpack-and-patch step, none skipped."""
    tmpl = template(
        project, toolkit=Toolkit("cuda", "13.0"), torch="2.13.0", python="3.11", torch_variant="cu130"
    )
    req = ngc_request(tmpl, [STANDIN_ROW], image_template=STANDIN_TEMPLATE, policy="replace")
    assert isinstance(req, ImageRequest)
    standin = facts(standin_torch_version("torch==2.13.0+cpu"), None, "3.11", standin=True)
    req = apply_ngc_facts(req, standin, project, quiet)
    assert req.cell is not None
    archive = source_archive(MINI_FA, tmp_path / "ctx")
    src = Source(path=str(archive), sha256=hashlib.sha256(archive.read_bytes()).hexdigest())
    spec = ngc_spec(req.cell, standin, src, ngc_settings(req.cell)).replace(build_dir=str(tmp_path / "build"))
    names = resolve_patches(spec)
    assert "torch-free-kernels" in names
    tree = prepare_tree(spec, archive, names, Reporter(None))
    flash_h = (tree / "csrc" / "flash_attn" / "src" / "flash.h").read_text()
    assert "attnforge::PhiloxCudaState philox_args;" in flash_h and "ATen/" not in flash_h
    assert (tree / "csrc" / "flash_attn" / "src" / "attnforge_torch_bridge.h").is_file()


def test_keep_policy_names_ngcs_build(project: Project) -> None:
    req = ngc_request(template(project), NGC_ROWS, image_template="{release}", policy="keep", release="25.06")
    assert isinstance(req, ImageRequest)
    req = apply_ngc_facts(req, facts(), project, quiet)
    assert req.cell is None and req.spec.dist_version == "2.7.4.post1" and req.spec.profile_tag == "bundled"
    assert req.manifest["kind"] == "ngc-bundled"
    assert req.spec.extra_labels["io.attnforge.ngc.constraint"].endswith("unchanged")


def test_template_of_a_manifest_takes_the_matrix_profile(project: Project) -> None:
    manifest = {
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "wheel": "w.whl",
        "inputs": {
            "toolkit": "cuda12.9",
            "torch": "2.8.0",
            "python": "3.12",
            "cxx11_abi": True,
            "arches": ["sm_90"],
            "profile": "inference",
            "patches": [],
            "source_sha256": "ab",
        },
    }
    cell = template_of(manifest, dict(project.matrix.profiles))
    assert cell.profile == "inference" and "backward" in cell.profile_spec.disable
    assert cell.source_sha256 == "ab" and cell.local_version.endswith(".infer")
    manifest["inputs"]["profile"] = "nosuch"
    with pytest.raises(ConfigurationError, match="not in the matrix"):
        template_of(manifest, dict(project.matrix.profiles))


def test_source_folder_is_packed_reproducibly(tmp_path: Path) -> None:
    src = tmp_path / "mini"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    (src / "build").mkdir()
    a = source_archive(src, tmp_path / "a")
    b = source_archive(src, tmp_path / "b")
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    with tarfile.open(a) as tar:
        names = tar.getnames()
    assert names == ["src", "src/pkg", "src/pkg/__init__.py", "src/setup.py"]
    sdist = tmp_path / "flash_attn-2.8.3.tar.gz"
    sdist.write_bytes(a.read_bytes())
    assert source_archive(sdist, tmp_path / "c").read_bytes() == a.read_bytes()
    with pytest.raises(ConfigurationError, match="folder or an sdist"):
        source_archive(tmp_path / "setup.cfg", tmp_path / "d")


def test_dockerfile_stages_match_the_spec_paths() -> None:
    """ngc.Dockerfile: `build` mounts the context's attnforge/ where the spec's paths point and runs the
    builder with NGC's flash-attn pin filtered out; `wheel` exports OUT alone; `replace` installs from
    wheels/; `keep` touches nothing."""
    text = (packaged_docker_dir() / "ngc.Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", text, re.MULTILINE)
    assert stages == [
        ("${NGC_IMAGE}", "build"),
        ("scratch", "wheel"),
        ("${NGC_IMAGE}", "keep"),
        ("${NGC_IMAGE}", "replace"),
    ]
    build = text.split(" AS build\n")[1].split("\nFROM ")[0]
    assert f"source=attnforge,target={ngc_image.MOUNT}" in build
    assert (
        "PIP_CONSTRAINT=/tmp/attnforge-constraint.txt" in build
        and "python -m builder --spec spec.json" in build
    )
    assert f"rm -rf {ngc_image.WORK}" in build
    assert f"COPY --from=build {ngc_image.OUT}/ /" in text
    replace_stage = text.split(" AS replace\n")[1]
    assert (
        "source=wheels,target=/tmp/attnforge-wheels" in replace_stage and "torch unchanged" in replace_stage
    )


@pytest.mark.parametrize(
    ("torch", "nvcc", "problem"),
    [
        ({"torch": "2.13.0+cpu", "cuda": None}, None, None),  # a CPU torch builds C++ extensions only
        ({"torch": "2.8.0", "cuda": None, "hip": "6.4"}, None, None),
        ({"torch": "2.11.0+cu130", "cuda": "13.0"}, None, "no nvcc under CUDA_HOME=/usr/local/cuda"),
        ({"torch": "2.11.0+cu130", "cuda": "13.0"}, "12.9.86", "differ in major version"),
        ({"torch": "2.11.0+cu130", "cuda": "13.0"}, "13.0.48", None),
    ],
)
def test_nvcc_needed_only_by_a_cuda_torch(
    torch: dict[str, object], nvcc: str | None, problem: str | None
) -> None:
    got = nvcc_problem(torch, {"nvcc": nvcc, "gcc": "12"}, "/usr/local/cuda")
    assert (got is None) if problem is None else (got is not None and problem in got)
