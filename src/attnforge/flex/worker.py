"""Subprocess side of the Flex builder and benchmarks: ``python -m attnforge.flex.worker ACTION ...``.

Each action runs in its own process (fresh Inductor/Triton cache dirs come from the parent's environment),
so a compiler crash (AOTInductor has segfaulted in ``aoti_load_package``) cannot take the tool down.
The last stdout line is a JSON object with the outcome. Needs torch only.

Actions:
  megacache  --variant JSON --out FILE         compile + run (fwd, and bwd if the variant has it), check
                                               against eager, save ``torch.compiler.save_cache_artifacts()``
  precompile --variant JSON --out FILE         torch.compile(...).aot_compile (fwd, and bwd if declared),
                                               run + check against eager, save_compiled_function
  aoti-build --variant JSON --out FILE.pt2     torch.export + aoti_compile_and_package (forward; a fwd+bwd
                                               variant: FILE (.fwd.pt2) and its .bwd.pt2, aoti_train)
  aoti-run   --variant JSON --package FILE     load (C++ loader) + run + check against the reference (and
                                               a fwd+bwd pair's gradients against eager)
  first-call --variant JSON --mode cold|megacache|precompiled|aoti [--artifact FILE] [--backward]
             [--steady N] [--profile FILE]     time the first call in this (fresh) process (then N more);
                                               --profile: cProfile of the first call, top functions as text
  aoti-probe --variant JSON --out FILE.pt2     the minimal AOTInductor round trip without FlexAttention
                                               (a Linear + GELU): tells a Flex-specific crash from a
                                               general one

``--cache-key-log FILE`` (megacache, first-call): write every FX graph / AOTAutograd cache key the action
computes, component by component, and the caches' hit/miss messages (``attnforge.flex.cachekeys``); two
such files, one from the build and one from a loading process, are compared with
``python -m attnforge.flex.cachekeys diff BUILD LOAD``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from attnforge.flex import aoti_train
from attnforge.flex.cachekeys import capture
from attnforge.flex.runtime import TrainPackages, envkeys, load_package, precompiled
from attnforge.flex.runtime.precompiled import WHEEL_PACKAGE, wheel_package

RESULT_PREFIX = "@@flex-result "


def _fault(action: str) -> None:
    """Test hook: ``ATTNFORGE_FLEX_FAULT=<action>`` makes that action die with SIGSEGV (crash handling tests)."""
    import os

    if os.environ.get("ATTNFORGE_FLEX_FAULT") == action:
        import ctypes

        ctypes.string_at(0)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(obj, default=str), flush=True)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _reference_err(v: dict[str, Any], out: Any, q: Any, k: Any, vv: Any) -> float:
    """max |out - fp32 dense reference| (same mask and score_mod)."""

    from attnforge.flex.runtime import mods  # optional: torch
    from attnforge.reference import attention_ref  # optional: torch

    s = q.shape[-2]
    mask = mods.dense_mask(v, s, q.device)
    bias = mods.dense_bias(v, s, q.device)
    cap = float(v["softcap"]) if v.get("score_mod") == "softcap" else 0.0
    ref, _ = attention_ref(
        q.transpose(1, 2),
        k.transpose(1, 2),
        vv.transpose(1, 2),
        mask=mask,
        bias=bias,
        softcap=cap,
        scale=mods.scale_of(v),
        upcast=True,
    )
    return float((out.float() - ref.transpose(1, 2).float()).abs().max().item()) if out.numel() else 0.0


def _classify(exc: BaseException) -> str:
    name = type(exc).__name__
    if name in ("Unsupported", "UserError", "InternalTorchDynamoError", "TorchRuntimeError"):
        return "untraceable"
    if name in ("BackendCompilerFailed", "InductorError"):
        return "compile"
    return "error"


def _run_checked(v: dict[str, Any], run: Any, q: Any, k: Any, vv: Any) -> tuple[float, float]:
    """Seconds of ``run()`` (compile included) plus the backward when the variant has one, and the output's
    max error vs the fp32 reference."""
    import torch

    dev = v.get("device", "cuda")
    t0 = time.perf_counter()
    o = run()
    if v.get("backward"):
        o.backward(torch.ones_like(o))
    _sync(dev)
    seconds = time.perf_counter() - t0
    return seconds, _reference_err(v, o.detach(), q.detach(), k.detach(), vv.detach())


def megacache(v: dict[str, Any], out: str) -> dict[str, Any]:
    import torch

    from attnforge.flex.runtime import mods  # optional: torch

    dev = v.get("device", "cuda")
    q, k, vv = mods.make_inputs(v, dev, grad=bool(v.get("backward")))
    call = mods.FlexCall(v, dev)
    compile_s, err = _run_checked(v, lambda: call(q, k, vv), q, k, vv)
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        raise RuntimeError("torch.compiler.save_cache_artifacts() returned nothing (caches disabled?)")
    blob, info = saved
    with open(out, "wb") as fh:
        fh.write(blob)
    kinds = {str(key): len(val) for key, val in getattr(info, "artifacts", {}).items()}
    return {
        "ok": True,
        "compile_s": round(compile_s, 3),
        "bytes": len(blob),
        "max_err": err,
        "artifacts": kinds,
        "env": envkeys.collect(dev),
    }


def precompile(v: dict[str, Any], out: str) -> dict[str, Any]:
    """aot_compile the variant (forward+backward when declared), check it, save it to ``out``. Built with the
    runtime under the wheel's import name, so the saved guards name modules the wheel has."""
    import importlib

    wheel_package(source_first=True)
    mods = importlib.import_module(f"{WHEEL_PACKAGE}.mods")
    precompiled = importlib.import_module(f"{WHEEL_PACKAGE}.precompiled")
    dev = v.get("device", "cuda")
    q, k, vv = mods.make_inputs(v, dev, grad=bool(v.get("backward")))
    args = mods.precompile_args(v, dev, q, k, vv)

    def run() -> Any:
        fn = precompiled.compile_and_save(
            args, out, dynamic=bool(v.get("dynamic")), mode=v.get("mode", "default")
        )
        return fn(*args)

    compile_s, err = _run_checked(v, run, q, k, vv)
    return {"ok": True, "compile_s": round(compile_s, 3), "bytes": Path(out).stat().st_size, "max_err": err}


