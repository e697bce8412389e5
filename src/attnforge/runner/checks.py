"""The runner checks: each one a pure decision over what the host reported (see docs/runner.md).

Blocking (exit non-zero): no GPU; no cell of the target that this machine can test (driver too old for
every CUDA major of the target, or no GPU arch in any cell's arch list); /dev/kfd unusable on an AMD
machine; less free disk than asked; a failed smoke run. Everything else is a warning or information:
Docker missing, the container GPU runtime not checked, a GPU no cell targets, a torch that no cell uses.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnforge.builder.settings import BuildSettings
from attnforge.core.arches import arch_label, arch_runs_on, cuda_label
from attnforge.core.docker_cli import docker_executable
from attnforge.engine.resources import JobMemoryTable, Parallelism, choose_parallelism
from attnforge.engine.settings import resolve_settings
from attnforge.matrix.arch_policy import cell_targets
from attnforge.matrix.cell import Cell
from attnforge.matrix.compat import CompatData
from attnforge.matrix.schema import ResourcesSpec
from attnforge.runner.gpus import Discovery, Gpu
from attnforge.runner.host import Host


@dataclass
class Check:
    """One row of the report: ok is True only for a pass; blocking failures decide the exit code."""

    name: str
    status: str  # pass | warn | fail | skip
    detail: str
    blocking: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "status": self.status,
            "blocking": self.blocking,
        }


@dataclass
class CheckOptions:
    """What the user asked for."""

    target: str | None
    cells: list[Cell]
    compat: CompatData | None
    cache_dir: Path
    min_free_gb: float = 50.0
    docker_image: str | None = None
    require_docker: bool = False
    pythons: list[str] = field(default_factory=list)
    reserve_memory_gb: float = 2.0
    matrix_note: str = ""  # why there are no cells (no matrix), if so
    # compile and run the C++ exception probe (about 10-15 s; runner/compiler_check.py)
    cxx_probe: bool = False


def driver_tuple(version: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); unparseable parts are 0."""
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.\-]", version.strip()) if p != "")


def driver_floor(major: int, data: CompatData | None) -> tuple[str, str]:
    """The oldest driver that runs CUDA `major`.x builds (minor-version compatibility), and its source."""
    if data is None:
        return "", ""
    for row in data.driver:
        if row.cuda_major == major and row.min_driver:
            return row.min_driver, f"[[driver]] cuda_major={major} ({row.source})"
    rows = [c for c in data.cuda if c.version.split(".")[0] == str(major) and c.min_driver]
    if rows:
        low = min(rows, key=lambda c: driver_tuple(c.min_driver))
        return low.min_driver, f"[[cuda]] {low.version} min_driver (no [[driver]] row for CUDA {major})"
    return "", ""


def toolkit_driver(version: str, data: CompatData | None) -> str:
    """The driver a toolkit release itself asks for (full compatibility, PTX JIT included)."""
    row = data.cuda_toolkit(version) if data else None
    return row.min_driver if row and row.min_driver else ""


def check_gpus(found: Discovery) -> Check:
    if not found.gpus:
        return Check("gpus", "fail", "no GPU found: " + "; ".join(found.notes), blocking=True)
    names = sorted({g.name for g in found.gpus})
    return Check("gpus", "pass", f"{len(found.gpus)} {found.vendor} GPU(s): {', '.join(names)}")


