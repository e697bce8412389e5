"""The engine's order over kernel sets: one cell compiles a set's kernels, the set's other torch releases and
Pythons then bind only, one core each, as many at once as cores are free; and each cell's job names its
own build tree, the set's shared objects and the estimated unit times."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from attnforge.builder.spec import Source
from attnforge.engine.backends.local import LocalBackend
from attnforge.engine.progress import PlainProgressView
from attnforge.engine.resources import Machine
from attnforge.engine.run import CellResult, Engine
from attnforge.matrix.cell import Cell
from attnforge.matrix.project import Project

MATRIX = {
    "version": 1,
    "kernels": {
        "flash-attn": {
            "version": "2.8.3",
            "source": {
                "kind": "pypi-sdist",
                "sha256": "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d",
            },
        }
    },
    "profiles": {
        "fwd128": {
            "tag": "fwd128",
            "head_dims": [128],
            "dtypes": ["bf16"],
            "disable": ["backward", "dropout", "alibi", "softcap", "uneven_k", "local"],
        }
    },
    "defaults": {"kernel": "flash-attn", "cxx11_abi": True, "platform": "x86_64", "profile": "fwd128"},
    "targets": {
        "lane": {
            "matrix": {
                "toolkit": ["cuda13.0"],
                "torch": ["2.12", "2.13", "2.14"],
                "python": ["3.11", "3.12"],
                "arch": ["sm_90"],
            }
        }
    },
}


class TimedEngine(Engine):
    """The real scheduler with a stand-in for one cell's build: records when each cell ran and how."""

    def __init__(self, project: Project) -> None:
        super().__init__(project, LocalBackend(), PlainProgressView())
        self.runs: list[tuple[str, bool, float, float]] = []
        self.guard = threading.Lock()

    def machine(self) -> Machine:
        return Machine(2, 20.0, "test")

    def build_one(self, cell: Cell, digest: str, share: int, binding_only: bool = False) -> CellResult:
        start = time.monotonic()
        time.sleep(0.6 if not binding_only else 0.3)
        if not binding_only:
            objects = self.cache / "cells" / cell.kernel_set_key / "objects"
            objects.mkdir(parents=True, exist_ok=True)
            (objects / "manifest.json").write_text("{}")
        with self.guard:
            self.runs.append((cell.id, binding_only, start, time.monotonic()))
        return CellResult(cell, "built")


def _project(tmp_path: Path) -> Project:
    (tmp_path / "matrix.yaml").write_text(json.dumps(MATRIX))
    return Project(tmp_path / "matrix.yaml")


def test_a_lane_compiles_kernels_once_then_binds_in_parallel(tmp_path: Path) -> None:
    project = _project(tmp_path)
    cells = project.plan("lane").valid
    assert len(cells) == 6 and len({c.kernel_set_key for c in cells}) == 1
    engine = TimedEngine(project)
    results = engine._run_groups([[(c, "h") for c in cells]], None)
    assert sorted(r.cell.id for r in results) == sorted(c.id for c in cells)
    lead = [r for r in engine.runs if not r[1]]
    binds = [r for r in engine.runs if r[1]]
    assert len(lead) == 1 and len(binds) == 5
    assert all(b[2] >= lead[0][3] for b in binds)  # after the kernel objects exist
    at_once = max(sum(1 for o in binds if o[2] <= b[2] < o[3]) for b in binds)
    assert at_once == 2  # two cores: two bindings at a time


def test_jobs_name_their_tree_the_shared_objects_and_unit_estimates(tmp_path: Path) -> None:
    project = _project(tmp_path)
    cells = {(c.torch, c.python): c for c in project.plan("lane").valid}
    engine = TimedEngine(project)
    source = Source("/s/flash_attn-2.8.3.tar.gz", "0" * 64)
    a = engine.job_for(cells[("2.12.1", "3.11")], source, 1, "h")
    b = engine.job_for(cells[("2.14.1", "3.11")], source, 1, "h", binding_only=True)
    assert a.workdir.name == "cp311-torch2.12.1" and b.workdir.name == "cp311-torch2.14.1"
    assert a.spec.kernel_objects_dir == b.spec.kernel_objects_dir
    assert b.spec.max_jobs == 1 and "binding only" in b.settings.reason
    assert set(a.spec.unit_seconds) == {
        "flash_api",
        "flash_fwd_hdim128_bf16_sm80",
        "flash_fwd_hdim128_bf16_causal_sm80",
        "flash_fwd_split_hdim128_bf16_sm80",
        "flash_fwd_split_hdim128_bf16_causal_sm80",
    }
    assert b.spec.patches == ["cxx20-binding", "torch-free-kernels"] and a.spec.patches == [
        "torch-free-kernels"
    ]
