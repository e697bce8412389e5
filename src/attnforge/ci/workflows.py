"""GitHub Actions workflows from matrix.yaml: one build job per kernel-set, GPU parity, publish, images.

Four roles, one file each, every one built from a matrix target:
- ``pr``: pull requests and pushes to the default branch (lint, tests, the workflows' sync check, builds,
  parity on self-hosted GPU runners but never for pull requests from forks);
- ``release``: tags ``v*``: builds, parity, then publish to the private index, a GitHub release and images;
- ``nightly``: a scheduled re-validation: builds, parity, and ``runner check`` on every GPU runner class;
- ``refresh``: a weekly ``compat refresh``: a pull request with the compat overlay when upstream moved.

In a user's repository the steps install a pinned attnforge and call it; attnforge's own repository
(``ci.mode: self``) runs its nox sessions (ci/invocation.py).

The output is a pure function of the plan and the settings (sorted jobs, stable text), so a test can
regenerate it and compare with the checked-in files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from attnforge.ci.invocation import Invocation
from attnforge.ci.refresh_job import refresh_job
from attnforge.ci.release_jobs import (
    checks_job,
    gpu_setup,
    images_job,
    publish_job,
    release_job,
    runner_check_jobs,
)
from attnforge.ci.steps import (
    ACTIONS,
    FORK_GUARD,
    checkout,
    runs_on,
    setup_python,
    signing_key,
)
from attnforge.ci.workflow_spec import CiSettings, KernelSetJob, ParityJob, WorkflowSpec
from attnforge.ci.yamltext import Comment, Literal, dump, load
from attnforge.core.arches import arch_label, arch_runs_on
from attnforge.core.errors import ConfigurationError
from attnforge.engine.base_images import load_bases
from attnforge.matrix.plan import Plan
from attnforge.matrix.project import Project

ROLES = ("pr", "release", "nightly", "refresh")
DEFAULT_TARGETS = {"pr": "default", "release": "release", "nightly": "nightly", "refresh": "release"}
SELF_DEFAULT_ROLES = ("pr", "release", "nightly")  # attnforge's own repository: its packaged compat data

MEMORY_NOTE = (
    "MAX_JOBS / NVCC_THREADS are not set: `attnforge build` picks them from the cores and the memory\n"
    "this runner really has (cgroup limits included) and the measured peak of one nvcc job (about\n"
    "4.4 GiB per arch for FA2 units), and lowers them and resumes if a compiler is killed for memory.\n"
    "Set them in `env:` only to override (e.g. MAX_JOBS: 2 on a 7 GiB hosted runner)."
)


def settings_for(project: Project, **options: Any) -> CiSettings:
    """The settings of matrix.yaml's `ci` section (mode, attnforge source, publish destination) and `options`."""
    ci = project.matrix.ci
    base = CiSettings(publish_to=ci.publish_to, invocation=Invocation(ci.mode, ci.attnforge))
    return replace(base, **options)


def parse_target_options(
    values: tuple[str, ...], available: Mapping[str, Any], mode: str = "user"
) -> dict[str, str]:
    """`--target [ROLE=]TARGET` values -> {role: target}; none given -> every default whose target exists (in
    `self` mode no `refresh`: attnforge's own compat data is refreshed in its source tree)."""
    if not values:
        roles = SELF_DEFAULT_ROLES if mode == "self" else ROLES
        return {r: t for r, t in DEFAULT_TARGETS.items() if t in available and r in roles}
    chosen: dict[str, str] = {}
    for raw in values:
        role, sep, target = raw.partition("=")
        if not sep:
            target = raw
            role = raw if raw in ROLES else "pr"
        if role not in ROLES:
            raise ConfigurationError(f"--target {raw}: role must be one of {', '.join(ROLES)} (ROLE=TARGET)")
        if target not in available:
            raise ConfigurationError(
                f"--target {raw}: no target '{target}' in the matrix ({', '.join(available)})"
            )
        if role in chosen and chosen[role] != target:
            raise ConfigurationError(f"--target: role '{role}' given twice ({chosen[role]}, {target})")
        chosen[role] = target
    return {r: chosen[r] for r in ROLES if r in chosen}