def aoti_build(v: dict[str, Any], out: str) -> dict[str, Any]:
    """torch.export + AOTInductor: the forward, or for a fwd+bwd variant its forward and backward packages
    (``out`` and ``aoti_train.backward_path(out)``)."""
    import torch

    from attnforge.flex.runtime import mods  # optional: torch

    dev = v.get("device", "cuda")
    if v.get("backward"):
        t0 = time.perf_counter()
        info = aoti_train.build(v, dev, Path(out))
        return {"ok": True, "build_s": round(time.perf_counter() - t0, 3), "path": out, "train": info}
    q, k, vv = mods.make_inputs(v, dev)
    mod = mods.FlexModule(v, dev)
    t0 = time.perf_counter()
    ep = torch.export.export(mod, (q, k, vv))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=out)
    return {"ok": True, "build_s": round(time.perf_counter() - t0, 3), "path": str(path)}


def _load_packages(v: dict[str, Any], package: str) -> Any:
    """As attnforge_flex loads them (no vector-ISA probe): the package, or a fwd+bwd variant's pair."""
    if not v.get("backward"):
        return load_package(Path(package))
    return TrainPackages(load_package(Path(package)), load_package(aoti_train.backward_path(Path(package))))


def _grad_err(v: dict[str, Any], fn: Any) -> dict[str, Any]:
    """fwd+bwd through ``fn`` vs eager flex_attention: max |difference| of dq, dk, dv."""
    import torch

    from attnforge.flex.runtime import mods  # optional: torch

    dev = v.get("device", "cuda")
    q, k, vv = mods.make_inputs(v, dev, grad=True)
    go = torch.randn_like(q)
    leaves = (q, k, vv)
    got = torch.autograd.grad(fn(q, k, vv), leaves, go)
    want = torch.autograd.grad(mods.FlexCall(v, dev, compiled=False)(q, k, vv), leaves, go)
    errs = {n: float((a.float() - b.float()).abs().max()) for n, a, b in zip("qkv", got, want, strict=True)}
    return {"grad_max_err": max(errs.values()), "grad_max_err_by_input": errs}


def aoti_run(v: dict[str, Any], package: str) -> dict[str, Any]:
    from attnforge.flex.runtime import mods  # optional: torch

    dev = v.get("device", "cuda")
    q, k, vv = mods.make_inputs(v, dev)
    print("aoti-run: loading package", flush=True)
    t0 = time.perf_counter()
    fn = _load_packages(v, package)
    load_s = time.perf_counter() - t0
    print("aoti-run: loaded; running", flush=True)
    o = fn(q, k, vv)
    _sync(dev)
    first = time.perf_counter() - t0
    o = o[0] if isinstance(o, (list, tuple)) else o
    err = _reference_err(v, o, q, k, vv)
    grads = _grad_err(v, fn) if v.get("backward") else {}
    return {"ok": True, "load_s": round(load_s, 3), "first_call_s": round(first, 3), "max_err": err, **grads}


def aoti_probe(v: dict[str, Any], out: str) -> dict[str, Any]:
    """export -> aoti_compile_and_package -> aoti_load_package -> run, for a tiny non-attention module."""
    import torch

    dev = v.get("device", "cuda")

    class Tiny(torch.nn.Module):  # type: ignore[misc, unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(self.lin(x))

    m = Tiny().to(dev)
    x = torch.randn(8, 64, device=dev)
    t0 = time.perf_counter()
    ep = torch.export.export(m, (x,))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=out)
    build_s = time.perf_counter() - t0
    print("aoti-probe: built; loading", flush=True)
    fn = torch._inductor.aoti_load_package(path)
    print("aoti-probe: loaded; running", flush=True)
    y = fn(x)
    y = y[0] if isinstance(y, (list, tuple)) else y
    err = float((y - m(x)).abs().max().item())
    return {"ok": True, "build_s": round(build_s, 3), "max_err": err}


