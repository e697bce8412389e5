#!/usr/bin/env python3
"""Probe whether C++ built on this machine works inside torch's process, per host compiler.

For each compiler (``--cxx``, default: every distinct g++ on PATH and in /opt/gcc/bin, /usr/bin), in a
fresh child process:

- ``exception``: the builder's own probe (``attnforge.builder.compiler.probe_cxx``): a pybind11 + c10 unit
  that raises through ``TORCH_CHECK`` inside a nested lambda, as attnforge's dispatch header does for a head
  dim a wheel was built without. Expected: a Python ``RuntimeError``; a crash here is what made excluded
  head dims SIGSEGV on the H100. ``seconds`` is its wall time, compile included.
- ``exception_extension_h``: the same unit through ``load_inline``, which compiles it with all of
  ``torch/extension.h`` (the probe's earlier, slower form): both must agree.
- ``aoti`` (``--aoti``): ``torch.export`` + ``aoti_compile_and_package`` + ``aoti_load_package`` of a
  Linear+GELU module (Inductor compiles its wrapper with the same compiler through ``CXX``): the Flex
  builder's own round trip, ``attnforge.flex.worker.aoti_probe``, on CUDA. The child's stdout is that
  function's progress lines, then ``RESULT`` and the dict it returned, as JSON.

Prints one JSON document: compiler versions, the libstdc++ the process loaded, and each probe's outcome
(``ok``, or the signal that killed the child). Needs torch and ``PYTHONPATH=src`` (the children import the
same ``attnforge`` as this script).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attnforge
from attnforge.builder.compiler import CXX_PROBE_SOURCE, probe_cxx
from attnforge.flex.worker import aoti_probe

# the probe's unit compiled with all of torch/extension.h, as load_inline does (its module part is load_inline's)
EXTENSION_H_CHILD = f"""\
import sys
from torch.utils.cpp_extension import load_inline
src = {CXX_PROBE_SOURCE.split("PYBIND11_MODULE")[0]!r}
m = load_inline("attnforge_cxx_probe_ext", cpp_sources=[src], functions=["dispatch"], build_directory=sys.argv[1])
assert m.dispatch(64) == 2
try:
    m.dispatch(16)
except RuntimeError as exc:
    print("RAISED", str(exc).splitlines()[0], flush=True)
"""

# the Flex builder's own AOTInductor round trip, in a child (a crash kills the child, not this script)
AOTI_CHILD = f"""\
import json, sys
from {aoti_probe.__module__} import {aoti_probe.__name__}
print("RESULT", json.dumps({aoti_probe.__name__}({{"device": "cuda"}}, sys.argv[1] + "/probe.pt2")), flush=True)
"""

# where this script's attnforge lives: the children import the same one, wherever they are started
SRC = str(Path(attnforge.__file__).resolve().parents[1])


def compilers() -> list[str]:
    """Distinct g++ binaries (by resolved path) on PATH, in /opt/gcc/bin and /usr/bin."""
    seen: dict[str, str] = {}
    for cand in [shutil.which("g++"), shutil.which("c++"), "/opt/gcc/bin/g++", "/usr/bin/g++"]:
        if cand and os.path.exists(cand):
            seen.setdefault(os.path.realpath(cand), cand)
    return list(seen.values())


def version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return (out.stdout.splitlines() or ["?"])[0]


def libstdcxx_of(cxx: str) -> str:
    out = subprocess.run([cxx, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True)
    return os.path.realpath(out.stdout.strip())


def run_child(code: str, cxx: str, timeout: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        path = os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])])
        env = dict(
            os.environ,
            CXX=cxx,
            CC=cxx.replace("g++", "gcc"),
            TORCHINDUCTOR_CACHE_DIR=tmp + "/ind",
            PYTHONPATH=path,
        )
        try:
            p = subprocess.run(
                [sys.executable, "-X", "faulthandler", "-c", code, tmp],
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"outcome": "timeout"}
    rc = p.returncode
    outcome = signal.Signals(-rc).name if rc < 0 else ("ok" if rc == 0 else f"exit {rc}")
    return {"outcome": outcome, "stdout": p.stdout.strip()[-600:], "stderr_tail": p.stderr.strip()[-1500:]}


def builder_probe(cxx: str) -> dict[str, object]:
    """The builder's own probe of ``cxx``: ``ok`` or its reason, and its wall seconds."""
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        start = time.monotonic()
        why = probe_cxx(sys.executable, cxx, dict(os.environ), Path(tmp))
        return {"outcome": why or "ok", "seconds": round(time.monotonic() - start, 1)}


def loaded_libstdcxx() -> str:
    code = "import torch, re; print([l.split()[-1] for l in open('/proc/self/maps') if 'libstdc++' in l][:1])"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cxx", action="append", help="compiler to probe (repeatable)")
    ap.add_argument("--aoti", action="store_true", help="also the AOTInductor round trip (needs CUDA)")
    ap.add_argument("--out", type=Path, help="write the JSON here too")
    a = ap.parse_args()
    report: dict[str, object] = {
        "python": sys.version.split()[0],
        "torch_process_libstdcxx": loaded_libstdcxx(),
    }
    rows = []
    for cxx in a.cxx or compilers():
        row: dict[str, object] = {"cxx": cxx, "version": version(cxx), "libstdcxx": libstdcxx_of(cxx)}
        row["exception"] = builder_probe(cxx)
        start = time.monotonic()
        row["exception_extension_h"] = run_child(EXTENSION_H_CHILD, cxx, 600)
        row["exception_extension_h"]["seconds"] = round(time.monotonic() - start, 1)
        if a.aoti:
            row["aoti"] = run_child(AOTI_CHILD, cxx, 600)
        rows.append(row)
        print(json.dumps(row), flush=True)
    report["compilers"] = rows
    text = json.dumps(report, indent=1)
    if a.out:
        a.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
