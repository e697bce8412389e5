"""The jobs around the builds: publish, the GitHub release, images, runner checks and the pull requests'
lint-and-test job."""

from __future__ import annotations

from typing import Any

from attnforge.ci.steps import ACTIONS, checkout, setup_python
from attnforge.ci.workflow_spec import CiSettings, WorkflowSpec
from attnforge.ci.yamltext import Comment
from attnforge.core.arches import arch_label
from attnforge.matrix.project import Project


def gpu_setup(settings: CiSettings) -> list[dict[Any, Any]]:
    """A GPU job's install: into the runner's own `python` (the one with its GPU torch), not a fresh one;
    attnforge's own self-hosted runners carry nox and attnforge already."""
    if settings.invocation.self_mode:
        return []
    return [
        {
            Comment("into the runner's own `python`: the interpreter with its GPU torch"): None,
            **settings.invocation.setup()[0],
        }
    ]


def download_all(out: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "download every kernel-set's wheels",
            "uses": ACTIONS["download"],
            "with": {"pattern": "wheels-*", "merge-multiple": True, "path": out},
        },
        {
            "name": "download the parity reports (manifests with parity results)",
            "uses": ACTIONS["download"],
            "with": {"pattern": "parity-*", "merge-multiple": True, "path": "."},
        },
    ]


def gate(spec: WorkflowSpec) -> list[str]:
    """What publishing waits for: every parity job, and the builds no runner class can test."""
    return sorted([p.job_id for p in spec.parity] + [b.job_id for b in spec.untested])


def publish_job(spec: WorkflowSpec, project: Project, settings: CiSettings) -> dict[Any, Any]:
    dest = project.matrix.destinations.get(settings.publish_to)
    env: dict[str, str] = {}
    if dest is not None:
        for var in (dest.username_env, dest.password_env):
            if var:
                env[var] = f"${{{{ secrets.{var} }}}}"
    out = project.matrix.build.output_dir
    return {
        "name": f"publish to {settings.publish_to}",
        "needs": gate(spec),
        "runs-on": "ubuntu-latest",
        "environment": settings.release_environment,
        "steps": [
            checkout(),
            setup_python(settings.python),
            *settings.invocation.setup("publish"),
            *download_all(out),
            {
                Comment("credentials reach the command only as environment variables"): None,
                "name": f"publish (destination '{settings.publish_to}' of matrix.yaml)",
                "run": settings.invocation.publish(settings.publish_to),
                "env": env,
            },
        ],
    }


def release_job(project: Project) -> dict[Any, Any]:
    out = project.matrix.build.output_dir
    return {
        Comment("the only job that may write to the repository (it creates the release)"): None,
        "name": "GitHub release",
        "needs": ["publish"],
        "runs-on": "ubuntu-latest",
        "permissions": {"contents": "write"},
        "steps": [
            {
                "name": "download every kernel-set's wheels",
                "uses": ACTIONS["download"],
                "with": {"pattern": "wheels-*", "merge-multiple": True, "path": out},
            },
            {
                "name": "create the release",
                "env": {"GH_TOKEN": "${{ github.token }}", "TAG": "${{ github.ref_name }}"},
                "run": (
                    f"cd {out}\n"
                    "sha256sum -- *.whl > SHA256SUMS\n"
                    'gh release create "$TAG" --repo "$GITHUB_REPOSITORY" --title "$TAG" --verify-tag \\\n'
                    "  --generate-notes -- *.whl *.manifest.json SHA256SUMS\n"
                ),
            },
        ],
    }


def images_job(spec: WorkflowSpec, settings: CiSettings) -> dict[Any, Any]:
    return {
        Comment("runs when the repository variable ATTNFORGE_REGISTRY names a registry"): None,
        "name": "images",
        "needs": ["publish"],
        "if": "vars.ATTNFORGE_REGISTRY != ''",
        "runs-on": "ubuntu-latest",
        "environment": settings.release_environment,
        "steps": [
            checkout(),
            setup_python(settings.python),
            *settings.invocation.setup(),
            {
                "name": "log in to the registry",
                "env": {
                    "REGISTRY": "${{ vars.ATTNFORGE_REGISTRY }}",
                    "REGISTRY_USER": "${{ secrets.ATTNFORGE_REGISTRY_USER }}",
                    "REGISTRY_PASSWORD": "${{ secrets.ATTNFORGE_REGISTRY_PASSWORD }}",
                },
                "run": 'printf %s "$REGISTRY_PASSWORD" | docker login "$REGISTRY" -u "$REGISTRY_USER" --password-stdin',
            },
            {
                "name": "build, test and push the images",
                "env": {"REGISTRY": "${{ vars.ATTNFORGE_REGISTRY }}"},
                "run": settings.invocation.images(spec.target),
            },
        ],
    }


def runner_check_jobs(spec: WorkflowSpec, settings: CiSettings) -> dict[str, Any]:
    jobs: dict[str, Any] = {}
    for arch in settings.gpu_arches:
        label = arch_label(arch)
        labels = ["self-hosted", "linux", "x64", "gpu", *(["rocm"] if arch.startswith("gfx") else []), label]
        jobs[f"runner-check-{label}"] = {
            "name": f"runner check on {label}",
            "runs-on": labels,
            "timeout-minutes": 30,
            "steps": [
                checkout(),
                *gpu_setup(settings),
                {
                    "name": "attnforge runner check",
                    "run": settings.invocation.runner_check(
                        spec.target, f"reports/gpu/runner_check-{label}.json"
                    ),
                },
                {
                    "name": "upload the report",
                    "if": "always()",
                    "uses": ACTIONS["upload"],
                    "with": {
                        "name": f"runner-check-{label}",
                        "path": f"reports/gpu/runner_check-{label}.json",
                    },
                },
            ],
        }
    return jobs


def checks_job(spec: WorkflowSpec, settings: CiSettings) -> dict[str, Any]:
    inv = settings.invocation
    if inv.self_mode:  # attnforge's own repository: its lint and test sessions, then the checkout's attnforge
        return {
            "name": "lint, tests, workflows in sync",
            "runs-on": "ubuntu-latest",
            "timeout-minutes": 90,
            "steps": [
                checkout(),
                setup_python(settings.python),
                *inv.setup(),
                {"name": "lint", "run": "nox -s lint"},
                {"name": "tests", "run": "nox -s tests"},
                {
                    "name": "workflows match matrix.yaml",
                    "run": f"python -m pip install -e . && {inv.generate(check=True)}",
                },
            ],
        }
    return {
        "name": "matrix valid, plan, workflows in sync",
        "runs-on": "ubuntu-latest",
        "timeout-minutes": 30,
        "steps": [
            checkout(),
            setup_python(settings.python),
            *inv.setup(),
            {"name": "matrix.yaml is valid", "run": "attnforge validate"},
            {"name": f"plan of target '{spec.target}'", "run": f"attnforge plan --target {spec.target}"},
            {"name": "workflows match matrix.yaml", "run": inv.generate(check=True)},
        ],
    }
