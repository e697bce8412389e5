"""``python -m attnforge.fa4.worker ACTION ...``: the GPU side of ``attnforge fa4`` (torch and FA4 only).

call  --decl JSON [--steady N]   one declaration's first call in this (fresh) process: import time, first
                                 call time, steady-state ms, errors against SDPA in fp32, and the cache
                                 entries the call compiled (new ``.o`` files in FA4's cache folder); one
                                 ``@@fa4 {json}`` line
env                              the FA4 stack here: versions, fingerprint (FA4's own and attnforge's), GPU
build --decls FILE --out DIR     each declaration's first call in a fresh process with an empty cache (cold:
                                 FA4 compiles and files the entries), the entries collected into
                                 ``DIR/artifacts`` with a manifest, and the ``attnforge-fa4-kernels`` wheel in
                                 ``DIR/dist``
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from attnforge.fa4 import declare
from attnforge.fa4.package import build_wheel
from attnforge.fa4.runtime import fingerprint, sources_digest

PREFIX = "@@fa4 "
PIN_DISTS = (
    "flash-attn-4",
    "nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-core",
    "nvidia-cutlass-dsl-libs-cu12",
    "nvidia-cutlass-dsl-libs-cu13",
    "apache-tvm-ffi",
    "quack-kernels",
    "torch-c-dlpack-ext",
)


def cache_files(root: Path | None) -> set[str]:
    """``.o`` entries under FA4's cache folder, relative to it."""
    if root is None or not root.is_dir():
        return set()
    return {p.relative_to(root).as_posix() for p in root.rglob("*.o") if not p.name.startswith(".")}


def fa4_cache_dir() -> Path:
    """FA4's cache folder as FA4 resolves it (``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`` or the temp default)."""
    from flash_attn.cute import cache_utils

    return Path(cache_utils.get_cache_path())


def action_call(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    import flash_attn.cute as fa4

    from attnforge.fa4 import calls  # optional: torch

    t2 = time.perf_counter()
    d = declare.parse(json.loads(args.decl))
    root = fa4_cache_dir()
    before = cache_files(root)
    x = calls.make_inputs(d, d.seq_lens[0])
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    calls.step(fa4, d, x)
    torch.cuda.synchronize()
    first = time.perf_counter() - t3
    compiled = sorted(cache_files(root) - before)
    times = []
    for _ in range(args.steady):
        s = time.perf_counter()
        calls.step(fa4, d, x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - s) * 1000)
    other: dict[str, Any] = {}
    probes = [int(n) for n in args.probe.split(",") if n.strip()] if args.probe else []
    for n in [*d.seq_lens[1:], *probes]:
        seen = cache_files(root)
        y = calls.make_inputs(d, n)
        s = time.perf_counter()
        calls.step(fa4, d, y)
        torch.cuda.synchronize()
        other[str(n)] = {
            "first_call_s": round(time.perf_counter() - s, 4),
            "compiled": len(cache_files(root) - seen),
        }
    err = calls.errors(fa4, d, x)
    hook: dict[str, Any] = {}
    if "attnforge_fa4" in sys.modules:
        hook = sys.modules["attnforge_fa4"].stats()
    persistent = os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") == "1"
    used = (
        "compile"
        if compiled or not persistent
        else ("wheel" if hook.get("fingerprint") == "match" else "cache")
    )
    print(
        PREFIX
        + json.dumps(
            {
                "config": d.name,
                "declared": d.describe(),
                "import_torch_s": round(t1 - t0, 3),
                "import_fa4_s": round(t2 - t1, 3),
                "first_call_s": round(first, 4),
                "steady_call_ms": round(statistics.median(times), 4) if times else None,
                "compiled_entries": compiled,
                "used": used,
                "hook": hook,
                "other_lens": other,
                **err,
            }
        ),
        flush=True,
    )
    return 0


def env_info() -> dict[str, Any]:
    """Versions, fingerprints and the GPU of this process's FA4 stack."""
    import cutlass
    import torch
    import tvm_ffi
    from flash_attn.cute import cache_utils

    root = Path(cache_utils.__file__).resolve().parent
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    pins = {}
    for dist in PIN_DISTS:
        with contextlib.suppress(md.PackageNotFoundError):
            pins[dist] = md.version(dist)
    major, minor = torch.cuda.get_device_capability()
    cuda = str(torch.version.cuda)
    ours = fingerprint(root, py, str(cutlass.__version__), str(tvm_ffi.__version__))
    upstream = str(cache_utils._compute_source_fingerprint())
    return {
        "fingerprint": upstream,
        "fingerprint_matches_upstream": ours == upstream,
        "env": {
            "python": py,
            "flash_attn_4": pins.get("flash-attn-4"),
            "cutlass": str(cutlass.__version__),
            "tvm_ffi": str(tvm_ffi.__version__),
            "sources_sha256": sources_digest(root),
            "pins": pins,
            "torch": torch.__version__,
            "cuda": cuda,
            "cuda_major": cuda.split(".")[0],
            "arch": major * 10 + minor,
            "gpu": torch.cuda.get_device_name(),
        },
    }


