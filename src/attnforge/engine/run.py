"""Turn planned cells into wheels: skip unchanged cells, reuse kernels per kernel-set, retry OOM with fewer jobs.

The engine is backend-agnostic: a backend runs the builder (`attnforge.builder`) with a spec (in Docker, on
the host, or with an existing interpreter); the engine owns ordering, parallelism, logs, manifests and the
atomic move into the output folder. Backends are picked per cell (`backends.routing.route_of`): CUDA cells
go to the one given to the engine, ROCm Triton cells to the host backend with a CPU stand-in torch, ROCm
CK cells to one that refuses them with what is missing.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnforge.builder.exits import EVENT_PREFIX, EXIT_CONTAINER_KILLED, EXIT_ENV, EXIT_OOM
from attnforge.builder.files import sha256_file
from attnforge.builder.settings import BuildSettings
from attnforge.builder.spec import Source
from attnforge.core.errors import AttnforgeError, BuildError, EnvironmentProblem, InterruptedByUser
from attnforge.engine.backends.routing import Route, make_route_backend, route_of
from attnforge.engine.jobs import Backend, CellJob, input_hash, make_spec
from attnforge.engine.progress import ProgressView
from attnforge.engine.resources import JobMemoryTable, Machine, detect_machine
from attnforge.engine.schedule import CellEstimate, cell_estimates, choose_parallel_cells
from attnforge.engine.settings import Requested, resolve_settings
from attnforge.engine.sources import fetch_source
from attnforge.engine.unittimes import BINDING_UNIT, UnitTimeTable, flags_of
from attnforge.engine.venv_ahead import VenvAhead
from attnforge.engine.wheel_record import build_manifest
from attnforge.matrix.cell import Cell
from attnforge.matrix.project import Project
from attnforge.wheels.finalize import finalize_built
from attnforge.wheels.manifest import manifest_path_for, read_manifest
from attnforge.wheels.records import RECORD_SUFFIXES, record_path, write_build_records
from attnforge.wheels.signing_keys import SiteKey, project_signing, signing_key


@dataclass
class CellResult:
    cell: Cell
    status: str  # built | skipped | failed | cancelled
    wheel: Path | None = None
    seconds: float = 0.0
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def up_to_date(output_dir: Path, cell: Cell, digest: str) -> Path | None:
    """The existing wheel when its manifest records the same input hash and the bytes still match."""
    for m in output_dir.glob("*.whl.manifest.json"):
        try:
            data = json.loads(m.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if data.get("cell_id") != cell.id or data.get("input_hash") != digest:
            continue
        wheel = output_dir / str(data.get("wheel", ""))
        if wheel.is_file() and sha256_file(wheel) == data.get("sha256"):
            return wheel
    return None


def compiled_kernels(result: dict[str, Any]) -> bool:
    """Whether the build's peak memory is a compiler's: kernel units compiled, none prebuilt or from ccache
    (a build of cache hits or of the binding alone would teach the memory table a job size far too small)."""
    ccache_hits = (result.get("ccache") or {}).get("hits", 0)
    return bool(result.get("units_compiled")) and not result.get("units_prebuilt") and not ccache_hits


class Engine:
    """Builds a list of cells with one backend."""

    def __init__(
        self,
        project: Project,
        backend: Backend,
        view: ProgressView,
        *,
        force: bool = False,
        requested: Requested | None = None,
        memory_limit_gb: float | None = None,
    ) -> None:
        self.project = project
        self.backend = backend
        self.view = view
        self.force = force
        build = project.matrix.build
        self.requested = requested or Requested()  # command line and environment; the matrix is asked later
        self.memory_limit_gb = memory_limit_gb
        self.cache = project.path(build.cache_dir)
        self.output = project.path(build.output_dir)
        self.logs = self.output / "logs"
        self.memory_table = JobMemoryTable(self.cache / "job_memory.json")
        self.unit_table = UnitTimeTable(self.cache / "unit_times.json")
        self._running: dict[str, CellJob] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._routes: dict[Route, Backend] = {}
        self._signing_key: SiteKey | None = None

    def signing_key(self) -> SiteKey:
        """The key the build's records are signed with (resolved once; docs/records.md)."""
        if self._signing_key is None:
            key = signing_key(project_signing(self.project), log=self.view.log)
            assert key is not None
            self._signing_key = key
        return self._signing_key

    def backend_for(self, cell: Cell) -> Backend:
        """The backend that builds `cell` (see `routing`): the engine's own one for CUDA cells."""
        route = route_of(cell)
        if route == "default":
            return self.backend
        if route not in self._routes:
            self._routes[route] = make_route_backend(route, self.project)
        return self._routes[route]

    # ---- planning one job ----
    def machine(self) -> Machine:
        machine = detect_machine()
        if self.memory_limit_gb is not None:
            machine = Machine(
                machine.cores, min(machine.memory_available_gb, self.memory_limit_gb), "--memory-limit"
            )
        return machine

    def estimate(self, cell: Cell) -> CellEstimate:
        """The cell's units with estimated compile seconds on this machine (`unittimes`)."""
        return CellEstimate(cell_estimates(self.unit_table, cell))

    def settings(self, cell: Cell, share: int, binding_only: bool = False) -> BuildSettings:
        """The cell's build settings, resolved once (`engine.settings.resolve_settings`)."""
        res = self.project.matrix.build.resources
        est = None if binding_only or cell.pure_python else self.estimate(cell)
        return resolve_settings(
            cell,
            res,
            self.requested,
            machine=self.machine(),
            table=self.memory_table,
            share=share,
            reserve_gb=res.reserve_memory_gb if self.memory_limit_gb is None else 0.0,
            durations=(est.durations() or None) if est else None,
            binding_only=binding_only,
        )

    def job_for(
        self, cell: Cell, source: Source, share: int, digest: str, binding_only: bool = False
    ) -> CellJob:
        group = self.cache / "cells" / cell.kernel_set_key
        backend = self.backend_for(cell)
        # an existing interpreter's build keeps its own tree: it must compile, not resume another backend's
        workdir = group / (f"{cell.binding_slug}-env" if backend.interpreter else cell.binding_slug)
        settings = self.settings(cell, share, binding_only)
        spec = make_spec(
            cell,
            source=source,
            workdir=workdir,
            objects_dir=group / "objects",
            ccache_dir=self.cache / "ccache",
            settings=settings,
            pip_args=backend.pip_args,
            interpreter=backend.interpreter,
            max_gcc=self.max_gcc(cell),
        )
        seconds = {u: round(e.s, 1) for u, e in self.estimate(cell).units.items()}
        if seconds:
            spec = spec.replace(unit_seconds=seconds)
        return CellJob(
            cell, spec, workdir, self.logs / f"{cell.id}.log", settings, digest, self.memory_limit_gb
        )

    def max_gcc(self, cell: Cell) -> int | None:
        """The newest gcc major the cell's CUDA toolkit accepts (compat `max_gcc`), for the builder's g++."""
        tk = cell.toolkit
        row = self.project.compat.cuda_toolkit(tk.version) if tk.kind == "cuda" else None
        return row.max_gcc if row else None

    # ---- running ----
    def build(self, cells: list[Cell], parallel_cells: int | None = None) -> list[CellResult]:
        """Build every cell: a kernel set's first cell compiles its kernels, the others then bind only."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.signing_key()  # a bad key is a configuration error before hours of compiling, not after
        identities: dict[int, str] = {}
        todo: list[tuple[Cell, str]] = []
        results: list[CellResult] = []
        for cell in cells:
            backend = self.backend_for(cell)
            if id(backend) not in identities:
                identities[id(backend)] = backend.identity()
            digest = input_hash(cell, identities[id(backend)])
            existing = None if self.force else up_to_date(self.output, cell, digest)
            if existing:
                self.view.stage(cell.id, "skipped")
                results.append(CellResult(cell, "skipped", existing, message="up to date (same input hash)"))
            else:
                todo.append((cell, digest))
        if not todo:
            return results
        by_backend: dict[int, tuple[Backend, list[Cell]]] = {}
        for cell, _ in todo:
            backend = self.backend_for(cell)
            by_backend.setdefault(id(backend), (backend, []))[1].append(cell)
        ahead = VenvAhead(self.logs, self.view)
        try:
            self._start_venvs_ahead(ahead, todo)
            return results + self._prepare_and_run(todo, by_backend, len(cells), parallel_cells)
        finally:
            ahead.stop()

    def _start_venvs_ahead(self, ahead: VenvAhead, todo: list[tuple[Cell, str]]) -> None:
        """Start making the torch venvs of cells whose backend can use one made on the host
        (``engine.venv_ahead``), so that pip runs while the builder images build. Each kernel source is fetched
        once here, however many cells share it."""
        sources: dict[tuple[str, str | None], Source | None] = {}
        for cell, digest in todo:
            host_venv = getattr(self.backend_for(cell), "host_venv", None)
            got = host_venv(cell) if callable(host_venv) else None
            if got is None:
                continue
            python, env = got
            key = (cell.kernel, cell.source_sha256)
            if key not in sources:
                try:
                    kernel = self.project.matrix.kernels[cell.kernel]
                    sources[key] = fetch_source(
                        cell.kernel, kernel, cell.source_sha256, self.cache, self.project.root
                    )
                except AttnforgeError:
                    sources[key] = None  # the cell's own build reports it
            source = sources[key]
            if source is not None:
                ahead.start(self.job_for(cell, source, 1, digest).spec.replace(python=python), env)

    def _prepare_and_run(
        self,
        todo: list[tuple[Cell, str]],
        by_backend: dict[int, tuple[Backend, list[Cell]]],
        n_cells: int,
        parallel_cells: int | None,
    ) -> list[CellResult]:
        """Prepare each backend (builder images), then build the cells whose backend is ready."""
        results: list[CellResult] = []
        # refusals (CK) first, then the triton venv, then the chosen backend (builder images: minutes)
        order: list[Route] = ["rocm-ck", "triton", "default"]
        refused: set[str] = set()
        for backend, members in sorted(by_backend.values(), key=lambda bm: order.index(route_of(bm[1][0]))):
            if backend is not self.backend:
                self.view.log(f"backend: {backend.name} for {len(members)} cell(s)")
            try:
                backend.prepare(members, self.view)
            except (BuildError, EnvironmentProblem) as exc:
                if len(members) == n_cells:
                    raise  # nothing else in this run: the backend's own error and exit code
                # other backends' cells still build (a CUDA machine with a release target's CK cells)
                self.view.log(f"{backend.name}: {exc}", "error")
                for cell in members:
                    self.view.stage(cell.id, "failed")
                    results.append(CellResult(cell, "failed", None, message=str(exc)))
                    refused.add(cell.id)
        groups: dict[str, list[tuple[Cell, str]]] = {}
        for cell, digest in [(c, d) for c, d in todo if c.id not in refused]:
            groups.setdefault(cell.kernel_set_key, []).append((cell, digest))
        try:
            results += self._run_groups(list(groups.values()), parallel_cells)
        except KeyboardInterrupt:
            self._stop.set()
            self._cancel_running()
            raise InterruptedByUser(
                "build interrupted: running containers stopped, no partial wheel written"
            ) from None
        return results

    def _cancel_running(self) -> None:
        with self._lock:
            running = list(self._running.values())
        for job in running:
            self.backend_for(job.cell).cancel(job)

    def _run_groups(
        self, groups: list[list[tuple[Cell, str]]], parallel_cells: int | None
    ) -> list[CellResult]:
        """Each kernel set's first cell compiles its kernels (longest sets first, `parallel_cells` sets at
        once, each with its share of the cores; auto: `schedule.choose_parallel_cells`); once its objects
        are saved, the set's other cells (other torch releases and Pythons) only compile their binding, one
        job each, as many at once as there are free cores and memory for their compiler (the binding's
        measured peak, else 2 GiB)."""
        machine = self.machine()
        cores = machine.cores
        est = {id(g): self.estimate(g[0][0]) for g in groups}
        binding_gb = max(
            (e.units[BINDING_UNIT].peak_rss_gb or 2.0 for e in est.values() if BINDING_UNIT in e.units),
            default=2.0,
        )
        reserve = self.project.matrix.build.resources.reserve_memory_gb
        binds_at_once = max(1, min(cores, int((machine.memory_available_gb - reserve) // binding_gb)))
        bind_cores = max(1, -(-cores // binds_at_once))  # a binding's share of the cores, memory included
        groups = sorted(groups, key=lambda g: est[id(g)].kernel_s, reverse=True)
        share = parallel_cells or choose_parallel_cells([est[id(g)].durations() for g in groups], cores)
        share = max(1, min(share, len(groups)))
        if len(groups) > 1 or any(len(g) > 1 for g in groups):
            self.view.log(
                f"{len(groups)} kernel set(s), {share} at once on {cores} cores; "
                f"{sum(len(g) - 1 for g in groups)} cell(s) only bind"
            )
        lead_cores = max(1, cores // share)
        queue: list[tuple[Cell, str, bool]] = [(g[0][0], g[0][1], False) for g in groups]
        followers = {g[0][0].id: [(c, d, True) for c, d in g[1:]] for g in groups}
        results: list[CellResult] = []
        running: dict[Future[CellResult], tuple[Cell, int]] = {}
        free = cores
        with ThreadPoolExecutor(max_workers=max(cores, share)) as pool:
            try:
                while queue or running:
                    while item := self._next_fitting(queue, free, lead_cores, bind_cores, bool(running)):
                        cell, digest, bind, need = item
                        free -= need
                        running[pool.submit(self._build_or_cancel, cell, digest, share, bind)] = (cell, need)
                    done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                    for fut in done:
                        cell, need = running.pop(fut)
                        free += need
                        results.append(fut.result())
                        queue += followers.pop(cell.id, [])
            except KeyboardInterrupt:
                self._stop.set()
                self._cancel_running()
                raise
        return results

    def _next_fitting(
        self, queue: list[tuple[Cell, str, bool]], free: int, lead_cores: int, bind_cores: int, busy: bool
    ) -> tuple[Cell, str, bool, int] | None:
        """Take the first queued cell that fits in `free` cores (any one when nothing runs): a follower whose
        kernel objects exist binds only (`bind_cores`), anything else compiles kernels (a lead's share)."""
        for i, (cell, digest, follower) in enumerate(queue):
            objects = self.cache / "cells" / cell.kernel_set_key / "objects" / "manifest.json"
            bind = follower and objects.is_file()
            need = bind_cores if bind else lead_cores
            if need <= free or not busy:
                del queue[i]
                return cell, digest, bind, need
        return None

    def _build_or_cancel(self, cell: Cell, digest: str, share: int, binding_only: bool) -> CellResult:
        if self._stop.is_set():
            return CellResult(cell, "cancelled")
        return self.build_one(cell, digest, share, binding_only)

    def build_one(self, cell: Cell, digest: str, share: int, binding_only: bool = False) -> CellResult:
        start = time.monotonic()
        view = self.view
        try:
            view.stage(cell.id, "fetching sources")
            spec = self.project.matrix.kernels[cell.kernel]
            source = fetch_source(cell.kernel, spec, cell.source_sha256, self.cache, self.project.root)
            job = self.job_for(cell, source, share, digest, binding_only)
            view.log(f"{cell.id}: {job.settings.line()}")
            result = self._run_with_oom_retry(job)
            wheel = self._publish_locally(job, result, time.monotonic() - start)
            view.stage(cell.id, "done")
            return CellResult(cell, "built", wheel, time.monotonic() - start, details=result)
        except (BuildError, EnvironmentProblem) as exc:
            view.stage(cell.id, "failed")
            return CellResult(cell, "failed", None, time.monotonic() - start, message=str(exc))

    def _run_with_oom_retry(self, job: CellJob) -> dict[str, Any]:
        """Run; when the OOM killer strikes, rerun in the same tree (finished objects kept) with fewer jobs."""
        cell = job.cell
        backend = self.backend_for(cell)
        oom_retries = 0
        jobs_before = job.settings.max_jobs
        with job.log_path.open("a", encoding="utf-8") as log:
            log.write(f"\n=== {dt.datetime.now(dt.timezone.utc).isoformat()} {cell.id} ({backend.name})\n")
            log.write(f"=== {job.settings.line()}\n=== {job.settings.reason}\n")
            while True:
                job.workdir.mkdir(parents=True, exist_ok=True)
                job.spec_path.write_text(job.spec.dumps())
                self.view.stage(cell.id, f"building (MAX_JOBS={job.spec.max_jobs})")
                with self._lock:
                    self._running[cell.id] = job
                code = backend.run(job, lambda line: self._on_line(job, line, log))
                with self._lock:
                    self._running.pop(cell.id, None)
                if code == 0:
                    break
                jobs_now = job.spec.max_jobs or 1
                if code in (EXIT_OOM, EXIT_CONTAINER_KILLED) and jobs_now > 1:
                    oom_retries += 1
                    new_jobs = max(1, jobs_now // 2)
                    msg = (
                        f"{cell.id}: a compiler was killed for memory (OOM) with MAX_JOBS={job.spec.max_jobs}; "
                        f"resuming with MAX_JOBS={new_jobs} (finished units are kept)"
                    )
                    self.view.log(msg, "warning")
                    log.write(f"=== {msg}\n")
                    job.settings = job.settings.adjusted(
                        "a compiler was killed for memory (OOM)", max_jobs=new_jobs
                    )
                    job.spec = job.spec.with_settings(job.settings)
                    continue
                log.flush()
                if code == EXIT_ENV:
                    raise EnvironmentProblem(self._failure_message(job, code))
                raise BuildError(self._failure_message(job, code))
        result_path = job.workdir / "out" / "result.json"
        try:
            result: dict[str, Any] = json.loads(result_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise BuildError(
                f"{cell.id}: the builder exited 0 but left no result ({result_path}: {exc})"
            ) from None
        image_of = getattr(backend, "image_of", None)
        if callable(image_of):  # the docker backend: builder image and its base
            result.update({k: v for k, v in image_of(cell).items() if v})
        result["oom_retries"] = oom_retries
        result["jobs_before"] = jobs_before
        result["jobs_after"] = job.spec.max_jobs
        return result

    def _on_line(self, job: CellJob, line: str, log: Any) -> None:
        log.write(line if line.endswith("\n") else line + "\n")
        text = line.strip()  # pip -v indents what setup.py prints (the hook's sources event)
        if text.startswith(EVENT_PREFIX):
            try:
                event = json.loads(text[len(EVENT_PREFIX) :])
            except json.JSONDecodeError:
                return
            kind, cell = event.get("event"), job.cell
            if kind == "unit":
                name = event.get("name")
                self.view.units(
                    cell.id,
                    int(event.get("done", 0)),
                    int(event.get("total", 0)),
                    str(name) if name else None,
                )
            elif kind in ("sources", "lane_plan") and not event.get("lane"):
                # the start order (the kernel lane's plan, else the setup hook's): the ETA follows the estimates
                est = job.spec.unit_seconds
                order = [(s, est.get(s, 0.0)) for s in (Path(str(x)).stem for x in event.get("compile", []))]
                if est and order:
                    self.view.plan_units(cell.id, order, job.spec.max_jobs or 1)
            elif kind == "stage":
                secs = event.get("s")
                self.view.stage(
                    cell.id,
                    str(event.get("stage", "")),
                    event.get("status"),
                    float(secs) if isinstance(secs, (int, float)) else None,
                )

    @staticmethod
    def _log_line(job: CellJob, message: str) -> None:
        with job.log_path.open("a", encoding="utf-8") as fh:
            fh.write(message + "\n")

    def _failure_message(self, job: CellJob, code: int) -> str:
        """The builder's own error (failing unit, first compiler lines) and where the full log is."""
        detail = ""
        try:
            error = json.loads((job.workdir / "out" / "result.json").read_text()).get("error") or {}
            lines = [str(error.get("message", ""))]
            if error.get("unit"):
                lines.append(f"failing unit: {error['unit']}")
            lines += [str(x) for x in (error.get("lines") or [])[:12]]
            detail = "\n".join(x for x in lines if x)
        except (OSError, json.JSONDecodeError, AttributeError):
            pass
        if not detail:
            detail = "\n".join(job.log_path.read_text(errors="replace").splitlines()[-15:])
        return f"{job.cell.id}: build failed (exit {code}); log: {job.log_path}\n{detail}"

    def _publish_locally(self, job: CellJob, result: dict[str, Any], seconds: float) -> Path:
        """Finalize the wheel (tags, torch pin, audit, manifest) and move it into the output folder atomically."""
        cell = job.cell
        built = Path(result["wheel"])
        if not built.is_absolute():
            built = job.workdir / "out" / built.name
        staging = self.output / f".staging-{cell.kernel_set_key}-{cell.binding_slug}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            self.view.stage(cell.id, "finalizing")
            manifest = build_manifest(cell, built, result, job, self.backend_for(cell).name, seconds)
            final = finalize_built(built, manifest, staging, log=lambda m: self._log_line(job, m))
            write_build_records(final.wheel, read_manifest(final.manifest), self.signing_key())
            profile_class = (
                "fa3" if cell.kernel == "flash-attn-3" else "lean" if cell.profile_spec.disable else "full"
            )
            if result.get("peak_rss_gb") and compiled_kernels(result):
                self.memory_table.record(
                    str(cell.toolkit), profile_class, float(result["peak_rss_gb"]), len(cell.arches), cell.id
                )
            self.unit_table.record(
                cell.kernel,
                cell.kernel_version,
                str(cell.toolkit),
                len(cell.arches),
                flags_of(cell.profile_spec.disable),
                result.get("unit_times") or {},
                f"{cell.id}, MAX_JOBS={job.spec.max_jobs}",
            )
            target = self.output / final.wheel.name
            # drop older wheels of the same cell, then move the pair in (wheel last: readers key on it)
            for old in self.output.glob("*.whl.manifest.json"):
                try:
                    if json.loads(old.read_text()).get("cell_id") == cell.id:
                        stale = self.output / old.name.removesuffix(".manifest.json")
                        for suffix in RECORD_SUFFIXES:
                            record_path(stale, suffix).unlink(missing_ok=True)
                        stale.unlink(missing_ok=True)
                        old.unlink()
                except (OSError, json.JSONDecodeError):
                    continue
            final.manifest.replace(manifest_path_for(target))
            for suffix in RECORD_SUFFIXES:  # the signed records and the SBOM before the wheel
                if record_path(final.wheel, suffix).is_file():
                    record_path(final.wheel, suffix).replace(record_path(target, suffix))
            final.wheel.replace(target)
            return target
        finally:
            shutil.rmtree(staging, ignore_errors=True)
