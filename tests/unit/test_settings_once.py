"""Build settings are resolved once, in one function (`engine.settings.resolve_settings`), in one order
(command line, environment, matrix, then measured/auto), and a dry run prints each one with its source.

The resolver and the chooser are spied on wherever a module imported them, then a real `attnforge build
--dry-run` and the `images build --dry-run` lines of an NGC image run through them."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from attnforge.builder import parallelism
from attnforge.builder.exits import EXIT_CONFIG, BuildFailure
from attnforge.builder.settings import BuildSettings
from attnforge.builder.spec import BuildSpec
from attnforge.engine import settings as settings_mod
from attnforge.engine.backends.pipplan import plan_pip
from attnforge.engine.resources import JobMemoryTable
from attnforge.engine.settings import parallel_cells_of
from attnforge.images.build_inputs import dry_run_lines
from attnforge.images.ngc import NGC_IMAGE_TEMPLATE
from attnforge.images.ngc_image import ngc_request, ngc_settings
from attnforge.images.requests import ImageRequest
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import NgcRelease
from attnforge.matrix.project import Project
from attnforge.matrix.schema import ResourcesSpec

ROOT = Path(__file__).resolve().parents[2]
NGC_ROW = NgcRelease(release="25.06", torch="2.8.0a0+5228986c39", cuda="12.9", python="3.12", source="t")


def _spy_everywhere(monkeypatch: pytest.MonkeyPatch, real: Any, seen: list[str]) -> None:
    """Replace `real` in every loaded attnforge module that holds it; each call records its caller's name."""

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(inspect.stack()[1].function)
        return real(*args, **kw)

    for name, module in list(sys.modules.items()):
        if name.startswith("attnforge") and getattr(module, real.__name__, None) is real:
            monkeypatch.setattr(module, real.__name__, spy)


