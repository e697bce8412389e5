"""The kernel lane: flash-attn's torch-free kernel units compiled with nvcc while the torch venv is made.

With the ``torch-free-kernels`` patch the kernel units (``.cu``) include no torch header, so they can compile
as soon as the sources are unpacked and the toolkit is known; only the binding (``flash_api.cpp``) waits for
torch. The lane composes each unit's nvcc command the way torch's ``BuildExtension`` will (torch's common nvcc
flags, the nvcc flags and sources setup.py declares, the arch, thread and profile knobs), runs the units
longest first on ``jobs`` workers, and writes each object with ``lane.json`` (the flags it used) into
``build_dir/kernel-lane``. The setup hook links an object only where torch's own flags for that unit, less
what only torch's headers read, are the same (the hook's ``normalized_flags``); any other unit is compiled by ninja as
before, so a lane that guessed wrong costs time, never a wrong object.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from .patches import PATCHES_DIR
from .procs import RssSampler, run_tracked
from .report import Reporter
from .spec import BuildSpec

LANE_DIR = "kernel-lane"
LANE_FILE = "lane.json"
EXTENSION = "flash_attn_2_cuda"
# torch.utils.cpp_extension.COMMON_NVCC_FLAGS and unix_cuda_flags' -fPIC (the same in torch 2.4-2.14)
TORCH_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
    "--compiler-options",
    "'-fPIC'",  # with its quotes: nvcc hands it to the host compiler through a shell
)
# flash-attn's CUDAExtension include_dirs, relative to the folder holding setup.py
INCLUDE_DIRS = ("csrc/flash_attn", "csrc/flash_attn/src", "csrc/cutlass/include")
# the arches flash-attn 2.x's setup.py turns into -gencode pairs, in its order
SETUP_ARCHES = ("80", "90", "100", "120")


def setup_hook() -> ModuleType:
    """attnforge's setup hook (the filters setup.py applies), loaded from the builder's patches."""
    spec = importlib.util.spec_from_file_location("attnforge_setup_hook", PATCHES_DIR / "setup_hook.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def declared(setup_py: Path) -> tuple[list[str], list[str]]:
    """(the CUDA extension's sources, the ``nvcc_flags`` list) as setup.py spells them; empty when it
    declares them in a way that is not a literal list."""
    tree = ast.parse(setup_py.read_text(encoding="utf-8"))
    sources: list[str] = []
    flags: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "nvcc_flags" for t in node.targets
        ):
            with_strings = _strings(node.value)
            flags = with_strings if with_strings is not None else flags
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "CUDAExtension":
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            name = kw.get("name")
            listed = _strings(kw["sources"]) if "sources" in kw else None
            if isinstance(name, ast.Constant) and name.value == EXTENSION and listed:
                sources = listed  # the CUDA branch's literal list (the ROCm branch names a variable)
    return sources, flags


def _strings(node: ast.AST) -> list[str] | None:
    if isinstance(node, ast.List) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [str(e.value) for e in node.elts if isinstance(e, ast.Constant)]
    return None


def gencode(archs: str) -> list[str]:
    """setup.py's -gencode pairs for FLASH_ATTN_CUDA_ARCHS (``"80;90"``)."""
    wanted = {a.strip() for a in archs.split(";") if a.strip()}
    out: list[str] = []
    for arch in SETUP_ARCHES:
        if arch in wanted:
            out += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    return out


def unit_flags(
    tree: Path, nvcc_flags: list[str], env: dict[str, str], cuda_home: str
) -> tuple[list[str], list[str]]:
    """One kernel unit's nvcc arguments before and after ``-c SRC -o OBJ``, in the order torch writes them
    into build.ninja (its ``cuda_cflags`` and ``cuda_post_cflags``), unquoted."""
    pre = [f"-I{tree / d}" for d in INCLUDE_DIRS] + [f"-I{os.path.join(cuda_home, 'include')}", "-c"]
    policy = [g for g in env.get("ATTNFORGE_GENCODE", "").split(";") if g]  # the setup hook's replacement
    post = [*TORCH_NVCC_FLAGS, *nvcc_flags]
    post += [] if policy else gencode(env.get("FLASH_ATTN_CUDA_ARCHS", ""))
    post += ["--threads", env.get("NVCC_THREADS") or "4", *env.get("ATTNFORGE_DEFINES", "").split()]
    for pair in policy:  # the hook drops setup.py's -gencode pairs and appends these after its defines
        post += ["-gencode", pair]
    if env.get("CC"):
        post += ["-ccbin", env["CC"]]
    return pre, post


class KernelLane:
    """Compiles the kernel units on a pool of ``jobs`` threads; ``wait`` joins them."""

    def __init__(
        self,
        spec: BuildSpec,
        tree: Path,
        env: dict[str, str],
        cuda_home: str,
        jobs: int,
        rep: Reporter,
        on_unit: Callable[[str], None],
        t0: float | None = None,
    ) -> None:
        self.spec, self.tree, self.env, self.rep = spec, tree, env, rep
        self.cuda_home, self.jobs, self.on_unit = cuda_home, max(1, jobs), on_unit
        self.dir = Path(spec.build_dir) / LANE_DIR
        self.units: dict[str, dict[str, Any]] = {}  # source -> {"object", "start_s", "end_s", "ok", "lines"}
        self.pre: list[str] = []
        self.post: list[str] = []
        self.flags: list[str] = []  # pre + post, shell-quoted as torch passes them to its ninja file
        self.binding: list[str] = []  # the sources left to ninja (they need torch)
        self.started = time.monotonic() if t0 is None else t0  # unit times count from here
        # the lane's compilers are the builder's children; sampled often enough for a unit of a few seconds
        self.sampler = RssSampler(os.getpid(), interval=0.25)
        self._threads: list[threading.Thread] = []
        self._queue: list[str] = []
        self._lock = threading.Lock()
        self._running: list[subprocess.Popen[str]] = []

    def plan(self) -> list[str]:
        """The kernel units this build compiles, longest first; [] when setup.py's declarations can't be read."""
        hook = setup_hook()
        sources, nvcc_flags = declared(self.tree / "setup.py")
        if not sources or not nvcc_flags:
            return []
        head_dims = {int(x) for x in self.env.get("ATTNFORGE_HEAD_DIMS", "").split(",") if x.strip()}
        dtypes = {x for x in self.env.get("ATTNFORGE_DTYPES", "").split(",") if x.strip()}
        drop_bwd = self.env.get("ATTNFORGE_DROP_BACKWARD") == "1"
        kept_all = [s for s in sources if hook.keep_source(s, head_dims, dtypes, drop_bwd)]
        kept = [s for s in kept_all if s.endswith(".cu")]
        self.binding = [s for s in kept_all if not s.endswith(".cu")]
        estimates = hook.unit_seconds(self.env.get("ATTNFORGE_UNIT_SECONDS", ""))
        self.pre, self.post = unit_flags(self.tree, nvcc_flags, self.env, self.cuda_home)
        self.flags = [shlex.quote(f) for f in (*self.pre, *self.post)]
        return list(hook.longest_first(kept, estimates))

    def start(self) -> list[str]:
        """Write lane.json and start the workers; the units queued (empty: nothing to do early)."""
        order = self.plan()
        if not order:
            return []
        self.dir.mkdir(parents=True, exist_ok=True)
        previous = self._previous()
        for src in order:
            obj = self.dir / (Path(src).stem + ".o")
            done = previous.get(src, {}).get("ok") and obj.is_file()
            self.units[src] = {"object": str(obj), "ok": True if done else None, "reused": bool(done)}
            if not done:
                self._queue.append(src)
        self._write()
        queued = len(self._queue)
        if queued:
            self.sampler.start()
        for i in range(min(self.jobs, len(self._queue))):
            t = threading.Thread(target=self._worker, name=f"kernel-lane-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self.rep.line(
            f"attnforge: kernel lane: compiling {queued} kernel units with {self.jobs} jobs "
            "while torch installs"
        )
        return order

    def _previous(self) -> dict[str, Any]:
        """A resumed build's finished units, when they were compiled with the same flags."""
        try:
            data = json.loads((self.dir / LANE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return dict(data.get("units", {})) if data.get("flags") == self.flags else {}

    def _write(self) -> None:
        state = {
            "flags": self.flags,
            "tree": str(self.tree),
            "cuda_home": self.cuda_home,
            "units": self.units,
        }
        tmp = self.dir / (LANE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1), encoding="utf-8")
        os.replace(tmp, self.dir / LANE_FILE)

    def _worker(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                src = self._queue.pop(0)
            try:
                self._compile(src)
            except Exception as exc:  # an OS error: the unit is ninja's again, the lane goes on
                self._finish(src, False, 0.0, 0.0, [repr(exc)])

    def _compile(self, src: str) -> None:
        obj = Path(self.units[src]["object"])
        part = obj.with_name(obj.stem + ".part.o")
        nvcc = self.env.get("PYTORCH_NVCC") or os.path.join(self.cuda_home, "bin", "nvcc")
        cmd = [*shlex.split(nvcc), *self.pre, "-c", str(self.tree / src), "-o", str(part), *self.post]
        start = time.monotonic() - self.started
        code, out = run_tracked(cmd, self.env, str(self.tree), self._running.append)
        end = time.monotonic() - self.started
        ok = code == 0 and part.is_file()
        if ok:
            os.replace(part, obj)
        else:
            self.rep.line(f"attnforge: kernel lane: {src} failed (exit {code}); ninja compiles it")
        self._finish(src, ok, start, end, out.splitlines()[-12:])
        if ok:
            self.on_unit(Path(src).stem)

    def _finish(self, src: str, ok: bool, start: float, end: float, lines: list[str]) -> None:
        with self._lock:
            self.units[src].update(ok=ok, start_s=round(start, 1), end_s=round(end, 1), lines=lines)
            self._running[:] = [p for p in self._running if p.poll() is None]
            self._write()

    def wait(self) -> dict[str, Any]:
        """Join the workers; what the lane did, for result.json."""
        for t in self._threads:
            t.join()
        self.sampler.stop()
        peaks = self.sampler.unit_peaks
        with self._lock:
            return {
                "jobs": self.jobs,
                "units": {
                    Path(s).stem: {**u, "peak_rss_gb": round(peaks.get(Path(s).stem, 0) / 1024**3, 2)}
                    for s, u in self.units.items()
                },
                "peak_single_gb": round(self.sampler.peak_single / 1024**3, 2),
                "flags": self.flags,
            }

    def stop(self) -> None:
        """Stop the lane (the build failed before it could link): queued units are dropped, running compilers
        stopped, and lane.json marks what did not finish as failed."""
        with self._lock:
            self._queue.clear()
            for proc in self._running:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for t in self._threads:
            t.join(timeout=30)
        self.sampler.stop()
        with self._lock:
            for unit in self.units.values():
                if unit.get("ok") is None:
                    unit["ok"] = False
            if self.dir.is_dir():
                self._write()
