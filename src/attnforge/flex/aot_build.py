"""``attnforge flex build``: compile each variant on this machine and keep the result in portable form.

Per variant, each step in its own process with an empty Inductor/Triton cache (a crash is a recorded
failure, not a dead tool):

1. Mega-Cache: ``torch.compile(flex_attention)`` runs the variant (fwd, and bwd if declared), the output is
   checked against an fp32 reference, and ``torch.compiler.save_cache_artifacts()`` is written out.
2. Precompiled function (torch >= 2.10): ``torch.compile(...).aot_compile`` of the same call, forward and
   backward, saved with ``save_compiled_function``: loading it skips Dynamo and every cache lookup.
3. AOTInductor (static shapes): ``torch.export`` + ``aoti_compile_and_package``, then a separate process
   loads the package and runs it; a crash there (seen: SIGSEGV in ``aoti_load_package`` on torch 2.11) marks
   the package unusable, with the signal, and the loader never offers it.

The artifacts folder holds ``manifest.json`` (cache-key inputs, variants, files, sha256, timings).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge.builder.compiler import choose_host_compiler
from attnforge.builder.exits import BuildFailure
from attnforge.builder.files import sha256_file
from attnforge.flex.aoti_train import FORWARD_SUFFIX, backward_path
from attnforge.flex.package import build_wheel
from attnforge.flex.runtime import MANIFEST

WORKER = "attnforge.flex.worker"
RESULT_PREFIX = "@@flex-result "
SCHEMA = 1


@dataclass
class BuildOptions:
    """Where artifacts go and how to build them."""

    out_dir: Path
    family: str = "default"
    aoti: bool = True
    precompile: bool = True
    jobs: int = 2
    timeout_s: float = 900.0
    python: str = sys.executable
    log: Callable[[str], None] = print
    aoti_retry: bool = False  # after one variant's package crashed on load, still try the others
    aoti_probe: bool = True  # on a crash, run the minimal non-Flex AOTInductor round trip once
    cache_key_log: Path | None = None  # folder for the Mega-Cache step's cache keys (<name>.build.jsonl)


def src_root() -> Path:
    """The folder holding the ``attnforge`` package (put on PYTHONPATH of worker processes)."""
    return Path(__file__).resolve().parents[2]


def worker_env(cache_dir: Path) -> dict[str, str]:
    """A clean, private compile cache for one worker process."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src_root()), env.get("PYTHONPATH", "")) if p)
    return env


