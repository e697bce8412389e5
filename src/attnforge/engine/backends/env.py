"""The env backend: build against the torch already installed for a given interpreter (a self-hosted GPU
runner's, an NGC container's), with no venv and nothing installed into it.

The cell is read from the environment (torch release and build, CUDA or ROCm version, C++ ABI, Python)
and named by the same `Cell` as a planned one: on a release torch (`2.11.0+cu130`) the wheel has exactly
the name the matrix would give it; a torch the compat data does not know as a release (a nightly, NGC's
`2.10.0a0+<sha>`) is accepted from what it reports, and the local version and variant say which build it
is (`.pt<build>`). The rules check what the environment leaves open (arches, profile, kernel needs);
those about PyPI's torch wheels are answered by the environment itself.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from attnforge.core.arches import arch_runs_on
from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.engine.backends.local import LocalBackend, find_nvcc, tool_version
from attnforge.engine.environment import Env, run_probe
from attnforge.engine.progress import ProgressView
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.plan import make_cell
from attnforge.matrix.project import Project
from attnforge.matrix.rules import ENVIRONMENT_ANSWERS, check
from attnforge.names import toolkit_of_variant


def read_environment(python: str) -> Env:
    """The interpreter's Python, torch (release, build, CUDA/HIP, ABI) and GPUs; an error without torch."""
    if not Path(python).is_file():
        raise ConfigurationError(f"--python {python}: no such interpreter")
    env = Env.from_probe(run_probe(python))
    if env.torch is None:
        raise EnvironmentProblem(
            f"{python} has no importable torch: `attnforge build --python` builds against an "
            "installed torch (use --target/--cell to build with a torch of the matrix)"
        )
    if env.accel is None:
        raise EnvironmentProblem(
            f"torch {env.torch} of {python} is a CPU build: there is no CUDA or ROCm to build for"
        )
    return env


def environment_cell(project: Project, env: Env, template: Cell) -> Cell:
    """`template` (kernel, profile, arches, platform from the matrix) re-aimed at the environment's torch,
    toolkit, Python and ABI, then checked by the rules; ConfigurationError naming each broken rule."""
    assert env.torch is not None and env.accel is not None and env.cxx11_abi is not None
    accel = env.accel
    toolkit = Toolkit.parse(toolkit_of_variant(accel) or accel)
    cell = replace(
        template,
        toolkit=toolkit,
        torch=env.torch.split("+")[0],
        torch_build=env.torch,
        torch_variant=toolkit.short,
        python=env.python,
        cxx11_abi=env.cxx11_abi,
    )
    verdict = check(cell, project.compat, answered=ENVIRONMENT_ANSWERS)
    if not verdict.valid:
        raise ConfigurationError(f"{cell.id} against {env.describe()}:\n  " + "\n  ".join(verdict.reasons()))
    return verdict.cell


class EnvBackend(LocalBackend):
    """The builder on this machine with `interpreter` and its own torch (spec.use_interpreter)."""

    name = "env"

    def __init__(self, interpreter: str, env: Env) -> None:
        super().__init__()
        self.interpreter: str | None = interpreter
        self.env = env

    def identity(self) -> str:
        nvcc = find_nvcc()
        return json.dumps(
            {
                "backend": self.name,
                "python": self.interpreter,
                "torch": self.env.torch,
                "nvcc": tool_version([str(nvcc), "--version"]) if nvcc else None,
                "gcc": tool_version(["gcc", "-dumpfullversion"]),
            },
            sort_keys=True,
        )

    def prepare(self, cells: list[Cell], view: ProgressView) -> None:
        if any(c.toolkit.kind == "cuda" for c in cells) and find_nvcc() is None:
            raise EnvironmentProblem(
                "no nvcc in $CUDA_HOME/bin, PATH or /usr/local/cuda: a build against this torch needs the CUDA "
                f"toolkit of its major version ({self.env.accel})"
            )
        view.log(f"env backend: {self.interpreter} as it is ({self.env.describe()}), nvcc at {find_nvcc()}")


def template_cell(
    project: Project, env: Env, profile: str | None, arches: list[str], kernel: str | None
) -> Cell:
    """A cell of `kernel` (default: the matrix's `defaults.kernel`) and `profile` (default:
    `defaults.profile`) for `arches` (default: this machine's GPUs, as the kernel compiles them: FA3 builds
    sm_90a for an sm_90 GPU), before it is aimed at the environment."""
    matrix = project.matrix
    defaults = matrix.defaults.given()
    kernel = kernel or defaults.get("kernel", "flash-attn")
    if kernel not in matrix.kernels:
        raise ConfigurationError(
            f"--kernel {kernel}: not declared under 'kernels' in {project.matrix_path} "
            f"(declared: {', '.join(matrix.kernels)})"
        )
    chosen = arches or kernel_arches(project, kernel, sorted(set(env.gpus)))
    if not chosen:
        raise ConfigurationError(
            "no --arch given and no GPU visible to this torch: name the arches (--arch sm_90)"
        )
    assert env.accel is not None and env.torch is not None
    accel = env.accel
    toolkit = toolkit_of_variant(accel) or accel
    combo = {
        **defaults,
        "kernel": kernel,
        "profile": profile or defaults.get("profile", "full"),
        "arch": chosen,
        "toolkit": toolkit,
        "torch": env.torch.split("+")[0],
        "python": env.python,
        "cxx11_abi": bool(env.cxx11_abi),
        "platform": defaults.get("platform", "x86_64"),
    }
    return make_cell(combo, matrix, project.compat, project.lock)


def kernel_arches(project: Project, kernel: str, gpus: list[str]) -> list[str]:
    """The arches to compile for these GPUs: the GPUs' own, or for a kernel with a fixed arch list (FA3) the
    ones of that list that run on them plus those it always compiles."""
    row = project.compat.kernel_release(kernel, project.matrix.kernels[kernel].version)
    if not gpus or row is None or not row.arches:
        return gpus
    fits = {a for a in row.arches for g in gpus if arch_runs_on(a, g)}
    return sorted(fits | set(row.required_arches))


def environment_cells(project: Project, env: Env, templates: list[Cell]) -> list[Cell]:
    """One cell per distinct (kernel, profile, arches) of `templates`, aimed at the environment."""
    seen: dict[tuple[str, str, tuple[str, ...]], Cell] = {}
    for cell in templates:
        seen.setdefault((cell.kernel, cell.profile, cell.arches), cell)
    return [environment_cell(project, env, cell) for cell in seen.values()]