def action_env(args: argparse.Namespace) -> int:
    print(PREFIX + json.dumps(env_info()), flush=True)
    return 0


def run_call(
    python: str, decl: declare.Declaration, env: dict[str, str], steady: int = 0, probe: str = ""
) -> dict[str, Any]:
    """``worker call`` in a fresh process; its result, or ``{"error": ...}``."""
    cmd = [
        python,
        "-m",
        "attnforge.fa4.worker",
        "call",
        "--decl",
        json.dumps(decl.to_json()),
        "--steady",
        str(steady),
    ]
    p = subprocess.run([*cmd, "--probe", probe] if probe else cmd, capture_output=True, text=True, env=env)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(PREFIX):
            result: dict[str, Any] = json.loads(line[len(PREFIX) :])
            result["stderr_tail"] = p.stderr[-600:] if p.stderr.strip() else ""
            return result
    return {"config": decl.name, "error": f"exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}"}


def fresh_env(tmp: Path, cache_dir: Path | None, hook: bool, persistent: bool = True) -> dict[str, str]:
    """The environment of a fresh timed process: its own temp and home folders (FA4's and the DSL's default
    caches live there), FA4's persistent cache on (in ``cache_dir`` when given) or off (FA4's default: an
    in-memory cache only), attnforge's hook on or off."""
    env = dict(os.environ)
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env["HOME"] = str(tmp)  # any per-user cache of the DSL starts empty too
    env["XDG_CACHE_HOME"] = str(tmp / ".cache")
    env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "1" if persistent else "0"
    env.pop("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", None)
    if cache_dir is not None:
        env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] = str(cache_dir)
    env["ATTNFORGE_FA4"] = "1" if hook else "0"
    return env


def action_build(args: argparse.Namespace) -> int:
    decls = declare.load(Path(args.decls))
    out = Path(args.out)
    raw = out / "raw"
    art = out / "artifacts"
    shutil.rmtree(art, ignore_errors=True)
    (art / "cache").mkdir(parents=True)
    info = env_info()
    if not info["fingerprint_matches_upstream"]:
        print(
            "attnforge fa4: attnforge's fingerprint differs from FA4's own; refusing to package",
            file=sys.stderr,
        )
        return 6
    fp = info["fingerprint"]
    entries: dict[str, dict[str, Any]] = {}
    results = []
    for d in decls:
        cache = raw / d.name
        shutil.rmtree(cache, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=f"fa4-{d.name}-") as tmp:
            r = run_call(sys.executable, d, fresh_env(Path(tmp), cache, hook=False), steady=args.steady)
        r["entries"] = []
        if "error" not in r:
            if not r.get("ok"):
                r["error"] = f"errors beyond upstream's tolerance: {r.get('worst')}"
            for rel in sorted(cache_files(cache / fp)):
                src = cache / fp / rel
                dest = art / "cache" / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
                entries[rel] = {
                    "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
                    "size": src.stat().st_size,
                }
                r["entries"].append(rel)
            if "error" in r:
                r["entries"] = []
        print(
            f"{d.name}: " + (r.get("error") or f"{r['first_call_s']} s cold, {len(r['entries'])} entries"),
            flush=True,
        )
        results.append({"name": d.name, "spec": d.to_json(), **r})
    ok_entries = {e for r in results if "error" not in r for e in r["entries"]}
    manifest = {
        "format": 1,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **info,
        "declarations": results,
        "entries": {k: v for k, v in sorted(entries.items()) if k in ok_entries},
    }
    (art / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    wheel = build_wheel(art, out / "dist")
    print(f"wheel: {wheel}", flush=True)
    return 0 if all("error" not in r for r in results) else 6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnforge.fa4.worker")
    sub = ap.add_subparsers(dest="action", required=True)
    c = sub.add_parser("call")
    c.add_argument("--decl", required=True)
    c.add_argument("--steady", type=int, default=0)
    c.add_argument("--probe", default="", help="undeclared lengths to call after the first (comma-separated)")
    sub.add_parser("env")
    b = sub.add_parser("build")
    b.add_argument("--decls", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--steady", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        return {"call": action_call, "env": action_env, "build": action_build}[args.action](args)
    except declare.DeclarationError as exc:
        print(f"attnforge fa4: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
