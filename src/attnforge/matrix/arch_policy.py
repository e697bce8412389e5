"""The arch policy (compat table `arch_policy`): which targets a CUDA cell compiles on its toolkit (family
targets such as `sm_100` from `compute_100f`, PTX of the newest arch) and which GPUs its wheel then runs on.
`plan` (rule `arch-policy`) puts the table's answer in the cell (`gencode`), the builder compiles it, the
manifest records it, and `runner check` (planned cells), `which` and `doctor` (a wheel's manifest) read it
back here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnforge.core.arches import arch_number, arch_runs_on
from attnforge.matrix.compat import ArchPolicy, CompatData, parse_version


@dataclass(frozen=True)
class Targets:
    """What one cell compiles: `-gencode` pairs (`arch=compute_100f,code=sm_100`) and the PTX it embeds."""

    gencode: tuple[str, ...]
    sass: tuple[str, ...]  # sm_90, sm_100 (real targets, as compiled)
    ptx: tuple[str, ...]  # compute_120 (embedded PTX, JIT-compiled by the driver on newer GPUs)
    policy: ArchPolicy | None

    def runs_on(self, device: str) -> str | None:
        """ "native" when a SASS target runs on `device` (sm_90), "ptx" when only embedded PTX does (the
        driver JIT-compiles it at first use), None when nothing does."""
        if any(arch_runs_on(a, device) for a in self.sass):
            return "native"
        dev = arch_number(device)
        if dev >= 0 and any(arch_number(p.replace("compute_", "sm_")) <= dev for p in self.ptx):
            return "ptx"
        return None

    def describe(self) -> str:
        parts = list(self.sass)
        if self.ptx:
            parts.append("PTX " + ", ".join(self.ptx))
        return ", ".join(parts)


def _virtual(arch: str, policy: ArchPolicy | None, cuda: str, data: CompatData) -> str:
    """The virtual arch a real arch is compiled from: its family target where the policy maps it."""
    if policy is None:
        return arch
    family = policy.family.get(arch)
    since = policy.family_from.get(arch)
    if family and (since is None or parse_version(cuda) >= parse_version(since)):
        row = data.cuda_toolkit(cuda)
        if row is None or family in row.arches:
            return family
    return arch


def compiled_targets(
    kernel: str, cuda: str, arches: tuple[str, ...] | list[str], data: CompatData
) -> Targets:
    """The targets a `kernel` cell with `arches` compiles on CUDA `cuda` under the policy table (no policy
    row: each arch as itself, no PTX)."""
    policy = data.arch_policy_for(kernel, cuda)
    sm = [a for a in arches if a.startswith("sm_")]
    gencode: list[str] = []
    for a in sm:
        virtual = _virtual(a, policy, cuda, data)
        gencode.append(f"arch={virtual.replace('sm_', 'compute_')},code={a}")
    ptx: list[str] = []
    plain = [a for a in sm if a.removeprefix("sm_").isdigit()]
    if policy is not None and policy.ptx == "newest" and plain:
        newest = max(plain, key=arch_number).replace("sm_", "compute_")
        gencode.append(f"arch={newest},code={newest}")
        ptx.append(newest)
    if policy is not None and policy.gencode == "setup":
        gencode = []  # the kernel's setup.py decides its flags (FA3: sm_90a hard-coded)
    return Targets(tuple(gencode), tuple(sm), tuple(ptx), policy)


def cell_targets(arches: tuple[str, ...], gencode: tuple[str, ...]) -> Targets:
    """The targets of a planned cell: its `gencode` (rule `arch-policy`) read back, or its arches as they are
    when the policy changed nothing."""
    sass = tuple(a for a in arches if a.startswith("sm_"))
    ptx = tuple(
        g.split("code=", 1)[1] for g in gencode if "code=compute_" in g and g.split("code=", 1)[1].strip()
    )
    return Targets(gencode, sass, ptx, None)


def wheel_runs_on(inputs: dict[str, Any], device: str) -> str | None:
    """How a built wheel runs on a `device` GPU, from its manifest `inputs`: "native", "ptx" (driver JIT) or
    None. Its `gencode` is what the arch policy compiled (absent: each arch as itself, no PTX, as every wheel
    built before the policy)."""
    arches = [str(a) for a in inputs.get("arches") or []]
    if not str(inputs.get("toolkit") or "").startswith("cuda"):
        return "native" if any(arch_runs_on(a, device) for a in arches) else None
    gencode = tuple(str(g) for g in inputs.get("gencode") or [])
    return cell_targets(tuple(arches), gencode).runs_on(device)
