"""A user's repository (a git repository holding only matrix.yaml) runs the CI `attnforge ci generate` writes.

The installed attnforge (its own wheel in a venv outside the checkout) generates the workflows there; the `run:`
steps of the CPU jobs are then executed in order as a runner would (tests/integration/actions_local.py) with a
fresh runner venv first on PATH and nothing of this checkout on it: the pull-request workflow's checks job
(validate, plan, `ci generate --check`) and its build job for the default cell, then the release workflow's
publish job to a static index. The matrix's `ci.attnforge.wheel` points the install steps at the built attnforge
wheel. The build job reuses the build cache of CI's default build (conftest `default_build`), so it costs
seconds. Steps needing a GPU, a registry, GitHub or the package index are listed with why they were not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..unit.compat_reduced import write_reduced
from .actions_local import LocalRunner
from .conftest import DefaultBuild, InstalledAttnforge

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "data" / "pypi_snapshot.json"  # PyPI as recorded on 2026-11-28
DEFAULT_CELL = "flash-attn-2.8.3-cu130-torch2.14.1-cp311-abi1-sm90-fwd128-x86_64"


def runner_env(runner_venv: Path) -> dict[str, str]:
    """This process's environment as a runner's: no PYTHONPATH, no virtualenv of this checkout on PATH (the
    runner's own venv first), no compat or matrix override."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "ATTNFORGE_COMPAT", "ATTNFORGE_MATRIX", "ATTNFORGE_SIGNING_KEY"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("GITHUB_", "RUNNER_"))}
    path = [
        p
        for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
        if not (Path(p).parent / "pyvenv.cfg").exists()
    ]
    env["PATH"] = os.pathsep.join([str(runner_venv / "bin"), *path])
    env.update({"CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "example/scratch"})
    return env


def why_not_run(job_id: str, job: dict[str, Any]) -> str:
    """Why a job of the generated workflows is not executed here."""
    runs_on = job.get("runs-on")
    if isinstance(runs_on, list) and "gpu" in runs_on:
        return "needs a self-hosted GPU runner (" + ", ".join(runs_on[4:]) + ")"
    if job_id == "images":
        return "needs a container registry (vars.ATTNFORGE_REGISTRY)"
    if job_id == "github-release":
        return "needs GitHub (gh release create)"
    if job_id == "refresh":
        return "needs the package index and the compat command (`attnforge compat --help` fails here)"
    if job_id.startswith("build-"):
        return "another target's or cell's build (hours of compile on 2 cores)"
    return "not a CPU job of this test"


def test_generated_ci_runs_in_a_users_repository(
    installed_attnforge: InstalledAttnforge, default_build: DefaultBuild, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"]["cache_dir"] = str(default_build.cache)  # CI's default build: its objects, venvs, ccache
    data["ci"] = {"attnforge": {"wheel": installed_attnforge.wheel.as_uri()}, "publish_to": "local"}
    (repo / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    for cmd in (["init", "-q", "-b", "main"], ["add", "matrix.yaml"], ["commit", "-q", "-m", "matrix"]):
        subprocess.run([*git, *cmd], cwd=repo, check=True, capture_output=True)

    gen = installed_attnforge.run("ci", "generate", cwd=repo, timeout=300)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    folder = repo / ".github" / "workflows"
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "attnforge-nightly.yml",
        "attnforge-pr.yml",
        "attnforge-refresh.yml",
        "attnforge-release.yml",
    ]
    workflows = {n: yaml.safe_load((folder / n).read_text()) for n in names}
    text = "".join((folder / n).read_text() for n in names)
    assert "nox" not in text and "-e ." not in text

    runner_venv = tmp_path / "runner-python"
    subprocess.run([sys.executable, "-m", "venv", str(runner_venv)], check=True)
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    runner = LocalRunner(repo, temp, runner_env(runner_venv))
    pr = workflows["attnforge-pr.yml"]
    (build_id,) = (j for j, job in pr["jobs"].items() if j.startswith("build-") and DEFAULT_CELL in str(job))
    ran = [
        ("attnforge-pr.yml", "checks"),
        ("attnforge-pr.yml", build_id),
        ("attnforge-release.yml", "publish"),
    ]

    failed = []
    for file, job_id in ran:
        steps = runner.run_job(workflows[file], job_id)
        failed += [s for s in steps if s.code not in (None, 0)]
        if failed:
            break
    compat = subprocess.run(
        ["attnforge", "compat", "--help"], env=runner.base_env, capture_output=True, check=False
    )
    if not failed and compat.returncode == 0:  # the compat command exists: refresh, all but the pull request
        ran.append(("attnforge-refresh.yml", "refresh"))
        # upstream moved: the repository's compat data lacks what torch 2.15 brought, and the index read is the
        # snapshot recorded from PyPI (CI never reads the live index: upstream moving must not turn it red)
        write_reduced(repo / "compat.overlay.toml")
        runner.base_env["ATTNFORGE_COMPAT_SNAPSHOT"] = str(SNAPSHOT)
        steps = runner.run_job(
            workflows["attnforge-refresh.yml"],
            "refresh",
            skip=lambda step: (
                "pushes a branch and opens a pull request on GitHub" if "gh pr" in step["run"] else ""
            ),
        )
        failed += [s for s in steps if s.code not in (None, 0)]
    not_run = [
        f"  {file} / {job_id}: not run: {why_not_run(job_id, job)}"
        for file, wf in workflows.items()
        for job_id, job in wf["jobs"].items()
        if (file, job_id) not in ran
    ]
    report = runner.report() + "\n" + "\n".join(not_run)
    print(f"\nthe generated CI in a user's repository:\n{report}")
    assert not failed, f"{failed[0].job} / {failed[0].name} failed:\n{failed[0].output[-4000:]}\n{report}"

    by_name = {(r.job, r.name): r for r in runner.results}
    assert "4 workflow(s) in" in by_name[("checks", "workflows match matrix.yaml")].output
    assert "match matrix.yaml" in by_name[("checks", "workflows match matrix.yaml")].output
    assert "default: 1 valid" in by_name[("checks", "matrix.yaml is valid")].output
    installs = [r for r in runner.results if r.name.startswith("install attnforge file:")]
    assert len(installs) == len(ran) and all("attnforge, version 0.1.0" in r.output for r in installs), report

    # the build: the default cell from CI's build cache, the same wheel
    (built,) = (repo / "wheels").glob("flash_attn-*.whl")
    # the default cell's per-torch wheel (test_build_default's stable-ABI build replaces the one in its folder)
    assert built.name.startswith("flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE.fwd128-cp311-cp311-manylinux_")
    manifest = json.loads(built.with_name(built.name + ".manifest.json").read_text())
    assert manifest["cell_id"] == DEFAULT_CELL
    # every unit (4 kernel units and the binding) and the torch venv came from CI's default build
    # the 4 kernel units and the torch venv always come from it; the binding too, unless test_build_default's
    # stable-ABI build of the same cell (same session, same cache) left its own binding in the cell's folder
    assert manifest["build"]["units_total"] == 5 and manifest["build"]["units_compiled"] <= 1, manifest[
        "build"
    ]
    assert manifest["build"]["venv_reused"] is True
    build_step = next(r for r in runner.results if r.job == build_id and r.name.startswith("build "))
    assert build_step.seconds < 240, report

    # the publish job: a static index in the repository with the wheel
    index = repo / "wheels" / "index"
    published = sorted(p.name for p in index.rglob("flash_attn-*.whl"))
    assert built.name in published, (published, report)
    assert not_run and all("not run: " in line for line in not_run)
    if (
        "attnforge-refresh.yml",
        "refresh",
    ) in ran:  # upstream moved: the overlay gained what torch 2.15 brought
        overlay = (repo / "compat.overlay.toml").read_text()
        assert 'family = "2.15"' in overlay and 'version = "3.15"' in overlay, overlay[-2000:]
        refresh = {r.name: r for r in runner.results if r.job == "refresh"}
        assert refresh["write the overlay, plan over it, regenerate the workflows"].code == 0, report
        assert refresh["open or update the pull request"].code is None, report  # not run, with why
    assert any("self-hosted GPU runner" in line for line in not_run)