def kernel_set_jobs(plan: Plan) -> list[KernelSetJob]:
    """One job per kernel-set key of the plan's valid cells, in a stable, readable order."""
    jobs = [
        KernelSetJob(key, tuple(sorted(cells, key=lambda c: (c.python.zfill(5), c.id))))
        for key, cells in plan.kernel_sets().items()
    ]
    return sorted(jobs, key=KernelSetJob.sort_key)


def parity_jobs(
    builds: list[KernelSetJob], settings: CiSettings
) -> tuple[list[ParityJob], list[KernelSetJob]]:
    """A parity job per (kernel-set, runner class whose GPU runs one of its arches); the sets no runner covers."""
    parity: list[ParityJob] = []
    untested: list[KernelSetJob] = []
    for b in builds:
        devices = [d for d in settings.gpu_arches if any(arch_runs_on(a, d) for a in b.first.arches)]
        if not devices:
            untested.append(b)
        parity.extend(ParityJob(b, d) for d in devices)
    return parity, untested


def make_spec(project: Project, role: str, target: str, settings: CiSettings) -> WorkflowSpec:
    if role == "refresh":
        return WorkflowSpec(role, target)
    plan = project.plan(target)
    builds = kernel_set_jobs(plan)
    if not builds:
        raise ConfigurationError(
            f"target '{target}' has no valid cell: nothing for a '{role}' workflow to build"
        )
    parity, untested = parity_jobs(builds, settings)
    return WorkflowSpec(role, target, builds=builds, parity=parity, untested=untested)


# ---------------------------------------------------------------- job bodies


def devel_base(job: KernelSetJob, project: Project) -> tuple[str, str] | None:
    """(`--base-image` argument, comment) for a CUDA <= 12 kernel-set (PyPI's CUDA 12 wheels have no nvcc):
    its `nvidia/cuda:<ver>-devel` base, which docker/bases.toml must list as a registry base."""
    from attnforge.images.runtime_image import docker_dir  # start-up cost

    tk = job.first.toolkit
    row = project.compat.cuda_toolkit(tk.version) if tk.kind == "cuda" and tk.major < 13 else None
    if row is None:
        return None
    image = project.matrix.build.base_images.get(str(tk)) or row.devel_image or ""
    rec = load_bases(docker_dir() / "bases.toml").get(image)
    if rec is None or rec.kind != "registry":
        raise ConfigurationError(
            f"{job.first.id}: its builder base {image or '(none in the compat table)'} is not a registry base "
            f'listed in docker/bases.toml: add a [[base]] row (kind = "registry") and pin it with '
            f"`attnforge images bases --update {image or 'NAME'}`"
        )
    pin = f"pinned {rec.pin[:19]}" if rec.pin else f"unpinned: `attnforge images bases --update {image}`"
    return (
        f"{tk}={image}",
        f"{tk}: PyPI has no CUDA {tk.major} nvcc; built on {image}\n(docker/bases.toml, {pin})",
    )