def first_call(
    v: dict[str, Any],
    mode: str,
    artifact: str | None,
    backward: bool,
    steady: int = 0,
    profile: str | None = None,
) -> dict[str, Any]:
    """Seconds of the first call (fwd or fwd+bwd), loading of the artifact and the block mask included
    (``blockmask_s`` and ``load_s`` say how much of it they took); with ``steady`` > 0, the median of that
    many further calls (``steady_ms``), to compare the loaded kernels' speed with the cold-compiled ones.
    ``profile``: write where the first call's time went (cProfile, by cumulative time) to that file."""
    import cProfile
    import statistics

    import torch

    from attnforge.flex.runtime import mods  # optional: torch

    dev = v.get("device", "cuda")
    q, k, vv = mods.make_inputs(v, dev, grad=backward)
    _sync(dev)
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    t0 = time.perf_counter()
    load_s = blockmask_s = 0.0
    step: Any
    if mode == "aoti":
        package = _load_packages(v | {"backward": backward}, str(artifact))
        load_s = time.perf_counter() - t0

        def step() -> Any:
            o = package(q, k, vv)
            return o[0] if isinstance(o, (list, tuple)) else o
    elif mode == "precompiled":
        fn = precompiled.load(str(artifact), trust_cpu_isa=dev == "cpu")
        load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        args = mods.precompile_args(v, dev, q, k, vv)
        blockmask_s = time.perf_counter() - t1

        def step() -> Any:
            return fn(*args)
    else:
        if mode == "megacache":
            with open(str(artifact), "rb") as fh:
                torch.compiler.load_cache_artifacts(fh.read())
            load_s = time.perf_counter() - t0
        call = mods.FlexCall(v, dev)
        t1 = time.perf_counter()
        call.block_mask(q.shape[-2])
        blockmask_s = time.perf_counter() - t1

        def step() -> Any:
            return call(q, k, vv)

    def run() -> None:
        o = step()
        if backward:
            o.backward(torch.ones_like(o))
        _sync(dev)

    run()
    total = time.perf_counter() - t0
    if prof and profile:
        prof.disable()
        _write_profile(prof, profile, f"{v.get('name')} {mode}: first call {total:.3f} s")
    times = []
    for _ in range(steady):
        t1 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t1)
    from torch._dynamo.utils import counters

    hits = {key: dict(val) for key, val in counters.items() if key in ("inductor", "aot_autograd")}
    return {
        "ok": True,
        "seconds": round(total, 4),
        "load_s": round(load_s, 4),
        "blockmask_s": round(blockmask_s, 4),
        "counters": hits,
        "steady_ms": round(statistics.median(times) * 1000, 4) if times else None,
    }


def _write_profile(prof: Any, path: str, title: str) -> None:
    """The profile's top 60 functions by cumulative time, as text."""
    import io
    import pstats

    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(60)
    Path(path).write_text(f"{title}\n{buf.getvalue()}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="attnforge.flex.worker")
    ap.add_argument(
        "action", choices=["megacache", "precompile", "aoti-build", "aoti-run", "first-call", "aoti-probe"]
    )
    ap.add_argument("--variant", required=True, help="the variant as JSON")
    ap.add_argument("--out")
    ap.add_argument("--package")
    ap.add_argument("--artifact")
    ap.add_argument("--mode", default="cold", choices=["cold", "megacache", "precompiled", "aoti"])
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--steady", type=int, default=0, help="first-call: then time this many more calls")
    ap.add_argument("--profile", help="first-call: write a cProfile of the first call to this file")
    ap.add_argument("--cache-key-log", help="megacache/first-call: write the cache keys computed (cachekeys)")
    a = ap.parse_args(argv)
    faulthandler.enable()  # a segfault prints the Python stack on stderr (kept in the build manifest)
    v = json.loads(a.variant)
    _fault(a.action)
    try:
        with _key_log(a.cache_key_log):
            res = _act(a, v)
    except Exception as exc:
        msg = str(exc).strip().splitlines()
        _emit(
            {
                "ok": False,
                "kind": _classify(exc),
                "error": f"{type(exc).__name__}: {msg[0] if msg else ''}",
                "traceback": traceback.format_exc(limit=6)[-3000:],
            }
        )
        return 1
    _emit(res)
    return 0


def _key_log(path: str | None) -> Any:
    """``cachekeys.capture(path)``, or nothing."""
    import contextlib

    if not path:
        return contextlib.nullcontext()
    return capture(path)


def _act(a: argparse.Namespace, v: dict[str, Any]) -> dict[str, Any]:
    """Run the parsed action."""
    if a.action == "megacache":
        return megacache(v, a.out)
    if a.action == "precompile":
        return precompile(v, a.out)
    if a.action == "aoti-build":
        return aoti_build(v, a.out)
    if a.action == "aoti-run":
        return aoti_run(v, a.package)
    if a.action == "aoti-probe":
        return aoti_probe(v, a.out)
    return first_call(v, a.mode, a.artifact, a.backward, a.steady, a.profile)


if __name__ == "__main__":
    sys.exit(main())
