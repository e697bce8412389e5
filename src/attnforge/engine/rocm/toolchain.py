"""What a CK (Composable Kernel) build needs on the machine, and a plain sentence for what is missing.

attnforge has never compiled CK (docs/rocm.md): no ROCm toolchain, ROCm torch or AMD GPU is reachable from this
project's machines, and the builder (`attnforge.builder`) drives CUDA builds only. A CK cell is refused
before anything runs, with the list of what this machine lacks.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from attnforge.engine.rocm.build_plan import TORCH_INDEX_URL, torch_index_name
from attnforge.matrix.cell import Cell
from attnforge.matrix.compat import CompatData

ROCM_BASE_IMAGE = "rocm/dev-ubuntu-22.04:{version}"


def rocm_root() -> Path:
    """$ROCM_PATH, else /opt/rocm."""
    return Path(os.environ.get("ROCM_PATH") or "/opt/rocm")


def find_hipcc() -> Path | None:
    """hipcc on PATH, else in $ROCM_PATH/bin (or /opt/rocm/bin)."""
    on_path = shutil.which("hipcc")
    if on_path:
        return Path(on_path)
    candidate = rocm_root() / "bin" / "hipcc"
    return candidate if candidate.is_file() else None


def installed_rocm_version() -> str | None:
    """The ROCm release of $ROCM_PATH (`.info/version`, e.g. 6.4.1-120), None without one."""
    info = rocm_root() / ".info" / "version"
    try:
        return info.read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class CkNeeds:
    """What a CK cell needs, and which of it this machine has."""

    cell_id: str
    hipcc: Path | None
    rocm_version: str | None
    want_rocm: str
    torch_requirement: str
    torch_index_url: str

    def missing(self) -> list[str]:
        """What this machine lacks, in words (empty: hipcc and the cell's ROCm release are installed)."""
        out: list[str] = []
        if self.hipcc is None:
            out.append(f"hipcc (not on PATH, not in {rocm_root() / 'bin'})")
        version = self.rocm_version
        if version is None:
            out.append(f"a ROCm {self.want_rocm} install ({rocm_root() / '.info/version'} absent)")
        elif not (
            version == self.want_rocm or version.startswith((self.want_rocm + ".", self.want_rocm + "-"))
        ):
            out.append(f"ROCm {self.want_rocm} (this machine has {version})")
        return out

    def sentence(self) -> str:
        """What this machine lacks for the cell, and what else a CK build needs."""
        missing = self.missing()
        have = (
            f"missing {'; '.join(missing)}" if missing else f"hipcc at {self.hipcc}, ROCm {self.rocm_version}"
        )
        base = ROCM_BASE_IMAGE.format(version=self.want_rocm)
        return (
            f"{self.cell_id}: {have}.\n  A CK build also needs a ROCm torch ({self.torch_requirement} from "
            f"{self.torch_index_url}) and a CK path in attnforge's builder, which does not exist yet: attnforge "
            f"has never compiled CK (`attnforge docs rocm`). Its builder image: docker/rocm-builder.Dockerfile on {base}."
        )


def ck_needs(cell: Cell, data: CompatData | None = None) -> CkNeeds:
    """Check this machine for what the CK cell `cell` needs."""
    index = torch_index_name(cell, data)
    return CkNeeds(
        cell_id=cell.id,
        hipcc=find_hipcc(),
        rocm_version=installed_rocm_version(),
        want_rocm=cell.toolkit.version,
        torch_requirement=f"torch=={cell.torch}",
        torch_index_url=TORCH_INDEX_URL.format(name=index),
    )
