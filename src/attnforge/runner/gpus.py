"""Find the GPUs: nvidia-smi (CSV query), amd-smi (`static --json`) or rocm-smi (`--showproductname --json`).

The parsers take the tools' text and return `Gpu` rows; `discover` runs the tools through a `Host`.
Formats handled (see tests/data/runner/ for recorded examples):
- nvidia-smi --query-gpu=driver_version,name,compute_cap,memory.total --format=csv,noheader
  ``580.65.06, NVIDIA H100 80GB HBM3, 9.0, 81559 MiB`` (one line per GPU; compute_cap needs driver >= 510);
- amd-smi static --json: a list of GPUs (ROCm <= 6.3) or ``{"gpu_data": [...]}`` (later releases), each
  with ``asic.market_name``, ``asic.target_graphics_version`` (gfx942), ``vram.size`` (MB, or
  ``{"value", "unit"}``) and ``driver`` (``{"name", "version"}`` or ``{"driver_name", "driver_version"}``);
- rocm-smi --showproductname --json: ``{"card0": {"Card Series", "GFX Version", ...}, "system": {...}}``,
  possibly after WARNING lines.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from attnforge.core.arches import normalize_gfx, sm_of_compute_cap
from attnforge.runner.host import Host

NVIDIA_QUERY = [
    "nvidia-smi",
    "--query-gpu=driver_version,name,compute_cap,memory.total",
    "--format=csv,noheader",
]
NVIDIA_QUERY_OLD = ["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"]
AMD_SMI = ["amd-smi", "static", "--json"]
ROCM_SMI = ["rocm-smi", "--showproductname", "--json"]


@dataclass
class Gpu:
    """One GPU as the report lists it."""

    index: int
    vendor: str  # nvidia | amd
    name: str
    arch: str  # sm_90 | gfx942 | "" when unknown
    compute_cap: str = ""
    memory_mib: int | None = None
    driver: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Discovery:
    """The GPUs found, the driver, and what each tool said."""

    vendor: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    driver: str = ""
    driver_cuda: str = ""  # the CUDA version the NVIDIA driver supports (nvidia-smi header)
    notes: list[str] = field(default_factory=list)


def _memory_mib(text: str) -> int | None:
    m = re.match(r"\s*(\d+)\s*MiB", text)
    return int(m.group(1)) if m else None


def parse_nvidia_csv(text: str, with_compute_cap: bool = True) -> list[Gpu]:
    """Rows of the CSV query (a GPU name may itself contain commas)."""
    gpus: list[Gpu] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        tail = 2 if with_compute_cap else 1
        if len(parts) < 2 + tail:
            continue
        driver, name = parts[0], ", ".join(parts[1 : len(parts) - tail])
        cap = parts[-2] if with_compute_cap else ""
        arch = sm_of_compute_cap(cap) if re.fullmatch(r"\d+\.\d+", cap) else ""
        gpus.append(Gpu(len(gpus), "nvidia", name, arch, cap if arch else "", _memory_mib(parts[-1]), driver))
    return gpus


def parse_nvidia_cuda_version(text: str) -> str:
    """'CUDA Version: 13.0' from plain nvidia-smi output ('' if absent)."""
    m = re.search(r"CUDA Version:\s*(\d+\.\d+)", text)
    return m.group(1) if m else ""


def _json_in(text: str) -> Any:
    """The JSON value in a tool's output, skipping WARNING lines printed before it."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no JSON in the output")
    return json.loads(text[min(starts) :])


def _amd_mib(vram: Any) -> int | None:
    if not isinstance(vram, dict):
        return None
    size = vram.get("size", vram.get("vram_size"))
    unit = "MB"
    if isinstance(size, dict):
        unit = str(size.get("unit", "MB"))
        size = size.get("value")
    try:
        value = float(str(size))
    except (TypeError, ValueError):
        return None
    factor = {"B": 1 / 1024**2, "KB": 1 / 1024, "MB": 1.0, "GB": 1024.0}.get(unit.upper(), 1.0)
    return int(value * factor)