def check_driver(
    found: Discovery, cells: list[Cell], data: CompatData | None
) -> tuple[list[Check], set[int]]:
    """One check per CUDA major of the cells; returns the majors this driver runs."""
    if found.vendor != "nvidia" or not found.driver:
        return [], set()
    majors = sorted({c.toolkit.major for c in cells if c.toolkit.kind == "cuda"})
    have = driver_tuple(found.driver)
    checks: list[Check] = []
    runs: set[int] = set()
    for major in majors:
        toolkits = sorted(
            {c.toolkit.version for c in cells if c.toolkit.kind == "cuda" and c.toolkit.major == major}
        )
        floor, source = driver_floor(major, data)
        name = f"driver-{cuda_label(major)}"
        if floor:
            ok = have >= driver_tuple(floor)
            detail = (
                f"driver {found.driver} {'>=' if ok else '<'} {floor}, the CUDA {major}.x floor ({source})"
            )
            if ok:
                newer = [
                    f"{tk} wants {need}"
                    for tk in toolkits
                    if (need := toolkit_driver(tk, data)) and have < driver_tuple(need)
                ]
                if newer:
                    detail += (
                        "; runs " + ", ".join(newer) + " through minor-version compatibility (no PTX JIT)"
                    )
        elif found.driver_cuda:
            ok = driver_tuple(found.driver_cuda) >= (major, 0)
            detail = (
                f"driver {found.driver} supports CUDA {found.driver_cuda} (nvidia-smi); "
                f"no driver floor for CUDA {major} in the compat data"
            )
        else:
            checks.append(
                Check(name, "warn", f"no driver floor for CUDA {major} in the compat data: not checked")
            )
            runs.add(major)
            continue
        detail += f"; cells: {', '.join('cuda' + t for t in toolkits)}"
        if ok:
            runs.add(major)
        checks.append(Check(name, "pass" if ok else "fail", detail))
    if majors and not runs:
        for c in checks:
            c.blocking = c.status == "fail"
    else:
        for c in checks:
            if c.status == "fail":
                c.status = "warn"
                c.detail += f" (this runner will not advertise {c.name.removeprefix('driver-')})"
    return checks, runs


def cell_runs_on(cell: Cell, gpu: Gpu) -> bool:
    """A GPU runs a cell's wheel: a compiled arch natively, or its embedded PTX through the driver's JIT (the
    arch policy, the same table `plan` and `which` read)."""
    if not gpu.arch:
        return False
    if cell.toolkit.kind != "cuda":
        return any(arch_runs_on(a, gpu.arch) for a in cell.arches)
    return cell_targets(cell.arches, cell.gencode).runs_on(gpu.arch) is not None


def vendor_of(cell: Cell) -> str:
    return "nvidia" if cell.toolkit.kind == "cuda" else "amd"


def check_arches(found: Discovery, cells: list[Cell]) -> list[Check]:
    """Each GPU against the cells' arch lists: a GPU no cell targets is a warning."""
    mine = [c for c in cells if vendor_of(c) == found.vendor]
    wanted = sorted({a for c in mine for a in c.arches})
    checks: list[Check] = []
    for g in found.gpus:
        name = f"gpu{g.index}-arch"
        if not g.arch:
            checks.append(Check(name, "warn", f"{g.name}: architecture unknown (the tool did not report it)"))
            continue
        runnable = [c for c in mine if cell_runs_on(c, g)]
        if runnable:
            checks.append(
                Check(name, "pass", f"{g.name} is {g.arch}: runs {len(runnable)} of {len(mine)} cell(s)")
            )
        else:
            checks.append(
                Check(
                    name,
                    "warn",
                    f"{g.name} is {g.arch}, in no cell's arch list ({', '.join(wanted) or 'no cells'})",
                )
            )
    return checks


def testable_cells(found: Discovery, cells: list[Cell], driver_majors: set[int]) -> list[Cell]:
    """Cells this machine can test: a GPU runs one of its arches and, for CUDA, the driver runs its major."""
    out: list[Cell] = []
    for c in cells:
        if vendor_of(c) != found.vendor:
            continue
        if c.toolkit.kind == "cuda" and c.toolkit.major not in driver_majors:
            continue
        if any(cell_runs_on(c, g) for g in found.gpus):
            out.append(c)
    return out


def check_cells(opts: CheckOptions, found: Discovery, testable: list[Cell]) -> Check:
    if not opts.cells:
        return Check("cells", "skip", opts.matrix_note or "no matrix target given: cell checks skipped")
    target = f"target '{opts.target}'"
    if not found.gpus:
        return Check(
            "cells", "fail", f"no GPU: none of the {len(opts.cells)} cell(s) of {target} testable", True
        )
    if not testable:
        return Check(
            "cells",
            "fail",
            f"none of the {len(opts.cells)} cell(s) of {target} can be tested here (driver or arch, see above)",
            blocking=True,
        )
    return Check("cells", "pass", f"{len(testable)} of {len(opts.cells)} cell(s) of {target} testable here")