def build_job(
    job: KernelSetJob, spec: WorkflowSpec, project: Project, settings: CiSettings
) -> dict[Any, Any]:
    build = project.matrix.build
    cache, out = build.cache_dir, build.output_dir
    cells = "".join(f" \\\n  --cell {c.id}" for c in job.cells)
    base = devel_base(job, project)
    if base is not None:
        cells = f" \\\n  --base-image {base[0]}" + cells
    key = f"attnforge-{job.key}-${{{{ github.run_id }}}}-${{{{ github.run_attempt }}}}"
    steps: list[Any] = [
        checkout(),
        setup_python(settings.python, tuple(c.python for c in job.cells)),
        *settings.invocation.setup("build"),
        signing_key(),
        {
            "name": "restore this kernel-set's objects",
            "uses": ACTIONS["cache-restore"],
            "with": {"path": cache, "key": key, "restore-keys": f"attnforge-{job.key}-"},
        },
        {
            Comment(MEMORY_NOTE + (f"\n{base[1]}" if base else "")): None,
            "name": f"build {len(job.cells)} cell(s)",
            "timeout-minutes": max(10, settings.build_timeout_minutes - 25),
            "run": settings.invocation.build(spec.target, cells),
        },
        {
            Comment(
                "saved even after a failure or a timeout: the next run resumes from the finished units"
            ): None,
            "name": "save this kernel-set's objects",
            "if": "always()",
            "uses": ACTIONS["cache-save"],
            "with": {"path": cache, "key": key},
        },
        {
            "name": "upload the wheels",
            "uses": ACTIONS["upload"],
            "with": {
                "name": f"wheels-{job.key}",
                "path": f"{out}/*.whl\n{out}/*.manifest.json\n{out}/*.intoto.json\n{out}/*.cdx.json\n",
                "if-no-files-found": "error",
            },
        },
        {
            "name": "upload the build logs",
            "if": "failure()",
            "uses": ACTIONS["upload"],
            "with": {"name": f"logs-{job.key}", "path": f"{out}/logs/", "if-no-files-found": "ignore"},
        },
    ]
    return {
        Comment(f"kernel-set {job.key}:\n" + "\n".join(f"  {c.id}" for c in job.cells)): None,
        "name": job.title,
        "runs-on": runs_on(
            settings.arm_build_runs_on if job.first.platform == "aarch64" else settings.build_runs_on
        ),
        "timeout-minutes": settings.build_timeout_minutes,
        "steps": steps,
    }


def parity_job(job: ParityJob, project: Project, settings: CiSettings) -> dict[Any, Any]:
    out = project.matrix.build.output_dir
    return {
        "name": f"parity {job.build.first.variant} {job.build.first.profile} on {arch_label(job.device_arch)}",
        "needs": [job.build.job_id],
        "if": FORK_GUARD,
        "runs-on": job.labels,
        "timeout-minutes": settings.parity_timeout_minutes,
        "steps": [
            checkout(),
            {
                "name": "download the wheels",
                "uses": ACTIONS["download"],
                "with": {"name": f"wheels-{job.build.key}", "path": out},
            },
            *gpu_setup(settings),
            signing_key(),
            {"name": "GPU parity", "run": settings.invocation.parity(out)},
            {
                "name": "upload the parity reports, the signed parity records and the updated manifests",
                "if": "always()",
                "uses": ACTIONS["upload"],
                "with": {
                    "name": job.job_id,
                    "path": f"{out}/*.manifest.json\n{out}/*.parity.intoto.json\nreports/gpu/\n",
                    "if-no-files-found": "warn",
                },
            },
        ],
    }


# ---------------------------------------------------------------- whole files


def _triggers(role: str, settings: CiSettings) -> dict[str, Any]:
    if role == "pr":
        return {
            "pull_request": {},
            "push": {"branches": [settings.default_branch]},
            "workflow_dispatch": {},
        }
    if role == "release":
        return {"push": {"tags": ["v*"]}, "workflow_dispatch": {}}
    cron = settings.refresh_cron if role == "refresh" else settings.nightly_cron
    return {"schedule": [{"cron": cron}], "workflow_dispatch": {}}


def _concurrency(role: str) -> dict[str, Any]:
    if role == "pr":
        return {
            "group": "${{ github.workflow }}-${{ github.event.pull_request.number || github.ref }}",
            "cancel-in-progress": True,
        }
    return {"group": "${{ github.workflow }}-${{ github.ref }}", "cancel-in-progress": False}


TITLES = {
    "pr": "attnforge: pull requests",
    "release": "attnforge: release",
    "nightly": "attnforge: nightly re-validation",
    "refresh": "attnforge: compat refresh",
}