def parse_amd_smi(text: str) -> list[Gpu]:
    """`amd-smi static --json` in either shape (bare list, or {"gpu_data": [...]})."""
    data = _json_in(text)
    rows = data.get("gpu_data", []) if isinstance(data, dict) else data
    gpus: list[Gpu] = []
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        if not isinstance(row, dict):
            continue
        asic = row.get("asic") or {}
        driver = row.get("driver") or {}
        arch = normalize_gfx(asic.get("target_graphics_version") or "") or ""
        gpus.append(
            Gpu(
                index=int(row.get("gpu", i)),
                vendor="amd",
                name=str(asic.get("market_name") or "AMD GPU"),
                arch=arch,
                memory_mib=_amd_mib(row.get("vram")),
                driver=str(driver.get("version") or driver.get("driver_version") or ""),
            )
        )
    return gpus


def parse_rocm_smi(text: str) -> tuple[list[Gpu], str]:
    """`rocm-smi --showproductname --json`: the GPUs (card0, card1, ...) and the driver version."""
    data = _json_in(text)
    gpus: list[Gpu] = []
    if not isinstance(data, dict):
        return gpus, ""
    cards = sorted(
        (k for k in data if re.fullmatch(r"card\d+", k)), key=lambda k: int(k.removeprefix("card"))
    )
    for key in cards:
        card = data[key] if isinstance(data[key], dict) else {}
        arch = normalize_gfx(card.get("GFX Version") or "") or ""
        gpus.append(
            Gpu(
                index=int(key.removeprefix("card")),
                vendor="amd",
                name=str(card.get("Card Series") or card.get("Card series") or "AMD GPU"),
                arch=arch,
            )
        )
    system = data.get("system") if isinstance(data.get("system"), dict) else {}
    driver = str((system or {}).get("Driver version") or "")
    for g in gpus:
        g.driver = driver
    return gpus, driver


def discover(host: Host) -> Discovery:
    """NVIDIA first (nvidia-smi), then AMD (amd-smi, else rocm-smi); notes say what answered and why not."""
    found = Discovery()
    res = host.run(NVIDIA_QUERY, timeout=30)
    with_cap = True
    if res.ok and not res.stdout.strip():
        found.notes.append("nvidia-smi: no GPU listed")
    elif not res.ok and res.returncode != 127 and "compute_cap" in (res.stderr + res.stdout):
        with_cap = False
        found.notes.append("nvidia-smi: compute_cap not queryable (driver < 510): arches unknown")
        res = host.run(NVIDIA_QUERY_OLD, timeout=30)
    if res.ok and res.stdout.strip():
        found.vendor = "nvidia"
        found.gpus = parse_nvidia_csv(res.stdout, with_compute_cap=with_cap)
        found.driver = found.gpus[0].driver if found.gpus else ""
        header = host.run(["nvidia-smi"], timeout=30)
        found.driver_cuda = parse_nvidia_cuda_version(header.stdout) if header.ok else ""
        return found
    if not res.ok:
        found.notes.append(f"nvidia-smi: {res.reason()}")
    for argv in (AMD_SMI, ROCM_SMI):
        res = host.run(argv, timeout=60)
        if not res.ok:
            found.notes.append(f"{argv[0]}: {res.reason()}")
            continue
        try:
            if argv is AMD_SMI:
                gpus, driver = parse_amd_smi(res.stdout), ""
                driver = gpus[0].driver if gpus else ""
            else:
                gpus, driver = parse_rocm_smi(res.stdout)
        except ValueError as exc:
            found.notes.append(f"{argv[0]}: unreadable JSON ({exc})")
            continue
        if gpus:
            found.vendor, found.gpus, found.driver = "amd", gpus, driver
            found.notes.append(f"AMD GPUs from `{' '.join(argv)}`")
            return found
        found.notes.append(f"{argv[0]}: no GPU listed")
    return found