@pytest.fixture()
def spied(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    import attnforge.cli.commands.build
    import attnforge.runner.checks  # noqa: F401

    seen: dict[str, list[str]] = {"resolve": [], "choose": []}
    _spy_everywhere(monkeypatch, settings_mod.resolve_settings, seen["resolve"])
    _spy_everywhere(monkeypatch, parallelism.choose_parallelism, seen["choose"])
    return seen


def _project(tmp_path: Path, **resources: object) -> Path:
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"]["cache_dir"] = str(tmp_path / "cache")
    data["build"]["backend"] = "local"
    data["build"].setdefault("resources", {}).update(resources)
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_dry_run_resolves_each_cell_once_and_prints_the_sources(
    spied: dict[str, list[str]], tmp_path: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = _project(tmp_path, nvcc_threads=1)
    cells = Project(matrix).plan("default").valid
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.delenv("NVCC_THREADS", raising=False)
    code, out, err = run_cli("--matrix", str(matrix), "build", "-t", "default", "--dry-run")
    assert code == 0, err
    assert len(spied["resolve"]) == len(cells) >= 1  # once per cell, and by nobody else
    assert spied["choose"] == ["resolve_settings"] * len(cells)  # the chooser only through the resolver
    lines = [ln for ln in (out + err).splitlines() if "settings: " in ln]
    assert len(lines) == len(cells)
    assert "nvcc_threads=1 (matrix)" in lines[0] and "max_jobs=" in lines[0] and "(auto: " in lines[0]

    spied["resolve"].clear()
    monkeypatch.setenv("MAX_JOBS", "3")
    code, out, err = run_cli(
        "--matrix", str(matrix), "build", "-t", "default", "--dry-run", "--nvcc-threads", "2"
    )
    assert code == 0, err
    assert "max_jobs=3 (environment)" in out + err and "nvcc_threads=2 (command line)" in out + err
    code, out, err = run_cli(
        "--matrix", str(matrix), "build", "-t", "default", "--dry-run", "--max-jobs", "5"
    )
    assert "max_jobs=5 (command line)" in out + err  # the command line before the environment
    assert len(spied["resolve"]) == 2 * len(cells)


def test_the_matrix_comes_before_measuring(spied: dict[str, list[str]], tmp_path: Path, run_cli: Any) -> None:
    matrix = _project(tmp_path, max_jobs=7, memory_per_job_gb=1.5)
    code, out, err = run_cli("--matrix", str(matrix), "build", "-t", "default", "--dry-run")
    assert code == 0, err
    assert "max_jobs=7 (matrix)" in out + err and "(matrix)" in out + err.split("job_memory=")[1]


def _ngc_template(project: Project) -> Cell:
    return Cell(
        kernel="flash-attn",
        kernel_version="2.8.3",
        toolkit=Toolkit("cuda", "12.9"),
        torch="2.8.0",
        python="3.12",
        cxx11_abi=True,
        arches=("sm_90",),
        profile="full",
        torch_variant="cu129",
        profile_spec=project.matrix.profiles["full"],
    )


def test_an_image_build_plan_resolves_once_and_follows_the_matrix(
    spied: dict[str, list[str]], tmp_path: Path
) -> None:
    project = Project(_project(tmp_path, max_jobs=5))
    template = _ngc_template(project)
    request = ngc_request(template, [NGC_ROW], image_template=NGC_IMAGE_TEMPLATE, policy="replace")
    assert isinstance(request, ImageRequest), request
    lines = dry_run_lines(
        [request],
        repository="r",
        pip_plan=plan_pip(torch_index=None, options=None, extra_index_urls=[]),
        ca_bundle=None,
        netrc=None,
        resources=project.matrix.build.resources,
    )
    said = [ln for ln in lines if "settings: " in ln]
    assert len(said) == 1 and "max_jobs=5 (matrix)" in said[0]
    assert "nvcc_threads=1 (image build: one nvcc thread)" in said[0]  # no longer a fixed 2 jobs
    assert spied["resolve"] == ["ngc_settings"] and spied["choose"] == ["resolve_settings"]


def test_the_spec_carries_the_settings_and_the_builder_does_not_resolve_again(
    spied: dict[str, list[str]], tmp_path: Path
) -> None:
    project = Project(_project(tmp_path))
    template = _ngc_template(project)
    settings = ngc_settings(template)
    assert isinstance(settings, BuildSettings)
    spec = BuildSpec.from_json(SPEC).with_settings(settings)
    back = BuildSpec.from_json(spec.to_json())
    assert back.settings == settings and back.max_jobs == settings.max_jobs
    spied["choose"].clear()
    assert parallelism.builder_settings(back.settings, back.max_jobs, back.nvcc_threads) is back.settings
    assert spied["choose"] == []  # carried settings: nothing measured again inside the container
    oom = settings.adjusted("a compiler was killed for memory (OOM)", max_jobs=1)
    assert oom.max_jobs == 1 and "at run time: a compiler was killed" in oom.source("max_jobs")


def test_parallel_cells_from_the_command_line_then_the_matrix_then_planned() -> None:
    assert parallel_cells_of(3, ResourcesSpec(parallel_cells=2)) == 3
    assert parallel_cells_of(None, ResourcesSpec(parallel_cells=2)) == 2
    assert parallel_cells_of(None, ResourcesSpec()) is None  # the engine plans it from unit estimates


def test_a_choice_that_does_not_fit_says_so_with_its_numbers(tmp_path: Path) -> None:
    project = Project(_project(tmp_path, max_jobs=6))
    tight = settings_mod.resolve_settings(
        project.plan("default").valid[0],
        project.matrix.build.resources,
        machine=parallelism.Machine(2, 4.0, "test"),
        table=JobMemoryTable(),
    )
    assert not tight.fits and tight.source("max_jobs") == "matrix"
    assert "; WARNING: 6 job(s) need" in tight.line() and "GiB available" in tight.line()


SPEC = {
    "cell_id": "c",
    "kernel": "flash-attn",
    "kernel_version": "2.8.3",
    "source": {"path": "/s.tar.gz", "sha256": "0" * 64},
    "python": "3.12",
    "torch": "2.8.0",
    "build_dir": "/b",
    "venv_dir": "/v",
    "output_dir": "/o",
}


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"max_jobs": 0, "nvcc_threads": 1, "job_memory_gb": 4.5}, "spec.settings: max_jobs: 0 is not"),
        ({"max_jobs": 2, "nvcc_threads": True, "job_memory_gb": 4.5}, "spec.settings: nvcc_threads: True"),
        ({"max_jobs": 2, "nvcc_threads": 1, "job_memory_gb": "4"}, "spec.settings: job_memory_gb: '4'"),
        ({"max_jobs": 2, "nvcc_threads": 1, "job_memory_gb": 4, "x": 1}, "spec.settings: unknown key 'x'"),
        ([2], "spec.settings: must be a JSON object"),
        (
            {"max_jobs": 2, "nvcc_threads": 1, "job_memory_gb": 4},
            "spec.settings (max_jobs 2, nvcc_threads 1)",
        ),
    ],
)
def test_a_spec_with_bad_settings_is_refused_naming_them(settings: object, said: str) -> None:
    with pytest.raises(BuildFailure) as err:
        BuildSpec.from_json({**SPEC, "settings": settings})
    assert err.value.code == EXIT_CONFIG and said in str(err.value)