def check_kfd(host: Host, found: Discovery) -> list[Check]:
    """ROCm needs read/write /dev/kfd and the /dev/dri render nodes (groups render and video)."""
    if found.vendor != "amd":
        return []
    kfd, dri = host.device_access("/dev/kfd"), host.device_access("/dev/dri")
    if kfd == "rw" and dri != "missing":
        return [Check("rocm-devices", "pass", "/dev/kfd readable and writable, /dev/dri present")]
    why = {
        "missing": "/dev/kfd is missing (amdgpu driver not loaded?)",
        "exists": "/dev/kfd exists but this user cannot open it (add it to the 'render' and 'video' groups)",
    }.get(kfd, "/dev/dri is missing")
    return [Check("rocm-devices", "fail", why, blocking=True)]


def check_docker(host: Host, found: Discovery, opts: CheckOptions) -> list[Check]:
    """Engine and GPU container runtime; warnings unless --require-docker."""
    level = "fail" if opts.require_docker else "warn"
    docker = host.which(docker_executable(default="docker"))  # $ATTNFORGE_DOCKER, else docker on PATH
    if not docker:
        return [
            Check(
                "docker-engine",
                level,
                "docker: not found (images and container parity need it)",
                opts.require_docker,
            ),
            Check("gpu-container-runtime", level, "not checked: no Docker", opts.require_docker),
        ]
    res = host.run([docker, "version", "--format", "{{.Server.Version}}"], timeout=20)
    if not res.ok:
        return [
            Check("docker-engine", level, f"no engine answers: {res.reason()}", opts.require_docker),
            Check("gpu-container-runtime", level, "not checked: no Docker engine", opts.require_docker),
        ]
    checks = [Check("docker-engine", "pass", f"engine {res.stdout.strip()}")]
    runtimes = ""
    info = host.run([docker, "info", "--format", "{{json .Runtimes}}"], timeout=20)
    if info.ok:
        try:
            runtimes = ", ".join(sorted(json.loads(info.stdout or "{}")))
        except ValueError:
            runtimes = ""
    if not opts.docker_image:
        detail = "not checked: no image (--docker-image IMAGE runs a GPU container)"
        if runtimes:
            detail += f"; engine runtimes: {runtimes}"
        checks.append(Check("gpu-container-runtime", level, detail, opts.require_docker))
        return checks
    if found.vendor == "amd":
        argv = [
            docker,
            "run",
            "--rm",
            "--device",
            "/dev/kfd",
            "--device",
            "/dev/dri",
            "--group-add",
            "video",
            "--security-opt",
            "seccomp=unconfined",
            opts.docker_image,
            "rocminfo",
        ]
        needle = re.compile(r"gfx[0-9a-f]+")
    else:
        argv = [docker, "run", "--rm", "--gpus", "all", opts.docker_image, "nvidia-smi", "-L"]
        needle = re.compile(r"^GPU \d+:", re.M)
    run = host.run(argv, timeout=300)
    seen = len(needle.findall(run.stdout)) if run.ok else 0
    if run.ok and seen:
        checks.append(
            Check("gpu-container-runtime", "pass", f"`{' '.join(argv[1:4])} ...` sees {seen} GPU agent(s)")
        )
    else:
        why = run.reason() if not run.ok else "the container saw no GPU"
        checks.append(
            Check("gpu-container-runtime", level, f"{' '.join(argv[1:])}: {why}", opts.require_docker)
        )
    return checks


def check_disk(host: Host, opts: CheckOptions) -> Check:
    free, where = host.disk_free_gb(opts.cache_dir)
    at = str(where) if Path(where) == opts.cache_dir else f"{where} (for {opts.cache_dir})"
    detail = f"{free:.1f} GiB free at {at}; threshold {opts.min_free_gb:g} GiB"
    if free < opts.min_free_gb:
        return Check("disk", "fail", detail, blocking=True)
    return Check("disk", "pass", detail)


