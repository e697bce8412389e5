"""What a generated workflow is made of: the settings matrix.yaml does not carry, the build job of each
kernel-set, the parity job of each kernel-set on each GPU runner class, and the spec of one workflow file."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnforge.ci.invocation import Invocation
from attnforge.core.arches import arch_label, cuda_label
from attnforge.matrix.cell import Cell

REFRESH_CRON = "41 4 * * 1"  # Mondays: the scheduled compat refresh


@dataclass(frozen=True)
class CiSettings:
    """Knobs of the generated workflows that matrix.yaml does not carry."""

    python: str = "3.11"
    build_runs_on: tuple[str, ...] = ("ubuntu-latest",)
    # aarch64 cells build natively on arm64 (GitHub's hosted arm64 runner; a self-hosted GH200 works too:
    # ("self-hosted", "linux", "arm64"))
    arm_build_runs_on: tuple[str, ...] = ("ubuntu-24.04-arm",)
    build_timeout_minutes: int = 360
    gpu_arches: tuple[str, ...] = ("sm_90",)  # the self-hosted runner classes that exist
    parity_timeout_minutes: int = 60
    nightly_cron: str = "17 3 * * *"
    default_branch: str = "main"
    publish_to: str = "internal"
    release_environment: str = "release"
    refresh_cron: str = REFRESH_CRON
    invocation: Invocation = field(default_factory=Invocation)


@dataclass(frozen=True)
class KernelSetJob:
    """The cells of one kernel-set key: built by one job so the compiled objects are reused."""

    key: str
    cells: tuple[Cell, ...]

    @property
    def first(self) -> Cell:
        return self.cells[0]

    @property
    def job_id(self) -> str:
        return f"build-{self.key}"

    @property
    def title(self) -> str:
        c = self.first
        if len({x.torch for x in self.cells}) == 1:
            return f"build {c.variant} {c.arch_slug} {c.profile} [{', '.join(x.cp for x in self.cells)}]"
        # kernels shared across torch releases (torch-free kernel units): one job binds each (torch, Python)
        bindings = ", ".join(
            f"torch>={x.torch_floor}/abi3" if x.stable_abi else f"{x.torch_family}/{x.cp}" for x in self.cells
        )
        return f"build {c.toolkit.short} {c.arch_slug} {c.profile} [{bindings}]"

    def sort_key(self) -> tuple[str, str, str, str]:
        c = self.first
        return (c.variant, c.arch_slug, c.profile, self.key)


@dataclass(frozen=True)
class ParityJob:
    """GPU parity of one kernel-set's wheels on one runner class."""

    build: KernelSetJob
    device_arch: str

    @property
    def job_id(self) -> str:
        return f"parity-{self.build.key}-{arch_label(self.device_arch)}"

    @property
    def labels(self) -> list[str]:
        tk = self.build.first.toolkit
        host = "arm64" if self.build.first.platform == "aarch64" else "x64"  # GH200/GB200 runners are arm64
        base = ["self-hosted", "linux", host, "gpu"]
        if tk.kind == "cuda":
            return [*base, arch_label(self.device_arch), cuda_label(tk.major)]
        return [*base, "rocm", arch_label(self.device_arch)]


@dataclass
class WorkflowSpec:
    """One workflow file: a role and the target whose plan it runs."""

    role: str
    target: str
    file: str = ""
    builds: list[KernelSetJob] = field(default_factory=list)
    parity: list[ParityJob] = field(default_factory=list)
    untested: list[KernelSetJob] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.file:
            self.file = f"attnforge-{self.role}.yml"
