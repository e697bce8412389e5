"""The host C++ compiler of a torch extension build, and the toolchain's versions.

A C++ exception thrown by torch (TORCH_CHECK in libc10) must unwind through code this compiler built and
reach Python as RuntimeError: that is how a flash-attn wheel reports a head dim or dtype it was built
without. Seen on an H100 host: a gcc wrapper in /opt/gcc (named by CC/CXX) that links its own crt files
made every such exception a SIGSEGV, and AOTInductor packages crashed on load the same way. So the
compiler is probed (``CXX_PROBE``) before it builds the binding, and a failing one is replaced by a fallback.
The verdict is cached beside the build venvs (``VERDICTS_FILE``), keyed on what decides it: the compiler
(its real path and version), its C++ runtime and torch; so one builder image or host toolchain is probed
once per torch, not once per venv. The import check re-checks a cached verdict on the built binding
(``importcheck.EXCEPTION_RECHECK``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .exits import EXIT_ENV, BuildFailure
from .report import Reporter
from .torchenv import run_capture

# The probe unit: a TORCH_CHECK thrown inside libc10 unwinds through this compiler's frames to pybind11's
# handler, as a flash-attn binding's head-dim check does. It includes pybind11 and c10's Exception.h only,
# not torch/extension.h (all of ATen): a few CPU-seconds of compile instead of about a minute, on the
# critical path of a first build.
CXX_PROBE_SOURCE = r"""
#include <pybind11/pybind11.h>
#include <c10/util/Exception.h>
namespace probe { inline void bad(int d) { TORCH_CHECK(false, "attnforge probe: excluded head dim ", d); } }
int64_t dispatch(int64_t d) {
  return [&] {
    if (d <= 32) { if constexpr (false) { return int64_t(1); } else { probe::bad(int(d)); } }
    return int64_t(2);
  }();
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("dispatch", &dispatch); }
"""
# Builds CXX_PROBE_SOURCE (argv[2]) with torch's own extension flags and libraries, in argv[1].
CXX_PROBE = r"""
import sys
from torch.utils.cpp_extension import load
m = load("attnforge_cxx_probe", sources=[sys.argv[2]], build_directory=sys.argv[1])
assert m.dispatch(64) == 2
try:
    m.dispatch(16)
except RuntimeError as exc:
    print("RAISED", str(exc).splitlines()[0], flush=True)
