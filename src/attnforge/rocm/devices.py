"""AMD GPUs for the runner side: `docker run` flags, and gfx arches from amd-smi / rocm-smi / rocminfo / KFD.

Formats (see tests/data/rocm/, reconstructed from the tools' documentation, not captured on a machine):

- ``amd-smi static --json``: a list of GPUs (ROCm <= 6.3) or ``{"gpu_data": [...]}``; the arch is
  ``asic.target_graphics_version`` (``gfx942``).
- ``rocm-smi --showproductname --json``: ``{"card0": {"GFX Version": "gfx90a", ...}, "system": {...}}``,
  possibly after ``WARNING:`` lines; releases before ROCm 5.7 have no ``GFX Version``.
- ``rocminfo``: one ``Agent N`` block per agent; GPU agents have ``Device Type: GPU`` and ``Name: gfx90a``
  (the ISA line spells it ``amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-``).
- KFD topology (``/sys/class/kfd/kfd/topology/nodes/N/properties``): ``gfx_target_version 90010`` =
  major*10000 + minor*100 + stepping; the LLVM name writes minor and stepping as hex digits (gfx90a).
  Tools that print the stepping in decimal give ``gfx9010``: normalised back to ``gfx90a`` here.
"""

from __future__ import annotations

import grp
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AMD_DOCKER_FLAGS: tuple[str, ...] = (
    "--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video",
    "--security-opt", "seccomp=unconfined",
)  # fmt: skip

# LLVM AMDGPU processors from GFX9 on (llvm.org/docs/AMDGPUUsage.html), for telling real names from
# mis-decoded ones; an unlisted name of the right shape is still accepted as it is.
KNOWN_GFX = frozenset((
    "gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909", "gfx90a", "gfx90c",
    "gfx940", "gfx941", "gfx942", "gfx950",
    "gfx1010", "gfx1011", "gfx1012", "gfx1013",
    "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
    "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153",
    "gfx1200", "gfx1201", "gfx1250", "gfx1251",
))  # fmt: skip
# flash_attn/flash_attn_triton_amd/utils.py (2.8.3): arches it classifies as CDNA or RDNA.
TRITON_AMD_GFX: tuple[str, ...] = (
    "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950",
    "gfx1030", "gfx1100", "gfx1101", "gfx1102", "gfx1200", "gfx1201",
)  # fmt: skip

_GFX_RE = re.compile(r"gfx[0-9a-f]{3,4}")
_DECIMAL_STEPPING_RE = re.compile(r"gfx(9|1[0-2])(\d)(1[0-5])")


@dataclass(frozen=True)
class AmdGpu:
    """One GPU as a tool lists it; `gfx` is "" when the tool does not say."""

    index: int
    name: str
    gfx: str


def gfx_from_target_version(value: int) -> str:
    """KFD's gfx_target_version (90010) -> gfx90a."""
    major, minor, step = value // 10000, (value // 100) % 100, value % 100
    return f"gfx{major}{minor:x}{step:x}"


def normalize_gfx(raw: object) -> str | None:
    """A gfx name from any tool's spelling: gfx942, GFX942, 90402, amdgcn-amd-amdhsa--gfx90a:xnack-, gfx9010."""
    text = str(raw).strip().lower()
    if text.isdigit() and len(text) >= 5:
        value = int(text)
        return gfx_from_target_version(value) if value else None
    text = text.removeprefix("amdgcn-amd-amdhsa--").split(":")[0]
    if text in KNOWN_GFX:
        return text
    m = _DECIMAL_STEPPING_RE.fullmatch(text)
    if m:
        return f"gfx{m[1]}{int(m[2]):x}{int(m[3]):x}"
    return text if _GFX_RE.fullmatch(text) else None