def choose_jobs(host: Host, opts: CheckOptions) -> tuple[Check, Parallelism | BuildSettings | None]:
    """MAX_JOBS/NVCC_THREADS the build engine would pick here, for the widest cell."""
    machine = host.machine()
    if not opts.cells:
        par = choose_parallelism(machine, 1, reserve_gb=opts.reserve_memory_gb)
        assumed = f"{par.job_memory_gb:g} GiB"
        return Check("resources", "pass", par.reason + f" (no cells: 1 arch, {assumed} per job assumed)"), par
    widest = max(opts.cells, key=lambda c: (len(c.arches), c.id))
    table = JobMemoryTable(opts.cache_dir / "job_memory.json")
    settings = resolve_settings(
        widest, ResourcesSpec(), machine=machine, table=table, reserve_gb=opts.reserve_memory_gb
    )
    detail = f"{settings.reason}; job size from {settings.source('job_memory_gb')} ({widest.id})"
    return Check("resources", "pass" if settings.fits else "warn", detail), settings


TORCH_PROBE = r"""
import json, site, sys
out = {"python": "%d.%d" % sys.version_info[:2], "executable": sys.executable,
       "venv": sys.prefix != sys.base_prefix, "site": site.getsitepackages()}
try:
    import torch
    out.update(torch=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None),
               cxx11abi=bool(torch.compiled_with_cxx11_abi()), gpus=torch.cuda.device_count())
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def probe_torch(host: Host, pythons: list[str]) -> dict[str, Any]:
    """The first interpreter with an importable torch (else the first answer, with its error)."""
    first: dict[str, Any] = {}
    for py in pythons:
        res = host.run([py, "-c", TORCH_PROBE], timeout=120)
        if not res.ok:
            first = first or {"executable": py, "error": res.reason()}
            continue
        try:
            data: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            first = first or {"executable": py, "error": "unreadable probe output"}
            continue
        if data.get("torch"):
            return data
        first = first or data
    return first or {"error": "no Python interpreter to probe"}


def check_torch(probe: dict[str, Any], testable: list[Cell], found: Discovery) -> Check:
    if not probe.get("torch"):
        return Check(
            "torch",
            "warn",
            f"no torch in {probe.get('executable', '?')} ({probe.get('error', 'not installed')}): "
            "the smoke test reuses the machine's torch",
        )
    version = str(probe["torch"])
    family = ".".join(version.split("+")[0].split(".")[:2])
    detail = f"torch {version} in {probe.get('executable')} (Python {probe.get('python')})"
    if found.gpus and not probe.get("gpus"):
        return Check("torch", "warn", detail + ": torch sees no GPU")
    matching = [c for c in testable if c.torch_family == family]
    if testable and not matching:
        fams = ", ".join(sorted({c.torch_family for c in testable}))
        return Check("torch", "warn", detail + f"; no testable cell uses torch {family} (cells: {fams})")
    return Check("torch", "pass", detail)


def check_nox(host: Host) -> Check:
    where = host.which("nox")
    if where:
        return Check("nox", "pass", f"{where} (the generated GPU jobs run `nox -s gpu-parity`)")
    return Check(
        "nox", "warn", "nox not on PATH: the generated GPU jobs run `nox -s gpu-parity` (pip install nox)"
    )


def labels_for(host: Host, found: Discovery, driver_majors: set[int]) -> list[str]:
    """Labels the runner should advertise: self-hosted, linux, x64, gpu, sm90, cuda13 / rocm, gfx942."""
    cpu = host.cpu_arch()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        cpu.lower(), cpu.lower()
    )
    labels = ["self-hosted", "linux", arch]
    if found.gpus:
        labels.append("gpu")
    if found.vendor == "amd":
        labels.append("rocm")
    labels.extend(sorted({arch_label(g.arch) for g in found.gpus if g.arch}))
    labels.extend(cuda_label(m) for m in sorted(driver_majors))
    return labels