def run_worker(
    python: str, action: str, variant: dict[str, Any], args: list[str], cache_dir: Path, timeout_s: float
) -> dict[str, Any]:
    """Run one worker action in a fresh process; a crash, timeout or missing result becomes ok=False."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", WORKER, action, "--variant", json.dumps(variant), *args]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=worker_env(cache_dir), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "kind": "timeout", "error": f"{action} took more than {timeout_s:.0f} s"}
    wall = round(time.perf_counter() - t0, 3)
    result: dict[str, Any] | None = None
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
    if p.returncode < 0:
        try:
            sig = signal.Signals(-p.returncode).name
        except ValueError:
            sig = f"signal {-p.returncode}"
        last = [ln for ln in p.stdout.splitlines() if not ln.startswith(RESULT_PREFIX)][-1:]
        return {
            "ok": False,
            "kind": "crash",
            "signal": sig,
            "wall_s": wall,
            "error": f"{action} process died with {sig}" + (f" after: {last[0]}" if last else ""),
            "stderr_tail": p.stderr[-1500:],
        }
    if result is None:
        return {
            "ok": False,
            "kind": "error",
            "wall_s": wall,
            "error": f"{action} exited {p.returncode} without a result",
            "stderr_tail": p.stderr[-1500:],
        }
    result["wall_s"] = wall
    if not result.get("ok"):
        result["stderr_tail"] = p.stderr[-1500:]
    return result


def _build_one(v: dict[str, Any], art: Path, work: Path, opts: BuildOptions) -> dict[str, Any]:
    name = v["name"]
    entry: dict[str, Any] = {"name": name, "spec": v, "megacache": None, "precompiled": None, "aoti": None}
    mc_file = art / f"{name}.megacache.bin"
    args = ["--out", str(mc_file)]
    if opts.cache_key_log is not None:
        opts.cache_key_log.mkdir(parents=True, exist_ok=True)
        args += ["--cache-key-log", str(opts.cache_key_log / f"{name}.build.jsonl")]
    res = run_worker(opts.python, "megacache", v, args, work / name / "mc", opts.timeout_s)
    if res.get("ok"):
        entry["megacache"] = {
            "file": mc_file.name,
            "sha256": sha256_file(mc_file),
            "size": mc_file.stat().st_size,
            "compile_s": res.get("compile_s"),
            "max_err": res.get("max_err"),
            "artifacts": res.get("artifacts"),
        }
        entry["env"] = res.get("env")
        opts.log(
            f"flex: {name}: Mega-Cache {mc_file.stat().st_size / 1e6:.2f} MB, cold compile "
            f"{res.get('compile_s')} s, max err vs fp32 {res.get('max_err'):.3g}"
        )
    else:
        entry["error"] = _explain(v, res)
        opts.log(f"flex: {name}: FAILED: {entry['error']}")
        return entry
    entry["precompiled"] = precompile_variant(v, art, work, opts)
    return entry


def precompile_variant(v: dict[str, Any], art: Path, work: Path, opts: BuildOptions) -> dict[str, Any]:
    """The variant as a precompiled function file (``runtime.precompiled``), or why not."""
    name = v["name"]
    if not opts.precompile:
        return {"file": None, "ok": False, "reason": "not requested (--no-precompile)"}
    if v.get("mode", "default") != "default":
        return {"file": None, "ok": False, "reason": f"compile mode {v.get('mode')!r}: default mode only"}
    out = art / f"{name}.precompiled.bin"
    r = run_worker(opts.python, "precompile", v, ["--out", str(out)], work / name / "pre", opts.timeout_s)
    if not r.get("ok") or not out.is_file():
        out.unlink(missing_ok=True)
        opts.log(f"flex: {name}: no precompiled function: {r.get('error')}")
        return {"file": None, "ok": False, "reason": str(r.get("error")), "run": _slim(r)}
    opts.log(
        f"flex: {name}: precompiled function {out.stat().st_size / 1e6:.2f} MB "
        f"(max err vs fp32 {r.get('max_err'):.3g})"
    )
    return {
        "file": out.name,
        "ok": True,
        "sha256": sha256_file(out),
        "size": out.stat().st_size,
        "compile_s": r.get("compile_s"),
        "max_err": r.get("max_err"),
    }


class _LogLines:
    def __init__(self, log: Callable[[str], None]) -> None:
        self.line = log


def aoti_compiler(opts: BuildOptions, work: Path) -> dict[str, Any]:
    """Pick the C++ compiler Inductor builds AOTInductor packages with (``CXX``/``CC`` of the workers),
    with the flash-attn builder's probe: a compiler whose code turns C++ exceptions thrown through torch
    into crashes also makes ``aoti_load_package`` crash (seen on the H100 machine with its /opt/gcc
    wrapper). Sets ``CXX``/``CC`` in this process's environment, which the workers inherit."""
    try:
        got = choose_host_compiler(opts.python, work, dict(os.environ), _LogLines(opts.log))  # type: ignore[arg-type]
    except BuildFailure as exc:
        opts.log(f"flex: warning: {exc.message}; AOTInductor packages will likely crash")
        return {"cxx": None, "error": exc.message}
    if got.get("switched"):
        os.environ["CXX"] = got["cxx"]
        if got.get("cc"):
            os.environ["CC"] = got["cc"]
    return got


def _aoti_all(entries: list[dict[str, Any]], art: Path, work: Path, opts: BuildOptions) -> dict[str, Any]:
    """AOTInductor packages, one variant at a time; after a crash on load the rest are skipped (they share
    the cause; a crash costs a minute) unless ``opts.aoti_retry``. Returns the compiler choice."""
    compiler: dict[str, Any] = {}
    if opts.aoti and any(e.get("megacache") and not e["spec"].get("dynamic") for e in entries):
        compiler = aoti_compiler(opts, work)
    crash: dict[str, Any] | None = None
    for e in entries:
        v = e["spec"]
        if not e.get("megacache"):
            continue
        if not opts.aoti:
            e["aoti"] = {"file": None, "ok": False, "reason": "not requested (--no-aoti)"}
        elif v.get("dynamic"):
            e["aoti"] = {"file": None, "ok": False, "reason": "dynamic variants are Mega-Cache only"}
        elif crash is not None and not opts.aoti_retry:
            e["aoti"] = {
                "file": None,
                "ok": False,
                "kind": "skipped",
                "reason": f"not tried: the package of {crash['name']} crashed ({crash['reason']}); "
                "--aoti-retry tries each variant",
            }
        else:
            e["aoti"] = _aoti(v, art, work, opts)
            if e["aoti"].get("kind") == "crash":
                crash = {"name": e["name"], "reason": e["aoti"]["reason"]}
    return compiler


