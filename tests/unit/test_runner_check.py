"""`attnforge runner check` against recorded tool outputs (tests/data/runner/): real parsers, real rules."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.core.arches import arch_runs_on, sm_of_compute_cap
from attnforge.matrix.cell import Cell
from attnforge.matrix.compat import CompatData, load_compat
from attnforge.matrix.project import Project
from attnforge.runner.check_report import RunnerReport, SmokeRequest, run_checks
from attnforge.runner.checks import CheckOptions, driver_floor, driver_tuple
from attnforge.runner.gpus import parse_amd_smi, parse_nvidia_csv, parse_rocm_smi
from attnforge.runner.host import ReplayHost

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "runner"
COMPAT = DATA / "compat_runner.toml"


@pytest.fixture(scope="module")
def compat() -> CompatData:
    return load_compat(str(COMPAT))


def cells_of(target: str) -> list[Cell]:
    return Project(ROOT / "matrix.yaml", str(COMPAT)).plan(target).valid


def check(
    scenario: str, target: str | None, compat: CompatData, tmp_path: Path, **kw: object
) -> tuple[RunnerReport, ReplayHost]:
    host = ReplayHost(DATA / scenario)
    smoke = kw.pop("smoke", None)
    opts = CheckOptions(
        target=target,
        cells=cells_of(target) if target else [],
        compat=compat,
        cache_dir=tmp_path / "cache",
        pythons=["/usr/bin/python3"],
        **kw,  # type: ignore[arg-type]
    )
    return run_checks(host, opts, smoke if isinstance(smoke, SmokeRequest) else None), host


def by_name(report: RunnerReport) -> dict[str, dict[str, object]]:
    return {c["name"]: c for c in report.to_json()["checks"]}


# ---------------------------------------------------------------- parsers


def test_nvidia_csv_parses_name_with_commas_and_memory() -> None:
    gpus = parse_nvidia_csv(
        "580.65.06, NVIDIA H100 80GB HBM3, 9.0, 81559 MiB\n550.1, Weird, Name, 12.0, [N/A]\n"
    )
    assert [(g.name, g.arch, g.compute_cap, g.memory_mib) for g in gpus] == [
        ("NVIDIA H100 80GB HBM3", "sm_90", "9.0", 81559),
        ("Weird, Name", "sm_120", "12.0", None),
    ]
    assert gpus[1].index == 1 and gpus[0].driver == "580.65.06"


def test_amd_smi_both_shapes_and_rocm_smi_after_warning() -> None:
    new = parse_amd_smi((DATA / "documented-mi300x-amdsmi" / "amd-smi-static.json").read_text())
    assert [(g.index, g.arch, g.memory_mib, g.driver) for g in new] == [
        (0, "gfx942", 196592, "6.8.5"),
        (1, "gfx942", 196592, "6.8.5"),
    ]
    old = parse_amd_smi(
        '[{"gpu": 0, "asic": {"market_name": "X", "target_graphics_version": "gfx1100"},'
        ' "vram": {"vram_size": 24560}, "driver": {"driver_version": "6.3.6"}}]'
    )
    assert (old[0].arch, old[0].memory_mib, old[0].driver) == ("gfx1100", 24560, "6.3.6")
    gpus, driver = parse_rocm_smi(
        (DATA / "documented-mi250-rocmsmi-nokfd" / "rocm-smi-productname.json").read_text()
    )
    assert [g.arch for g in gpus] == ["gfx90a", "gfx90a"] and driver == "6.7.0"


def test_arch_rules() -> None:
    assert sm_of_compute_cap("9.0") == "sm_90" and sm_of_compute_cap("12.0") == "sm_120"
    assert arch_runs_on("sm_90", "sm_90") and arch_runs_on("sm_80", "sm_86")
    assert not arch_runs_on("sm_86", "sm_80") and not arch_runs_on("sm_80", "sm_90")
    assert arch_runs_on("sm_90a", "sm_90") and not arch_runs_on("sm_90a", "sm_91")
    assert arch_runs_on("gfx942", "gfx942") and not arch_runs_on("gfx90a", "gfx942")


def test_driver_floor_prefers_driver_rows_then_toolkit_rows(compat: CompatData) -> None:
    assert driver_floor(13, compat)[0] == "580"
    assert driver_floor(12, compat)[0] == "525.60.13"
    no_rows = compat.model_copy(update={"driver": []})
    assert driver_floor(12, no_rows)[0] == "535.54.03"  # lowest 12.x toolkit driver in the table
    assert driver_tuple("580.65.06") > driver_tuple("580") > driver_tuple("575.57.08")


# ---------------------------------------------------------------- decisions


def test_h100_without_docker_passes_with_docker_warnings(compat: CompatData, tmp_path: Path) -> None:
    report, _ = check("documented-h100-cuda13-nodocker", "default", compat, tmp_path)
    data = report.to_json()
    assert {"device", "driver", "gpus", "checks", "smoke"} <= set(data)
    assert data["device"] == "1x NVIDIA H100 80GB HBM3" and data["driver"] == "580.65.06"
    assert data["driver_cuda"] == "13.0"
    assert data["smoke"]["passed"] == 0 and data["smoke"]["failed"] == 0 and not data["smoke"]["ran"]
    checks = by_name(report)
    assert checks["driver-cuda13"]["ok"] and checks["gpu0-arch"]["ok"] and checks["cells"]["ok"]
    assert checks["docker-engine"]["status"] == "warn" and not checks["docker-engine"]["blocking"]
    assert "not checked" in str(checks["gpu-container-runtime"]["detail"])
    assert checks["torch"]["status"] == "warn"  # torch 2.11 here, the default cell is torch 2.14
    assert not report.blocking
    assert data["labels"] == ["self-hosted", "linux", "x64", "gpu", "sm90", "cuda13"]
    assert data["max_jobs"] >= 1 and data["testable_cells"] == [c.id for c in cells_of("default")]


def test_require_docker_makes_docker_blocking(compat: CompatData, tmp_path: Path) -> None:
    report, _ = check("documented-h100-cuda13-nodocker", "default", compat, tmp_path, require_docker=True)
    assert {c.name for c in report.blocking} == {"docker-engine", "gpu-container-runtime"}


def test_old_driver_blocks_a_cuda13_only_target(compat: CompatData, tmp_path: Path) -> None:
    report, _ = check("documented-h100x2-cuda12-driver", "default", compat, tmp_path)
    assert {c.name for c in report.blocking} == {"driver-cuda13", "cells"}
    assert "cuda13" not in report.labels


def test_old_driver_still_runs_the_cuda12_cells_of_a_mixed_target(compat: CompatData, tmp_path: Path) -> None:
    report, _ = check("documented-h100x2-cuda12-driver", "nightly", compat, tmp_path)
    checks = by_name(report)
    assert checks["driver-cuda12"]["ok"]
    assert "minor-version compatibility" in str(checks["driver-cuda12"]["detail"])  # 12.8 wants 570.26
    assert checks["driver-cuda13"]["status"] == "warn" and not checks["driver-cuda13"]["blocking"]
    assert not report.blocking
    assert report.labels[-2:] == ["sm90", "cuda12"]
    assert len(report.testable) == 2 and all("cu128" in c for c in report.testable)
    assert report.to_json()["gpus"][1]["index"] == 1


def test_docker_gpu_runtime_with_an_image(compat: CompatData, tmp_path: Path) -> None:
    report, host = check(
        "documented-h100x2-cuda12-driver", "nightly", compat, tmp_path, docker_image="local/cuda"
    )
    checks = by_name(report)
    assert checks["docker-engine"]["ok"] and checks["gpu-container-runtime"]["ok"]
    assert "2 GPU" in str(checks["gpu-container-runtime"]["detail"])
    assert ["docker", "run", "--rm", "--gpus", "all", "local/cuda", "nvidia-smi", "-L"] in host.calls


def test_gpu_arch_in_no_cell_warns_and_blocks_when_nothing_is_testable(
    compat: CompatData, tmp_path: Path
) -> None:
    report, _ = check("documented-rtx4090-sm89", "default", compat, tmp_path, min_free_gb=50)
    checks = by_name(report)
    assert checks["gpu0-arch"]["status"] == "warn" and "sm_89" in str(checks["gpu0-arch"]["detail"])
    assert {c.name for c in report.blocking} == {"cells", "disk"}  # 20 GiB free < 50


def test_driver_without_compute_cap_falls_back(compat: CompatData, tmp_path: Path) -> None:
    report, host = check("documented-v100-driver470", "default", compat, tmp_path)
    assert report.found.gpus[0].name == "Tesla V100-SXM2-32GB" and report.found.gpus[0].arch == ""
    assert by_name(report)["gpu0-arch"]["status"] == "warn"
    assert [
        "nvidia-smi",
        "--query-gpu=driver_version,name,memory.total",
        "--format=csv,noheader",
    ] in host.calls
    assert {c.name for c in report.blocking} == {"driver-cuda13", "cells"}


def test_mi300x_rocm_cells_labels_and_container(compat: CompatData, tmp_path: Path) -> None:
    report, host = check("documented-mi300x-amdsmi", "release", compat, tmp_path, docker_image="local/rocm")
    checks = by_name(report)
    assert report.found.vendor == "amd" and not report.blocking
    assert checks["rocm-devices"]["ok"] and checks["gpu-container-runtime"]["ok"]
    assert report.labels == ["self-hosted", "linux", "x64", "gpu", "rocm", "gfx942"]
    assert report.testable and all("rocm" in c for c in report.testable)
    run = next(c for c in host.calls if c[:2] == ["docker", "run"])
    assert "--gpus" not in run and run[run.index("--device") + 1] == "/dev/kfd"


def test_kfd_without_permission_blocks(compat: CompatData, tmp_path: Path) -> None:
    report, _ = check("documented-mi250-rocmsmi-nokfd", "release", compat, tmp_path)
    assert report.found.gpus[0].name == "AMD Instinct MI250X"
    blocking = {c.name: c.detail for c in report.blocking}
    assert "rocm-devices" in blocking and "render" in blocking["rocm-devices"]


def test_no_gpu_blocks(compat: CompatData, tmp_path: Path) -> None:
    report, _ = check("documented-no-gpu", "default", compat, tmp_path)
    assert {c.name for c in report.blocking} == {"gpus", "cells"}
    assert report.device == "no GPU" and "gpu" not in report.labels


def test_without_a_matrix_cell_checks_are_skipped(compat: CompatData, tmp_path: Path) -> None:
    report, _ = check("documented-h100-cuda13-nodocker", None, compat, tmp_path)
    assert by_name(report)["cells"]["status"] == "skip" and not report.blocking


# ---------------------------------------------------------------- smoke (recorded script output)


def test_smoke_pass_is_recorded(compat: CompatData, tmp_path: Path) -> None:
    wheel = tmp_path / "flash_attn-2.8.3+cu130torch2.11cxx11abiTRUE.fwd128-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"")
    report, host = check("documented-h100-smoke-pass", "default", compat, tmp_path, smoke=SmokeRequest(wheel))
    smoke = report.to_json()["smoke"]
    assert (smoke["passed"], smoke["failed"], smoke["ran"]) == (1, 0, True)
    assert by_name(report)["smoke"]["ok"] and not report.blocking
    venv = next(c for c in host.calls if "venv" in c)
    assert "--system-site-packages" in venv
    link = next(c for c in host.calls if any("_attnforge_base.pth" in a for a in c))
    assert link[-1] == "/opt/torch/.venv/lib/python3.12/site-packages"  # torch's own venv, chained
    assert any(c[-1] == str(wheel) and "--no-deps" in c for c in host.calls)


def test_smoke_import_error_fails_and_names_the_torch_pin(compat: CompatData, tmp_path: Path) -> None:
    wheel = tmp_path / "x.whl"
    wheel.write_bytes(b"")
    report, _ = check(
        "documented-h100-smoke-import-error", "default", compat, tmp_path, smoke=SmokeRequest(wheel)
    )
    smoke = report.to_json()["smoke"]
    assert (smoke["passed"], smoke["failed"]) == (0, 1)
    assert [c.name for c in report.blocking] == ["smoke"]
    assert "undefined symbol" in smoke["detail"] and "torch==2.14.*" in smoke["detail"]


# ---------------------------------------------------------------- CLI


def test_cli_writes_the_report_and_exit_codes(
    run_cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    out = tmp_path / "runner_check.json"
    base = ["--compat", str(COMPAT), "runner", "check", "--matrix", str(ROOT / "matrix.yaml")]
    code, stdout, _ = run_cli(
        *base,
        "--target",
        "default",
        "--json",
        str(out),
        "--cache-dir",
        str(tmp_path),
        "--replay",
        str(DATA / "documented-h100-cuda13-nodocker"),
    )
    assert code == 0, stdout
    data = json.loads(out.read_text())
    assert list(data)[:5] == ["schema", "device", "driver", "gpus", "checks"] and "smoke" in data
    assert "--labels gpu,sm90,cuda13" in stdout
    code, _, err = run_cli(*base, "--target", "default", "--replay", str(DATA / "documented-no-gpu"))
    assert code == 5 and "gpus" in err
    wheel = tmp_path / "x.whl"
    wheel.write_bytes(b"")
    code, _, err = run_cli(
        *base,
        "--target",
        "default",
        "--smoke-wheel",
        str(wheel),
        "--cache-dir",
        str(tmp_path),
        "--replay",
        str(DATA / "documented-h100-smoke-import-error"),
    )
    assert code == 6 and "smoke" in err


def test_captured_device_machine_with_the_packaged_tables(tmp_path: Path) -> None:
    """Outputs captured on the project's H100 machine, decided with the packaged compat tables."""
    project = Project(ROOT / "matrix.yaml")
    host = ReplayHost(DATA / "captured-h100-device")
    opts = CheckOptions(
        target="default",
        cells=project.plan("default").valid,
        compat=project.compat,
        cache_dir=tmp_path,
        min_free_gb=50,
        pythons=["/tmp/af/bin/python", "python3"],
    )
    report = run_checks(host, opts)
    data = report.to_json()
    assert not report.blocking, [c.detail for c in report.blocking]
    assert (data["device"], data["driver"], data["driver_cuda"]) == (
        "1x NVIDIA H100 80GB HBM3",
        "580.159.04",
        "13.0",
    )
    assert data["labels"] == ["self-hosted", "linux", "x64", "gpu", "sm90", "cuda13"]
    assert data["torch"]["executable"] == "/opt/torch/.venv/bin/python3"  # the second candidate has torch
    assert by_name(report)["driver-cuda13"]["ok"]
