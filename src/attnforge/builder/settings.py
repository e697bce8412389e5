"""A cell's build settings as one frozen value: MAX_JOBS, NVCC_THREADS and job memory, each with where it came
from (command line, environment, matrix, or measured/auto), and room for this round's new ones (a glibc floor,
an interpreter image). The host resolves them once (`attnforge.engine.settings.resolve_settings`) and the spec
carries them; the builder only adjusts them at run time (a cgroup that turns out smaller, an OOM resume), and
says so. Standard library only: the builder reads it inside build containers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# where a value came from, in the order they are asked
FROM_COMMAND_LINE = "command line"
FROM_ENVIRONMENT = "environment"
FROM_MATRIX = "matrix"
FROM_AUTO = "auto"

NAMES = ("max_jobs", "nvcc_threads", "job_memory_gb", "glibc_floor", "interpreter_image")


@dataclass(frozen=True)
class BuildSettings:
    """What one cell's build runs with, and why (`sources` maps a setting's name to where it came from)."""

    max_jobs: int
    nvcc_threads: int
    job_memory_gb: float  # one compile job's peak: the per-arch figure x the arches nvcc compiles at once
    reason: str = ""  # the chooser's sentence: the machine, the reserve, the fit
    fits: bool = True
    sources: tuple[tuple[str, str], ...] = ()
    glibc_floor: str | None = None
    interpreter_image: str | None = None

    def source(self, name: str) -> str:
        """Where setting `name` came from ("" when nothing says)."""
        return dict(self.sources).get(name, "")

    def line(self) -> str:
        """The one line a build prints: each setting, its value and its source."""
        parts = [
            f"max_jobs={self.max_jobs} ({self.source('max_jobs')})",
            f"nvcc_threads={self.nvcc_threads} ({self.source('nvcc_threads')})",
            f"job_memory={self.job_memory_gb:.1f} GiB ({self.source('job_memory_gb')})",
        ]
        for name in ("glibc_floor", "interpreter_image"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value} ({self.source(name)})")
        text = "settings: " + ", ".join(parts)
        if not self.fits:  # the chooser's numbers when it gave them
            said = self.reason.partition("WARNING: ")[2]
            text += "; WARNING: " + (said or f"{self.max_jobs} job(s) may not fit in memory")
        return text

    def adjusted(self, why: str, **changes: Any) -> BuildSettings:
        """A run-time adjustment of resolved values (not a second resolution): the source of each changed
        setting says what it was and why it changed."""
        sources = dict(self.sources)
        for name, value in changes.items():
            if name not in NAMES:
                raise ValueError(f"{name} is not a build setting")
            sources[name] = f"{getattr(self, name)} -> {value} at run time: {why}"
        return dataclasses.replace(self, sources=tuple(sorted(sources.items())), **changes)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["sources"] = dict(self.sources)
        return data

    @classmethod
    def from_json(cls, data: Any) -> BuildSettings:
        """Read back `to_json`; ValueError naming the first field at fault."""
        if not isinstance(data, dict):
            raise ValueError("must be a JSON object")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}")
        values = dict(data)
        for name in ("max_jobs", "nvcc_threads"):
            value = values.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: {value!r} is not a whole number >= 1")
        memory = values.get("job_memory_gb")
        if not isinstance(memory, (int, float)) or isinstance(memory, bool) or memory < 0:
            raise ValueError(f"job_memory_gb: {memory!r} is not a number >= 0")
        sources = values.get("sources", {})
        if not isinstance(sources, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in sources.items()
        ):
            raise ValueError("sources: must map setting names to strings")
        values["sources"] = tuple(sorted(sources.items()))
        values["job_memory_gb"] = float(memory)
        return cls(**values)