def _json_in(text: str) -> Any:
    """The JSON value in a tool's output: from the first line that opens one (WARNING lines come before)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("{", "[")):
            return json.loads("".join(lines[i:]))
    raise ValueError("no JSON in the output")


def parse_amd_smi_static(text: str) -> list[AmdGpu]:
    """`amd-smi static --json` (bare list or {"gpu_data": [...]})."""
    data = _json_in(text)
    rows = data.get("gpu_data", []) if isinstance(data, dict) else data
    gpus = []
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        if not isinstance(row, dict):
            continue
        asic: dict[str, Any] = row["asic"] if isinstance(row.get("asic"), dict) else {}
        gfx = normalize_gfx(asic.get("target_graphics_version", "")) or ""
        index = row.get("gpu", i)
        gpus.append(
            AmdGpu(int(index) if str(index).isdigit() else i, str(asic.get("market_name") or "AMD GPU"), gfx)
        )
    return gpus


def parse_rocm_smi_productname(text: str) -> list[AmdGpu]:
    """`rocm-smi --showproductname --json`: card0, card1, ... (GFX Version since ROCm 5.7)."""
    data = _json_in(text)
    if not isinstance(data, dict):
        return []
    cards = sorted((k for k in data if re.fullmatch(r"card\d+", k)), key=lambda k: int(k[4:]))
    gpus = []
    for key in cards:
        card = data[key] if isinstance(data[key], dict) else {}
        name = str(card.get("Card Series") or card.get("Card series") or "AMD GPU")
        gpus.append(AmdGpu(int(key[4:]), name, normalize_gfx(card.get("GFX Version", "")) or ""))
    return gpus


def parse_rocminfo(text: str) -> list[AmdGpu]:
    """`rocminfo`: the GPU agents (CPU agents skipped), numbered in order of appearance."""
    gpus: list[AmdGpu] = []
    for block in re.split(r"^\*{5,}\s*\n\s*Agent \d+\s*\n\*{5,}\s*$", text, flags=re.M)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.strip().partition(":")
            if sep and key not in fields:  # the agent's own fields come before its ISA sections
                fields[key.strip()] = value.strip()
        if fields.get("Device Type", "").upper() != "GPU":
            continue
        gfx = normalize_gfx(fields.get("Name", "")) or ""
        gpus.append(AmdGpu(len(gpus), fields.get("Marketing Name") or "AMD GPU", gfx))
    return gpus


def parse_kfd_properties(text: str) -> str | None:
    """One KFD topology node's `properties`: its gfx name, None for a CPU node (gfx_target_version 0)."""
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "gfx_target_version" and value.strip().isdigit():
            return normalize_gfx(value.strip())
    return None


def parse_kfd_topology(root: Path) -> list[AmdGpu]:
    """GPUs from a KFD topology tree (`/sys/class/kfd/kfd/topology`): works with no ROCm tool installed."""
    gpus: list[AmdGpu] = []
    nodes = sorted((root / "nodes").glob("*/properties"), key=lambda p: int(p.parent.name))
    for props in nodes:
        gfx = parse_kfd_properties(props.read_text(errors="replace"))
        if gfx:
            gpus.append(AmdGpu(len(gpus), f"KFD node {props.parent.name}", gfx))
    return gpus


PARSERS = {
    "amd-smi": parse_amd_smi_static,
    "rocm-smi": parse_rocm_smi_productname,
    "rocminfo": parse_rocminfo,
}


def parse_tool_output(tool: str, text: str) -> list[AmdGpu]:
    """Dispatch on the tool's name (amd-smi, rocm-smi, rocminfo); ValueError for unreadable output."""
    try:
        parser = PARSERS[tool]
    except KeyError:
        raise ValueError(f"unknown tool {tool!r} (known: {', '.join(PARSERS)})") from None
    return parser(text)


def gfx_arches(gpus: Iterable[AmdGpu]) -> list[str]:
    """The distinct gfx arches of the GPUs, sorted (unknown ones left out)."""
    return sorted({g.gfx for g in gpus if g.gfx})


def docker_run_flags(render_nodes: Sequence[str] = (), group_ids: Sequence[int] = ()) -> list[str]:
    """`docker run` flags for AMD GPUs.

    Default: all GPUs (/dev/kfd + /dev/dri). `render_nodes` (e.g. /dev/dri/renderD128) limits the container
    to those GPUs. `group_ids`: numeric groups to add, e.g. the host's `render` group, which owns the render
    nodes on Ubuntu >= 20.04 and may not exist by name inside the image.
    """
    flags = list(AMD_DOCKER_FLAGS)
    if render_nodes:
        flags = ["--device", "/dev/kfd"]
        for node in render_nodes:
            flags += ["--device", node]
        flags += list(AMD_DOCKER_FLAGS[4:])
    for gid in group_ids:
        flags += ["--group-add", str(gid)]
    return flags


def host_render_gid() -> int | None:
    """The host's `render` group id, None when the host has none."""
    try:
        return grp.getgrnam("render").gr_gid
    except KeyError:
        return None


def runs_on(rocm_backend: str, compiled_arches: Sequence[str], device_gfx: str) -> tuple[bool, str]:
    """Whether a wheel can use a device: CK code objects are exact per gfx; Triton JIT-compiles on the device."""
    gfx = normalize_gfx(device_gfx) or device_gfx
    if rocm_backend == "ck":
        if gfx in compiled_arches:
            return True, f"CK kernels compiled for {gfx}"
        return False, f"CK kernels compiled for {', '.join(compiled_arches) or 'nothing'}, not {gfx}"
    if rocm_backend == "triton":
        if gfx in TRITON_AMD_GFX:
            return True, f"Triton backend JIT-compiles for {gfx} (classified by flash_attn_triton_amd)"
        return (
            False,
            f"{gfx} is not among the arches flash_attn_triton_amd knows ({', '.join(TRITON_AMD_GFX)})",
        )
    raise ValueError(f"unknown ROCm backend {rocm_backend!r}")