def _aoti(v: dict[str, Any], art: Path, work: Path, opts: BuildOptions) -> dict[str, Any]:
    """The variant's AOTInductor package: ``<name>.pt2``, or for a fwd+bwd variant ``<name>.fwd.pt2`` and
    ``<name>.bwd.pt2`` (aoti_train), built, then loaded and checked in a separate process."""
    name = v["name"]
    pt2 = art / (f"{name}{FORWARD_SUFFIX}" if v.get("backward") else f"{name}.pt2")
    bwd = backward_path(pt2) if v.get("backward") else None
    b = run_worker(opts.python, "aoti-build", v, ["--out", str(pt2)], work / name / "aoti", opts.timeout_s)
    if not b.get("ok") or not pt2.is_file() or (bwd is not None and not bwd.is_file()):
        opts.log(f"flex: {name}: AOTInductor build failed: {b.get('error')}")
        for f in (pt2, bwd):
            if f is not None:
                f.unlink(missing_ok=True)
        return {"file": None, "ok": False, "reason": f"build: {b.get('error')}", "build": _slim(b)}
    r = run_worker(
        opts.python, "aoti-run", v, ["--package", str(pt2)], work / name / "aoti-run", opts.timeout_s
    )
    info: dict[str, Any] = {"build_s": b.get("build_s"), "size": pt2.stat().st_size}
    if bwd is not None:
        info |= {
            "backward_file": bwd.name,
            "backward_sha256": sha256_file(bwd),
            "backward_size": bwd.stat().st_size,
        }
    if r.get("ok"):
        grads = f", gradients vs eager {r['grad_max_err']:.3g}" if "grad_max_err" in r else ""
        opts.log(
            f"flex: {name}: AOTInductor package{'s (fwd+bwd)' if bwd else ''} "
            f"{pt2.stat().st_size / 1e6:.2f} MB, built in {b.get('build_s')} s, loads and runs "
            f"(max err {r.get('max_err'):.3g}{grads})"
        )
        return {
            "file": pt2.name,
            "ok": True,
            "sha256": sha256_file(pt2),
            "reason": "",
            **info,
            "load_s": r.get("load_s"),
            "max_err": r.get("max_err"),
            **({"grad_max_err": r["grad_max_err"]} if "grad_max_err" in r else {}),
        }
    opts.log(f"flex: {name}: AOTInductor package built but unusable: {r.get('error')}")
    kept = art / f"{pt2.name}.broken"
    pt2.replace(kept)
    if bwd is not None:
        bwd.replace(art / f"{bwd.name}.broken")
    return {
        "file": None,
        "ok": False,
        "reason": f"load/run: {r.get('error')}",
        "kind": r.get("kind"),
        "signal": r.get("signal"),
        "broken_file": kept.name,
        **info,
        "run": _slim(r),
    }


def _slim(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in ("kind", "error", "signal", "wall_s", "stderr_tail") if k in r}


def _explain(v: dict[str, Any], res: dict[str, Any]) -> str:
    kind = res.get("kind")
    if kind == "untraceable":
        return (
            f"torch.compile could not trace mask {v.get('mask')!r} / score_mod {v.get('score_mod')!r}: "
            f"{res.get('error')}"
        )
    if kind == "crash":
        return f"the compiler process crashed ({res.get('signal')})"
    return str(res.get("error"))


def build_variants(variants: list[dict[str, Any]], opts: BuildOptions) -> dict[str, Any]:
    """Build every variant into ``opts.out_dir/artifacts`` and write its manifest; returns the manifest."""
    art = opts.out_dir / "artifacts"
    if art.exists():
        shutil.rmtree(art)
    art.mkdir(parents=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnforge-flex-") as tmp:
        work = Path(tmp)
        with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
            entries = list(pool.map(lambda v: _build_one(v, art, work, opts), variants))
        compiler = _aoti_all(entries, art, work, opts)
    envs = [e.pop("env") for e in entries if e.get("env")]
    crashed = [e for e in entries if (e.get("aoti") or {}).get("kind") == "crash"]
    probe = None
    if crashed and opts.aoti_probe:
        # minimal reproduction: is AOTInductor broken here in general, or only for FlexAttention?
        with tempfile.TemporaryDirectory(prefix="attnforge-aoti-probe-") as tmp:
            v0 = crashed[0]["spec"]
            probe = run_worker(
                opts.python,
                "aoti-probe",
                v0,
                ["--out", str(Path(tmp) / "probe.pt2")],
                Path(tmp) / "cache",
                opts.timeout_s,
            )
        verdict = "works" if probe.get("ok") else f"fails too ({probe.get('error')})"
        opts.log(
            f"flex: AOTInductor crashed for {len(crashed)} Flex variant(s); a plain Linear+GELU package {verdict}"
        )
    manifest = {
        "schema": SCHEMA,
        "family": opts.family,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "env": envs[0] if envs else {},
        "build_s": round(time.perf_counter() - t0, 1),
        "aoti_probe": probe,
        "aoti_compiler": compiler or None,
        "variants": entries,
    }
    (art / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def failed(manifest: dict[str, Any]) -> list[str]:
    """Variants without a Mega-Cache artifact."""
    return [e["name"] for e in manifest["variants"] if not e.get("megacache")]


def build_and_package(
    variants: list[dict[str, Any]], opts: BuildOptions, wheel_dir: Path | None
) -> tuple[dict[str, Any], Path | None]:
    """Build the variants, then (if any built and ``wheel_dir`` is given) the attnforge-flex-kernels wheel."""
    manifest = build_variants(variants, opts)
    wheel = None
    if wheel_dir is not None and len(failed(manifest)) < len(manifest["variants"]):
        wheel = build_wheel(opts.out_dir / "artifacts", wheel_dir, python=opts.python)
        opts.log(f"flex: wheel {wheel}")
    return manifest, wheel
