"""`attnforge pull`: pick the registry's image that fits this host (driver, GPU arch), and say why.

Candidates are the immutable tags of a repository (`/v2/<name>/tags/list`), described by their labels
(read from each image's config blob: io.attnforge.toolkit, .arches, .torch, ...). A CUDA image fits when
the driver supports its CUDA major version (minor-version compatibility) and every GPU runs one of its
arches (SASS of sm_XY runs on the same major with an equal or higher minor; sm_90a-style arches only on
their own GPU). Among the fitting ones: an exact arch match first, then the newest toolkit the driver
supports, newest torch, newest flash-attn, the full profile, runtime before NGC.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from attnforge.core.arches import sm_of_compute_cap
from attnforge.images.registry import Registry
from attnforge.images.tags import LABEL_PREFIX, is_alias, parse_tag
from attnforge.matrix.compat import DriverFloor
from attnforge.names import cuda_version

# Minimum Linux driver per CUDA major (CUDA minor-version compatibility); the compat data's [[driver]] wins.
DRIVER_FLOORS = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def _v(text: str) -> Version:
    try:
        return Version(text.split("+")[0])
    except InvalidVersion:
        return Version("0")


@dataclass
class Host:
    """What the images must run on."""

    gpus: list[tuple[str, str]] = field(default_factory=list)  # (name, sm_XY)
    driver: str | None = None
    cuda: str | None = None  # the newest CUDA the driver supports (nvidia-smi's header)
    source: str = "none"

    def describe(self) -> str:
        if not self.gpus:
            return f"no GPU ({self.source})"
        names = ", ".join(f"{n} ({a})" for n, a in self.gpus)
        return f"{names}; driver {self.driver or '?'} (CUDA {self.cuda or '?'}) [{self.source}]"


def detect_host(nvidia_smi: str = "nvidia-smi") -> Host:
    """GPUs and driver from nvidia-smi; Host with no GPU when it is absent or finds none."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return Host(source="nvidia-smi not found")
    q = subprocess.run(
        [exe, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    if q.returncode != 0:
        return Host(source=f"nvidia-smi failed: {(q.stdout + q.stderr).strip()[:120]}")
    gpus: list[tuple[str, str]] = []
    driver = None
    for line in q.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append((parts[0], sm_of_compute_cap(parts[1])))
            driver = parts[2]
    head = subprocess.run([exe], capture_output=True, text=True, check=False).stdout
    m = re.search(r"CUDA Version:\s*([\d.]+)", head)
    return Host(gpus=gpus, driver=driver, cuda=m.group(1) if m else None, source="nvidia-smi")


def host_from_args(gpu: tuple[str, ...], driver: str | None, cuda: str | None) -> Host:
    """A host described on the command line (choose for another machine)."""
    gpus = [(f"--gpu {a}", a if a.startswith("sm_") else sm_of_compute_cap(a)) for a in gpu]
    return Host(gpus=gpus, driver=driver, cuda=cuda, source="given on the command line")


def max_cuda_major(host: Host, floors: dict[int, str]) -> int | None:
    if host.cuda:
        return int(host.cuda.split(".")[0])
    if host.driver:
        ok = [major for major, floor in floors.items() if _v(host.driver) >= _v(floor)]
        return max(ok) if ok else 0
    return None


def arch_fit(gpu: str, arches: list[str]) -> str | None:
    """'exact' or 'compatible' when SASS for one of arches runs on gpu; None otherwise."""
    if gpu in arches:
        return "exact"
    m = re.fullmatch(r"sm_(\d+)", gpu)
    if not m:
        return None
    g = int(m.group(1))
    for a in arches:
        ma = re.fullmatch(r"sm_(\d+)", a)
        if ma and int(ma.group(1)) // 10 == g // 10 and int(ma.group(1)) <= g:
            return "compatible"
    return None


@dataclass
class Candidate:
    """One tag of the registry, its labels and the verdict."""

    tag: str
    labels: dict[str, str]
    fits: bool = False
    reasons: list[str] = field(default_factory=list)
    exact: bool = False

    def label(self, key: str) -> str:
        return self.labels.get(LABEL_PREFIX + key, "")

    def sort_key(self) -> tuple[object, ...]:
        cuda = cuda_version(self.label("toolkit"))
        return (
            self.exact,
            _v(cuda) if cuda is not None else Version("0"),
            _v(self.label("torch")),
            _v(self.label("flash-attn")),
            self.label("profile") == "full",
            self.label("kind") == "runtime",
            _v(self.label("python")),
        )


def evaluate(
    cand: Candidate, host: Host, *, floors: dict[int, str], kind: str = "any", python: str | None = None
) -> Candidate:
    """Fill cand.fits and cand.reasons."""
    reasons: list[str] = []
    if not cand.labels.get(LABEL_PREFIX + "toolkit"):
        cand.reasons = ["no io.attnforge labels: not an attnforge image"]
        return cand
    if kind != "any" and cand.label("kind") != kind:
        reasons.append(f"kind {cand.label('kind')}, asked for {kind}")
    if python and cand.label("python") != python:
        reasons.append(f"Python {cand.label('python')}, asked for {python}")
    toolkit = cand.label("toolkit")
    arches = [a for a in cand.label("arches").split(",") if a]
    if toolkit.startswith("rocm"):
        reasons.append("a ROCm image: needs an AMD GPU (not detected)")
    elif (cuda := cuda_version(toolkit)) is not None:
        if not host.gpus:
            reasons.append(f"needs an NVIDIA GPU ({toolkit}); host has {host.describe()}")
        else:
            need = int(cuda.split(".")[0])
            have = max_cuda_major(host, floors)
            if have is None:
                reasons.append("driver version unknown")
            elif have < need:
                floor = floors.get(need, "?")
                reasons.append(
                    f"{toolkit} needs driver >= {floor} (CUDA {need}.x); host driver {host.driver} "
                    f"supports CUDA {host.cuda or have}"
                )
            fits = [arch_fit(arch, arches) for _, arch in host.gpus]
            if any(f is None for f in fits):
                bad = sorted({a for (_, a), f in zip(host.gpus, fits, strict=True) if f is None})
                reasons.append(f"built for {','.join(arches) or 'no arch'}: no kernel for {', '.join(bad)}")
            cand.exact = all(f == "exact" for f in fits)
    cand.reasons = reasons
    cand.fits = not reasons
    return cand


def choose(
    registry: Registry,
    repository: str,
    host: Host,
    *,
    kind: str = "any",
    python: str | None = None,
    drivers: list[DriverFloor] | None = None,
) -> tuple[Candidate | None, list[Candidate]]:
    """(the best fitting candidate or None, every candidate evaluated)."""
    floors = dict(DRIVER_FLOORS)
    for row in drivers or []:
        floors[row.cuda_major] = row.min_driver
    cands: list[Candidate] = []
    for tag in registry.tags(repository):
        if is_alias(tag) or parse_tag(tag) is None:
            continue
        cand = Candidate(tag, registry.labels(repository, tag))
        cands.append(evaluate(cand, host, floors=floors, kind=kind, python=python))
    fitting = [c for c in cands if c.fits]
    best = max(fitting, key=lambda c: c.sort_key()) if fitting else None
    return best, cands


def why_text(best: Candidate, cands: list[Candidate]) -> str:
    fit = [c for c in cands if c.fits]
    arch = "exact arch match" if best.exact else "arch-compatible"
    return (
        f"{best.label('variant')} ({best.label('toolkit')}, torch {best.label('torch')}, arches "
        f"{best.label('arches')}): {arch}; {len(fit)} of {len(cands)} images fit, this one ranks first "
        "(exact arch, newest toolkit the driver runs, newest torch and flash-attn, full profile, runtime)"
    )
