"""The build of one cell, step by step, and ``result.json`` (the builder's answer to the host).

Steps: source (fetch, verify) -> unpack (+ patches) -> venv (or the interpreter as it is) -> compiler
probe -> ``pip wheel --no-build-isolation`` with the kernel's knobs, followed through ninja -> kernel objects
saved for the kernel set -> the wheel copied to ``output_dir`` -> import check. ``result.json`` carries the
wheel, timings, peak memory (whole build and per unit), each unit's compile time, the toolchain and the
error (``message``, ``kind``, failing ``unit`` and its first ``lines``). Exit codes: ``exits``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .compiler import (
    FALLBACK_CXX,
    VERDICTS_FILE,
    choose_host_compiler,
    forget_verdicts,
    gcc_for_toolkit,
    nvcc_problem,
    toolchain,
)
from .cross import is_cross
from .exits import (
    EXIT_BUILD,
    EXIT_ENV,
    EXIT_IMPORT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OOM,
    BuildFailure,
)
from .files import sha256_file
from .glibc_floor import prepare as prepare_glibc_floor
from .importcheck import import_check, pure_wheel_check, require_stable_abi_wheel
from .kernel_lane import KernelLane
from .knobs import build_env, ccache_stats, cuda_home
from .ninja import NinjaParser, UnitCounter, count_ninja_units, unit_times
from .objects import identity, save_kernel_objects, usable_prebuilt
from .parallelism import BINDING_JOB_GB, builder_settings, detect_machine
from .patches import resolve_patches, torch_free
from .procs import cgroup_oom_kills, stream, terminate_children
from .report import Reporter, Stage
from .source import archive_epoch, fetch_source, prepare_tree
from .spec import BuildSpec
from .torchenv import ensure_venv, variant_mismatch
from .vendored import cutlass_facts

RUSAGE_WRAP = Path(__file__).resolve().parent / "rusage_wrap.py"
RESULT_KEYS = (
    "ok",
    "exit_code",
    "wheel",
    "wall_s",
    "peak_rss_gb",
    "units_total",
    "units_compiled",
    "units_reused",
)


def compile_wheel(
    spec: BuildSpec,
    rep: Reporter,
    result: dict[str, Any],
    vpy: str,
    tree: Path,
    env: dict[str, str],
    py_tag: str,
    max_jobs: int,
    counter: UnitCounter | None = None,
) -> tuple[Path, NinjaParser]:
    """``pip wheel`` under the rusage wrapper, followed through ninja; the wheel in build_dir/dist."""
    dist = Path(spec.build_dir) / "dist"
    if dist.exists():
        shutil.rmtree(dist)
    dist.mkdir(parents=True)
    rusage_out = Path(spec.build_dir) / f"rusage-{os.getpid()}.json"
    # --use-pep517: the legacy path runs `setup.py clean --all` after a failure, so no resume
    pip_cmd = [
        vpy,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--use-pep517",
        "--no-deps",
        "-v",
        "-w",
        str(dist),
        str(tree),
    ]
    if spec.pure_python:
        pip_cmd[5:5] = ["--no-index"]
    cmd = [sys.executable, str(RUSAGE_WRAP), str(rusage_out), "--", *pip_cmd]
    parser = NinjaParser(rep, counter)
    rep.line("attnforge: " + " ".join(pip_cmd) + f"  (MAX_JOBS={max_jobs})")
    oom_before = cgroup_oom_kills()
    cc_before = ccache_stats(env)
    with Stage(rep, result["stages"], "compile"):
        rc, rss = stream(cmd, env, rep, cwd=str(tree), on_line=parser, sampler=True)
    cc_after = ccache_stats(env)
    if cc_after:
        result["ccache"] = {k: cc_after[k] - cc_before.get(k, 0) for k in cc_after}
    maxrss_kb = 0
    with contextlib.suppress(OSError, ValueError):
        maxrss_kb = int(json.loads(rusage_out.read_text())["maxrss_kb"])
        rusage_out.unlink()
    result["peak_rss_gb"] = round(max(maxrss_kb * 1024, rss["single"]) / 1024**3, 2)
    result["peak_tree_rss_gb"] = round(rss["tree"] / 1024**3, 2)
    times = unit_times(tree, py_tag)
    peaks = rss.get("units", {})
    result["unit_times"] = {
        u: {**t, "peak_rss_gb": round(peaks.get(u, 0) / 1024**3, 2)} for u, t in times.items()
    }
    ev = parser.sources_event or {}
    total = parser.units_total if parser.units_total is not None else count_ninja_units(tree, py_tag)
    if total is None and spec.pure_python:
        total = 0  # nothing to compile: no ninja file to count
    compiled_now = len(parser.finished)
    result.update(
        units_total=total,
        units_compiled=compiled_now,
        units_prebuilt=len(ev.get("prebuilt", [])),
        units_reused=(total - compiled_now) if total is not None and rc == 0 else None,
    )
    if rc != 0:
        raise_failure(parser, rc, max_jobs, cgroup_oom_kills() > oom_before, rep)
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildFailure(EXIT_BUILD, f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    return wheels[0], parser


def raise_failure(parser: NinjaParser, rc: int, max_jobs: int, oom_killed: bool, rep: Reporter) -> None:
    """Turn a failed pip run into the right BuildFailure: OOM (resumable), compile error, or other."""
    kind, details = parser.failure_summary(oom_killed=oom_killed)
    if kind == "oom" or (kind == "other" and rc in (137, -9)):
        rep.event("error", kind="oom", **details)
        raise BuildFailure(
            EXIT_OOM,
            f"a compiler was killed (likely out of memory) in unit {details.get('unit')}; "
            f"rerun with fewer max_jobs (now {max_jobs}) in the same build_dir",
            kind="oom",
            **details,
        )
    if kind == "compile":
        rep.line(f"attnforge: compile error in unit {details['unit']}:")
        for ln in details["lines"]:
            rep.line("    " + ln)
        rep.event("error", kind="compile", **details)
        raise BuildFailure(EXIT_BUILD, f"compile error in unit {details['unit']}", kind="compile", **details)
    rep.event("error", kind="build", rc=rc, **details)
    raise BuildFailure(EXIT_BUILD, f"build failed (pip exit {rc})", kind="build", rc=rc, **details)


def start_kernel_lane(
    spec: BuildSpec,
    tree: Path,
    env: dict[str, str],
    home: str | None,
    counter: UnitCounter,
    rep: Reporter,
    jobs: int,
) -> KernelLane | None:
    """The kernel lane, started, when this build compiles torch-free flash-attn kernel units that no earlier
    cell of the kernel set left behind; else None (ninja compiles everything once torch is there)."""
    if spec.kernel != "flash-attn" or spec.pure_python or not home or not torch_free(spec.patches):
        return None
    if spec.use_interpreter or is_cross(spec):
        return None  # torch is already there: nothing to overlap with; a cross build links the target's torch
    if usable_prebuilt(spec, identity(spec, toolchain(home, {}, env.get("CXX"))), rep) is not None:
        return None
    lane_env = build_env(spec, None, tree, spec.source_date_epoch or 0, jobs, None, base=env)
    lane = KernelLane(spec, tree, lane_env, home, jobs, rep, counter.finish, rep.t0)
    order = lane.start()
    if not order:
        return None
    counter.total = len(order) + len(lane.binding)
    rep.event("lane_plan", compile=order + lane.binding, jobs=jobs)  # the host's ETA plans both lanes
    return lane


def build(spec: BuildSpec, rep: Reporter, result: dict[str, Any]) -> None:
    """The whole cell; fills ``result`` as it goes and raises BuildFailure on errors."""
    times: dict[str, float] = result["stages"]
    out_dir = Path(spec.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with Stage(rep, times, "source"):
        archive = fetch_source(spec, rep)
    patches = resolve_patches(spec)
    result["patches_applied"] = patches
    with Stage(rep, times, "unpack"):
        tree = prepare_tree(spec, archive, patches, rep)
        cutlass = cutlass_facts(tree, Path(spec.build_dir) / "src")
        if cutlass is not None:  # for the SBOM: CUTLASS as the source vendors it
            result["vendored"] = {"cutlass": cutlass}
    base_env = dict(os.environ)
    home = cuda_home(base_env)
    toolkit_cxx = None if spec.pure_python else gcc_for_toolkit(spec.max_gcc, base_env, rep)
    if toolkit_cxx:
        base_env["CXX"], base_env["CC"] = toolkit_cxx["cxx"], toolkit_cxx["cc"]
    settings = builder_settings(
        spec.settings, spec.max_jobs, spec.nvcc_threads, spec.job_mem_gb, pure_python=spec.pure_python
    )
    if settings is spec.settings:  # resolved on the host, which printed where each value came from
        rep.line(
            f"attnforge: the host's settings: MAX_JOBS={settings.max_jobs} NVCC_THREADS={settings.nvcc_threads}"
        )
    else:
        rep.line("attnforge: " + settings.line())
    result["settings"] = settings.to_json()
    counter = UnitCounter(rep)
    lane = start_kernel_lane(spec, tree, base_env, home, counter, rep, settings.max_jobs)
    try:
        vpy = compile_cell(
            spec, rep, result, archive, tree, base_env, home, toolkit_cxx, counter, lane, settings.max_jobs
        )
    finally:
        if lane is not None:
            lane.stop()
    finish_wheel(spec, rep, result, vpy, Path(result["wheel"]))


def compile_cell(
    spec: BuildSpec,
    rep: Reporter,
    result: dict[str, Any],
    archive: Path,
    tree: Path,
    base_env: dict[str, str],
    home: str | None,
    toolkit_cxx: dict[str, Any] | None,
    counter: UnitCounter,
    lane: KernelLane | None,
    max_jobs: int,
) -> str:
    """venv, compiler probe and ``pip wheel`` (the binding lane, beside a running kernel lane); the wheel
    copied to output_dir and the kernel objects saved. Returns the build's Python."""
    times: dict[str, float] = result["stages"]
    with Stage(rep, times, "venv"):
        venv = ensure_venv(spec, rep, base_env)
    vpy = venv["vpy"]
    problem = variant_mismatch(spec.torch_variant or "", venv)
    if problem:
        raise BuildFailure(EXIT_ENV, problem)
    result["venv_reused"] = venv["reused"]
    result["torch_build"] = venv["torch"]
    host_cxx: dict[str, Any] = {}
    if spec.cxx_probe and not spec.pure_python:
        with Stage(rep, times, "compiler"):
            fallbacks = () if toolkit_cxx else FALLBACK_CXX  # the fallbacks are the too-new default g++
            verdicts = Path(spec.venv_dir).parent / VERDICTS_FILE
            host_cxx = choose_host_compiler(
                vpy, Path(spec.venv_dir), base_env, rep, fallbacks, str(venv.get("torch")), verdicts
            )
    host_cxx = host_cxx or dict(toolkit_cxx or {})
    if toolkit_cxx:
        host_cxx["toolkit_limit"] = toolkit_cxx["reason"]
    tool = toolchain(home, venv, host_cxx.get("cxx"))
    result["toolchain"] = tool
    result["host_compiler"] = host_cxx
    problem = None if spec.pure_python else nvcc_problem(venv, tool, home)
    if problem:
        raise BuildFailure(EXIT_ENV, problem)
    py_tag = "cpython-" + "".join(str(venv["python"]).split(".")[:2])
    ident = identity(spec, tool)
    # a running kernel lane means the objects were already found unusable (the identity has no torch there)
    prebuilt = None if lane is not None else usable_prebuilt(spec, ident, rep)
    result["kernel_objects"] = {
        "dir": spec.kernel_objects_dir,
        "reused": prebuilt is not None,
        "saved": False,
    }
    result["max_jobs"] = max_jobs
    result["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    result["nvcc_threads"] = spec.nvcc_threads
    epoch = spec.source_date_epoch or archive_epoch(archive)
    env = build_env(spec, vpy, tree, epoch, max_jobs, prebuilt, auto_wrap=bool(venv.get("auto_wrap")))
    if host_cxx.get("switched") or (host_cxx.get("cxx") and "CXX" in base_env):
        env["CXX"] = host_cxx["cxx"]
        if host_cxx.get("cc"):
            env["CC"] = host_cxx["cc"]  # torch passes CC to nvcc as -ccbin
    if toolkit_cxx:  # the probe had no fallback: host_cxx is this compiler
        env["CXX"], env["CC"] = toolkit_cxx["cxx"], toolkit_cxx["cc"]
    if lane is not None:
        env["ATTNFORGE_KERNEL_LANE"] = str(lane.dir)
        if not binding_fits_beside(rep):
            result["kernel_lane"] = lane.wait()
    if not spec.pure_python:  # the extension stays inside torch's glibc floor (builder/glibc_floor.py)
        result["glibc_floor"] = prepare_glibc_floor(spec, env, venv.get("site"))
    ninja_counter = counter if lane is not None else None  # alone, ninja's [N/M] is the count
    built, parser = compile_wheel(spec, rep, result, vpy, tree, env, py_tag, max_jobs, ninja_counter)
    if lane is not None:
        result["kernel_lane"] = merge_lane(result, lane.wait(), parser, rep.windows["compile"][0])
    if prebuilt is None:
        compiled = list((parser.sources_event or {}).get("compile", []))
        built_with = {**tool, "host_compiler": host_cxx.get("cxx")}
        result["kernel_objects"]["saved"] = save_kernel_objects(
            spec, tree, compiled, ident, py_tag, rep, built_with
        )
    final = Path(spec.output_dir) / built.name
    shutil.copyfile(built, final)
    result.update(
        wheel=str(final), wheel_name=final.name, size=final.stat().st_size, sha256=sha256_file(final)
    )
    return str(vpy)


def binding_fits_beside(rep: Reporter) -> bool:
    """Whether the binding may compile while the kernel lane still runs: the memory its compilers leave free
    holds the binding's job (cores are shared; memory is what kills a build)."""
    free = detect_machine().memory_available_gb
    if free >= BINDING_JOB_GB:
        return True
    rep.line(f"attnforge: {free:.1f} GiB free beside the kernel lane: the binding waits for it")
    return False


def merge_lane(
    result: dict[str, Any], lane: dict[str, Any], parser: NinjaParser, compile_start: float
) -> dict[str, Any]:
    """Fold the kernel lane into the result: its units' times (from the build's start) and peaks, the
    compiled count, the peak memory; what the setup hook linked from it."""
    linked = set((parser.lane_event or {}).get("linked", []))
    units = result.setdefault("unit_times", {})
    for t in units.values():  # ninja's times count from its own start
        if "start_s" in t:
            t["start_s"] = round(t["start_s"] + compile_start, 1)
            t["end_s"] = round(t["end_s"] + compile_start, 1)
    used = 0
    for name, unit in lane.get("units", {}).items():
        if name + ".cu" in linked and unit.get("ok") and not unit.get("reused"):
            used += 1
            units[name] = {
                "start_s": unit["start_s"],
                "end_s": unit["end_s"],
                "s": round(unit["end_s"] - unit["start_s"], 1),
                "peak_rss_gb": unit.get("peak_rss_gb", 0.0),
                "lane": "kernel",
            }
    if result.get("units_compiled") is not None:
        result["units_compiled"] += used
        if result.get("units_total") is not None:
            result["units_reused"] = result["units_total"] - result["units_compiled"]
    result["peak_rss_gb"] = max(float(result.get("peak_rss_gb") or 0.0), lane.get("peak_single_gb", 0.0))
    return {**lane, "linked": sorted(linked), "mismatch": (parser.lane_event or {}).get("mismatch", "")}


def finish_wheel(spec: BuildSpec, rep: Reporter, result: dict[str, Any], vpy: str, final: Path) -> None:
    """The checks on the copied wheel: stable ABI, pure-Python contents, the import check."""
    times: dict[str, float] = result["stages"]
    check_stable_abi(spec, final, rep, result)
    if spec.pure_python:
        chk = pure_wheel_check(final)
        result["wheel_check"] = chk
        if not chk["ok"]:
            raise BuildFailure(
                EXIT_BUILD, f"{final.name}: not a Triton-backend wheel: " + "; ".join(chk["problems"])
            )
    elif spec.import_check:
        names = list(spec.import_names or [])
        with Stage(rep, times, "import_check"):
            chk = import_check(vpy, final, names, Path(spec.build_dir), rep)
        result["import_check"] = chk
        if chk.get("exceptions") == "crashed" and result.get("host_compiler", {}).get("cached"):
            forget_verdicts(Path(result["host_compiler"]["verdicts"]))
            raise BuildFailure(
                EXIT_IMPORT,
                "a torch error thrown in the binding crashed the process although the cached compiler verdict "
                "said exceptions cross; the verdicts were dropped: rerun to probe the compiler again",
                kind="import",
            )
        if not chk["ok"]:
            raise BuildFailure(
                EXIT_IMPORT, "the built extension does not import: " + chk["output"][-500:], kind="import"
            )


def check_stable_abi(spec: BuildSpec, wheel: Path, rep: Reporter, result: dict[str, Any]) -> None:
    """A stable-ABI wheel (``spec.stable_abi``): none of its compiled extensions imports a torch C++ symbol
    (at::, c10::, torch::, caffe2::), or the build fails with EXIT_ABI naming the first one. Needs no torch
    and no GPU (``nm``), so it runs before the import check and also where that one is off. Its time is in
    ``stages["abi_check"]`` (no stage events: the host's progress view knows the builder's stages by name)."""
    if not spec.stable_abi or spec.pure_python:
        return
    start = time.monotonic()
    try:
        result["stable_abi_check"] = require_stable_abi_wheel(wheel, Path(spec.build_dir), rep)
    finally:
        result["stages"]["abi_check"] = round(time.monotonic() - start, 1)


def main(argv: list[str] | None = None) -> int:
    """``--spec SPEC.json``: build, write ``output_dir/result.json``, return the exit code."""
    ap = argparse.ArgumentParser(
        prog="attnforge.builder", description="Build one attnforge cell's wheel (stdlib only)."
    )
    ap.add_argument("--spec", required=True, type=Path, help="the cell's spec (JSON, attnforge.builder.spec)")
    args = ap.parse_args(argv)
    start = time.monotonic()
    result: dict[str, Any] = {
        "schema": 2,
        "ok": False,
        "exit_code": None,
        "stages": {},
        "wheel": None,
        "error": None,
    }
    rep = Reporter(None)
    spec: BuildSpec | None = None
    signal.signal(signal.SIGTERM, terminate_children)
    code = EXIT_OK
    try:
        spec = BuildSpec.load(args.spec)
        result["cell_id"] = spec.cell_id
        rep = Reporter(Path(spec.output_dir) / "build.log")
        rep.line(f"attnforge: building {spec.cell_id} in {spec.build_dir}")
        build(spec, rep, result)
        result["ok"] = True
    except BuildFailure as exc:
        code = exc.code
        result["error"] = {"message": exc.message, **exc.details}
        rep.line(f"attnforge: error: {exc.message}")
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
        result["error"] = {"message": "interrupted", "kind": "interrupted"}
    except Exception as exc:  # a bug or an unexpected OS error: still leave a result.json behind
        import traceback

        code = EXIT_INTERNAL
        result["error"] = {"message": f"internal error: {exc!r}", "kind": "internal"}
        for ln in traceback.format_exc().splitlines():
            rep.line(ln)
    result["exit_code"] = code
    result["wall_s"] = round(time.monotonic() - start, 1)
    result["stage_windows"] = rep.windows
    if spec is not None:
        with contextlib.suppress(OSError):
            (Path(spec.output_dir) / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    rep.event("result", **{k: result.get(k) for k in RESULT_KEYS})
    rep.close()
    return code