"""
VERDICTS_FILE = "compiler-verdicts.json"
FALLBACK_CXX = ("/usr/bin/g++", "/usr/bin/c++")


def c_compiler_for(cxx: str) -> str | None:
    """The C compiler beside a C++ one (``.../g++`` -> ``.../gcc``, ``c++`` -> ``cc``), when it exists."""
    head, name = os.path.split(cxx)
    m = re.fullmatch(r"(.*?)(clang\+\+|g\+\+|c\+\+)(-[0-9.]+)?", name)  # g++-13 -> gcc-13
    if not m:
        return None
    plain = {"clang++": "clang", "g++": "gcc", "c++": "cc"}[m.group(2)]
    cand = os.path.join(head, m.group(1) + plain + (m.group(3) or ""))
    return cand if shutil.which(cand) else None


def compiler_identity(cxx: str) -> str | None:
    """``realpath | first line of --version``; None when ``cxx`` does not run."""
    exe = shutil.which(cxx.split()[-1])
    if not exe:
        return None
    try:
        first = run_capture([exe, "--version"], timeout=60).splitlines()[0]
    except (RuntimeError, OSError, IndexError, subprocess.TimeoutExpired):
        return None
    return f"{os.path.realpath(exe)} | {first}"


def runtime_identity(cxx: str) -> str:
    """The real path of the C++ runtime ``cxx`` links (``-print-file-name=libstdc++.so.6``), or ``?``."""
    exe = shutil.which(cxx.split()[-1])
    if not exe:
        return "?"
    try:
        found = run_capture([exe, "-print-file-name=libstdc++.so.6"], timeout=60).strip()
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return "?"
    return os.path.realpath(found) if os.path.isabs(found) else found


def verdict_key(ident: str, cxx: str, torch_version: str | None) -> str:
    """What decides whether exceptions cross: the compiler, its C++ runtime, torch."""
    return f"{ident} | {runtime_identity(cxx)} | torch {torch_version}"


def forget_verdicts(cache_path: Path) -> None:
    """Drop the cached verdicts (the import check found one wrong): the next build probes again."""
    with contextlib.suppress(OSError):
        cache_path.unlink()


def probe_cxx(vpy: str, cxx: str, env: dict[str, str], work: Path) -> str:
    """'' when an exception thrown through torch from code ``cxx`` built reaches Python, else why not."""
    penv = dict(env, CXX=cxx, TORCH_NO_COMPILER_WRAPPER="1")
    penv["PATH"] = os.pathsep.join([str(Path(vpy).parent), env.get("PATH", "/usr/bin:/bin")])  # ninja
    cc = c_compiler_for(cxx.split()[-1])
    if cc:
        penv["CC"] = cc
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cxx-probe-", dir=work) as tmp:
        source = Path(tmp) / "attnforge_cxx_probe.cpp"
        source.write_text(CXX_PROBE_SOURCE, encoding="utf-8")
        try:
            proc = subprocess.run(
                [vpy, "-X", "faulthandler", "-c", CXX_PROBE, tmp, str(source)],
                env=penv,
                capture_output=True,
                text=True,
                timeout=900,
            )
        except subprocess.TimeoutExpired:
            return "the probe extension hung for 15 min"
    if proc.returncode == 0 and "RAISED" in proc.stdout:
        return ""
    if proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        return f"a C++ exception thrown through torch killed the process with {sig}"
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip() and len(ln) < 300]
    tail = " | ".join(lines[-2:])
    return f"the probe extension did not build or raise (exit {proc.returncode}): {tail}"


def choose_host_compiler(
    vpy: str,
    venv_dir: Path,
    env: dict[str, str],
    rep: Reporter,
    fallbacks: tuple[str, ...] = FALLBACK_CXX,
    torch_version: str | None = None,
    cache_path: Path | None = None,
) -> dict[str, Any]:
    """The C++ compiler for torch's extension build: ``$CXX`` (else ``c++``) when it passes ``CXX_PROBE``,
    else the first fallback that does (with a warning). Verdicts are cached in ``cache_path`` (default:
    ``venv_dir/VERDICTS_FILE``; the builder keeps one beside all its venvs) under ``verdict_key``;
    ``cached`` in the answer says whether the chosen one's came from there.
    Raises BuildFailure(EXIT_ENV) when none passes."""
    first = env.get("CXX") or "c++"
    cache_path = cache_path or venv_dir / VERDICTS_FILE
    try:
        cache: dict[str, str] = json.loads(cache_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    tried: list[tuple[str, str]] = []
    seen: set[str] = set()
    cached = False
    for cxx in (first, *fallbacks):
        ident = compiler_identity(cxx)
        if ident is None or ident.split(" | ")[0] in seen:
            continue
        seen.add(ident.split(" | ")[0])
        key = verdict_key(ident, cxx, torch_version)
        why = cache.get(key)
        cached = why is not None
        if why is None:
            rep.line(f"attnforge: checking that C++ exceptions from {cxx}-built code reach Python")
            why = probe_cxx(vpy, cxx, env, venv_dir)
            cache[key] = why
            with contextlib.suppress(OSError):
                tmp = cache_path.with_name(f"{cache_path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(cache, indent=1), encoding="utf-8")
                os.replace(tmp, cache_path)
        else:
            rep.line(
                f"attnforge: {cxx}: cached verdict ({why or 'exceptions reach Python'}) from {cache_path}"
            )
        tried.append((cxx, why))
        if not why:
            if cxx != first:
                rep.line(f"attnforge: warning: {first}: {tried[0][1]}; building with {cxx} instead")
            return {
                "cxx": cxx,
                "cc": c_compiler_for(cxx.split()[-1]),
                "switched": cxx != first,
                "rejected": {c: w for c, w in tried if w},
                "cached": cached,
                "verdicts": str(cache_path),
            }
    detail = "; ".join(f"{c}: {w}" for c, w in tried) or f"{first} does not run"
    raise BuildFailure(EXIT_ENV, f"no usable host C++ compiler ({detail}); set CXX/CC to a working g++")


def gcc_for_toolkit(max_gcc: int | None, env: dict[str, str], rep: Reporter) -> dict[str, Any] | None:
    """A g++ the CUDA toolkit accepts (its crt/host_config.h rejects gcc majors above ``max_gcc``).

    None when there is no limit, or ``$CXX`` (else ``c++``) is not GNU or is new enough. Otherwise the newest
    ``g++-N`` on PATH with N <= ``max_gcc``, as ``{"cxx", "cc", "reason"}`` (the caller sets CXX and CC; torch
    hands CC to nvcc as -ccbin). BuildFailure(EXIT_ENV) when there is none, before anything compiles."""
    if not max_gcc:
        return None
    default = env.get("CXX") or "c++"
    exe = shutil.which(default.split()[-1], path=env.get("PATH")) or default
    try:
        banner = run_capture([exe, "--version"], timeout=60)
        major = int(run_capture([exe, "-dumpfullversion", "-dumpversion"], timeout=60).split(".")[0])
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):
        return None  # not a gcc we can ask; the compile step reports what is wrong with it
    if "clang" in banner.lower() or major <= max_gcc:
        return None
    for n in range(max_gcc, 5, -1):
        cxx = shutil.which(f"g++-{n}", path=env.get("PATH"))
        cc = shutil.which(f"gcc-{n}", path=env.get("PATH"))
        if cxx and cc:
            reason = (
                f"{default} is gcc {major}, newer than the toolkit accepts (gcc <= {max_gcc}): using g++-{n}"
            )
            rep.line(f"attnforge: {reason}")
            return {"cxx": cxx, "cc": cc, "reason": reason}
    raise BuildFailure(
        EXIT_ENV,
        f"{default} is gcc {major}, but this CUDA toolkit accepts gcc <= {max_gcc} and no g++-N/gcc-N with "
        f"N <= {max_gcc} is on PATH: install one (e.g. g++-{max_gcc}) or set CXX/CC to a supported compiler",
    )


def toolchain(cuda_home: str | None, tinfo: dict[str, Any], cxx: str | None = None) -> dict[str, str | None]:
    """nvcc's and the host compiler's versions, with the interpreter's Python and torch."""
    nvcc = None
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        with contextlib.suppress(RuntimeError, OSError):
            out = run_capture([os.path.join(cuda_home, "bin", "nvcc"), "--version"])
            m = re.search(r"V(\d+\.\d+\.\d+)", out)
            nvcc = m.group(1) if m else None
    gcc = None
    with contextlib.suppress(RuntimeError, OSError):
        gcc = run_capture([(cxx or os.environ.get("CXX", "c++")).split()[-1], "-dumpfullversion"])
    return {"nvcc": nvcc, "gcc": gcc, "python": tinfo.get("python"), "torch": tinfo.get("torch")}


def nvcc_problem(tinfo: dict[str, Any], tool: dict[str, str | None], cuda_home: str | None) -> str | None:
    """Why nvcc cannot build against this torch, or None: a CUDA torch needs an nvcc of its CUDA major; a
    CPU or ROCm torch needs none (it builds only what its setup.py declares for it)."""
    cuda, nvcc = tinfo.get("cuda"), tool.get("nvcc")
    if not cuda:
        return None
    if not nvcc:
        return f"no nvcc under CUDA_HOME={cuda_home}: torch {tinfo.get('torch')} is a CUDA {cuda} build"
    if str(cuda).split(".")[0] != nvcc.split(".")[0]:
        return f"nvcc {nvcc} and torch's CUDA {cuda} differ in major version"
    return None