def workflow(spec: WorkflowSpec, project: Project, settings: CiSettings) -> dict[Any, Any]:
    """The workflow of one role as an ordered mapping (written by yamltext.dump)."""
    jobs: dict[Any, Any] = {}
    if spec.role == "pr":
        jobs["checks"] = checks_job(spec, settings)
    if spec.role == "refresh":
        jobs["refresh"] = refresh_job(spec, settings)
    for b in spec.builds:
        jobs[b.job_id] = build_job(b, spec, project, settings)
    if spec.untested:
        jobs[
            Comment("no GPU runner class runs " + ", ".join(b.key for b in spec.untested) + ": not tested")
        ] = None
    for p in spec.parity:
        jobs[p.job_id] = parity_job(p, project, settings)
    if spec.role == "release":
        jobs["publish"] = publish_job(spec, project, settings)
        jobs["github-release"] = release_job(project)
        jobs["images"] = images_job(spec, settings)
    if spec.role == "nightly":
        jobs.update(runner_check_jobs(spec, settings))
    spaced: dict[Any, Any] = {}
    for i, (k, v) in enumerate(jobs.items()):
        if i and not isinstance(k, Comment):
            spaced[Comment("", blank_before=True)] = None
        spaced[k] = v
    return {
        "name": TITLES[spec.role],
        Literal("on"): _triggers(spec.role, settings),
        Comment(
            "least privilege: read-only by default; only the "
            + ("refresh" if spec.role == "refresh" else "release")
            + " job may write"
        ): None,
        "permissions": {"contents": "read"},
        "concurrency": _concurrency(spec.role),
        "env": {"ATTNFORGE_MATRIX": "matrix.yaml", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "FORCE_COLOR": "1"},
        "defaults": {"run": {"shell": "bash"}},
        "jobs": spaced,
    }


def header(spec: WorkflowSpec) -> str:
    cells = sum(len(b.cells) for b in spec.builds)
    if spec.role == "refresh":
        return (
            f"Generated by `attnforge ci generate` from matrix.yaml (target '{spec.target}', role 'refresh').\n"
            "Do not edit: change matrix.yaml (or the generator) and run `attnforge ci generate`.\n"
            "Weekly: `attnforge compat refresh --check`; when upstream moved, a pull request with the compat\n"
            "overlay, the workflows regenerated over it and the cells it adds to the plan."
        )
    return (
        f"Generated by `attnforge ci generate` from matrix.yaml (target '{spec.target}', role '{spec.role}').\n"
        "Do not edit: change matrix.yaml (or the generator) and run `attnforge ci generate`;\n"
        "`attnforge ci generate --check` and a unit test fail while this file is stale.\n"
        f"{len(spec.builds)} build job(s), one per kernel-set, building {cells} cell(s); "
        f"{len(spec.parity)} GPU parity job(s)."
    )


def render(project: Project, roles: Mapping[str, str], settings: CiSettings | None = None) -> dict[str, str]:
    """{file name: YAML text} for the given {role: target}."""
    settings = settings or settings_for(project)
    files: dict[str, str] = {}
    for role, target in roles.items():
        spec = make_spec(project, role, target, settings)
        files[spec.file] = dump(workflow(spec, project, settings), header=header(spec))
    return dict(sorted(files.items()))


def self_hosted_labels(files: Mapping[str, str]) -> list[str]:
    """The custom labels the workflows ask self-hosted runners for (actionlint's `self-hosted-runner`)."""
    builtin = {"self-hosted", "linux", "x64", "arm64", "windows", "macos"}
    labels: set[str] = set()
    for text in files.values():
        for job in (load(text).get("jobs") or {}).values():
            runs_on = job.get("runs-on")
            if isinstance(runs_on, list) and "self-hosted" in runs_on:
                labels.update(str(x) for x in runs_on if x not in builtin)
    return sorted(labels)


def actionlint_config(files: Mapping[str, str]) -> str:
    """`.github/actionlint.yaml` text declaring the self-hosted runner labels the workflows use."""
    return dump(
        {"self-hosted-runner": {"labels": self_hosted_labels(files)}},
        header="Runner labels used by the generated workflows (attnforge ci generate --actionlint-config).",
    )
