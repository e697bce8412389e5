"""Load what the artifacts hold: Mega-Cache files into Inductor's caches (``load``), a variant as a callable
(``attention``), its AOTInductor package (``aoti``) or precompiled function (``precompiled_function``), each
checked against the environment and its sha256 first; anything unusable warns once and compiles as usual."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import envkeys, precompiled
from .artifact_manifest import ARTIFACTS, base_dir, read_manifest, variants, warn_once

_loaded: dict[str, Any] = {}


@dataclass
class LoadResult:
    """What ``load()`` did: variants whose artifacts went into the caches, and those left out (why)."""

    loaded: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    reason: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.loaded) and self.reason is None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load(artifacts: str | Path | None = None, names: list[str] | None = None) -> LoadResult:
    """Load the Mega-Cache artifacts into Inductor's caches, after checking the environment matches.

    Never raises for a stale or broken artifact: it warns once and returns a result saying what happened.
    """
    import time

    t0 = time.perf_counter()
    res = LoadResult()
    base = base_dir(artifacts)
    try:
        data = read_manifest(base)
    except (OSError, ValueError) as exc:
        res.reason = f"no usable artifacts ({exc})"
        warn_once(res.reason)
        return res
    try:
        import torch
    except Exception as exc:
        res.reason = f"torch does not import ({exc})"
        warn_once(res.reason)
        return res
    here = envkeys.collect(str(data["env"].get("device", "cuda")))
    diff = envkeys.mismatches(data["env"], here)
    if diff:
        res.reason = "artifacts were built for another environment: " + "; ".join(diff)
        warn_once(res.reason)
        return res
    for entry in data["variants"]:
        name = entry["name"]
        if names is not None and name not in names:
            continue
        mc = entry.get("megacache") or {}
        if not mc.get("file"):
            res.skipped[name] = "no Mega-Cache artifact"
            continue
        path = base / mc["file"]
        try:
            _check_sha256(path, mc.get("sha256"))
            info = torch.compiler.load_cache_artifacts(path.read_bytes())
        except Exception as exc:
            res.skipped[name] = f"{path.name}: {exc}"
            warn_once(f"variant {name}: artifact not loaded: {exc}")
            continue
        res.loaded.append(name)
        _loaded[name] = info
    res.seconds = time.perf_counter() - t0
    return res


def attention(name: str, artifacts: str | Path | None = None, device: str | None = None) -> Any:
    """A callable ``fn(q, k, v)`` running the named variant through ``torch.compile(flex_attention)``.

    Its mask and score_mod are the ones the artifacts were compiled with, so a loaded cache hits. A mask
    that torch.compile cannot trace falls back to eager flex_attention with a warning.
    """
    from . import mods  # optional: torch

    spec = variants(artifacts).get(name)
    if spec is None:
        raise KeyError(
            f"no FlexAttention variant {name!r} in {artifacts or ARTIFACTS} (have: {sorted(variants(artifacts))})"
        )
    call = mods.FlexCall(spec, device or spec.get("device", "cuda"))
    # a working AOTInductor package runs without any compile: forward-only variants (CPU ones, typically),
    # and fwd+bwd variants built with their backward package (GPU)
    packaged = aoti(name, artifacts, quiet=True)
    if spec.get("backward") and not getattr(packaged, "backward", False):
        packaged = None  # none, or a forward-only package of a fwd+bwd variant (older builds): precompiled
    # otherwise a precompiled function (fwd+bwd) skips tracing and cache lookups when the inputs fit it
    pre = precompiled_function(name, artifacts, quiet=True) if packaged is None else None
    return _Guarded(call, spec, packaged, pre)


class _Guarded:
    """Runs the compiled call; on a tracing/compile error warns once and uses eager flex_attention."""

    def __init__(self, call: Any, spec: dict[str, Any], packaged: Any = None, pre: Any = None) -> None:
        self.call = call
        self.spec = spec
        self.eager: Any = None
        self.packaged = packaged
        self.pre = pre
        self.used: str | None = None  # what the last call ran: "aoti", "precompiled", "compile" or "eager"
        s = spec
        self.shape = (
            (int(s.get("batch", 1)), int(s["heads_q"]), int(s["seq_len"]), int(s["head_dim"])),
            (int(s.get("batch", 1)), int(s["heads_kv"]), int(s["seq_len"]), int(s["head_dim"])),
        )

    def _fits_package(self, q: Any, k: Any, v: Any) -> bool:
        """The package's exact inputs: shapes, dtype, device, contiguous; gradients only for a fwd+bwd pair."""
        if self.packaged is None:
            return False
        if not getattr(self.packaged, "backward", False) and (
            q.requires_grad or k.requires_grad or v.requires_grad
        ):
            return False
        dt = str(q.dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float16", "fp16")
        return (
            (tuple(q.shape), tuple(k.shape)) == self.shape
            and dt == self.spec.get("dtype")
            and q.device.type == self.spec.get("device", "cuda")
            and all(t.is_contiguous() for t in (q, k, v))
        )

    def __call__(self, q: Any, k: Any, v: Any) -> Any:
        if self._fits_package(q, k, v):
            self.used = "aoti"
            out = self.packaged(q, k, v)
            return out[0] if isinstance(out, (list, tuple)) else out
        if self.pre is not None and self.eager is None:
            c = self.call
            try:
                out = self.pre(q, k, v, c.block_mask(q.shape[-2]), c.score_mod, c.gqa, c.scale)
                self.used = "precompiled"
                return out
            except precompiled.GuardMismatch:
                pass  # other shapes/dtypes: torch.compile as usual (its caches may still hit)
            except Exception as exc:  # a loaded function that cannot run here: never again, compile instead
                self.pre = None
                warn_once(
                    f"variant {self.spec['name']}: precompiled function failed "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                )
        if self.eager is None:
            want = str(self.spec.get("dtype"))
            got = str(q.dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float16", "fp16")
            if got != want:
                warn_once(f"variant {self.spec['name']}: built for {want}, called with {got} (no cache hit)")
            try:
                self.used = "compile"
                return self.call(q, k, v)
            except Exception as exc:
                if type(exc).__name__ not in (
                    "Unsupported",
                    "BackendCompilerFailed",
                    "TorchRuntimeError",
                    "InternalTorchDynamoError",
                    "UserError",
                ):
                    raise
                warn_once(
                    f"variant {self.spec['name']}: torch.compile failed ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}); running eager"
                )
                from . import mods  # optional: torch

                self.eager = mods.FlexCall(self.spec, self.call.device, compiled=False)
        self.used = "eager"
        return self.eager(q, k, v)


def _usable_file(
    name: str, key: str, what: str, artifacts: str | Path | None, quiet: bool
) -> tuple[Path, str, dict[str, Any]] | None:
    """The variant's ``key`` artifact file ("aoti", "precompiled"), the device it was built for and its
    manifest record, when it built, is intact (sha256) and was built in an environment matching this one; else
    None (with a warning unless ``quiet``, and always for a corrupted file or another environment)."""
    base = base_dir(artifacts)
    try:
        data = read_manifest(base)
    except (OSError, ValueError) as exc:
        if not quiet:
            warn_once(f"no usable artifacts ({exc})")
        return None
    entry = next((e for e in data["variants"] if e["name"] == name), None)
    art = (entry or {}).get(key) or {}
    if not art.get("file") or not art.get("ok"):
        if not quiet:
            warn_once(f"variant {name}: no working {what} ({art.get('reason', 'not built')})")
        return None
    path: Path = base / str(art["file"])
    try:
        _check_sha256(path, art.get("sha256"))
    except (OSError, ValueError) as exc:
        warn_once(f"variant {name}: {what} not used: {exc}")
        return None
    diff = envkeys.mismatches(data["env"], envkeys.collect(str(data["env"].get("device", "cuda"))))
    if diff:
        warn_once(f"{what} built for another environment: " + "; ".join(diff))
        return None
    return path, str((entry or {}).get("spec", {}).get("device", data["env"].get("device", "cuda"))), art


def _check_sha256(path: Path, expected: Any) -> None:
    """Raises ValueError when the file's sha256 is not the manifest's (OSError when it cannot be read)."""
    if _sha256(path) != expected:
        raise ValueError("sha256 differs from the manifest (corrupted or replaced)")


def aoti(name: str, artifacts: str | Path | None = None, quiet: bool = False) -> Any:
    """The variant's AOTInductor package, loaded (the exact shapes it was built for), or None when unusable
    (with a warning unless ``quiet``, and always when the environment differs). For a fwd+bwd variant, its
    forward and backward packages as one differentiable call (``TrainPackages``)."""
    found = _usable_file(name, "aoti", "AOTInductor package", artifacts, quiet)
    if found is None:
        return None
    path, _device, art = found
    bwd = art.get("backward_file")
    try:
        if not bwd:
            return load_package(path)
        bwd_path = path.with_name(str(bwd))
        _check_sha256(bwd_path, art.get("backward_sha256"))  # the pair is one artifact: both intact
        return TrainPackages(load_package(path), load_package(bwd_path))
    except Exception as exc:
        warn_once(f"variant {name}: AOTInductor package does not load: {exc}")
        return None


def precompiled_function(name: str, artifacts: str | Path | None = None, quiet: bool = False) -> Any:
    """The variant's precompiled function (``precompiled.attend`` for its inputs, forward and backward),
    loaded without compiling, or None when unusable (warnings as for ``aoti``)."""
    found = _usable_file(name, "precompiled", "precompiled function", artifacts, quiet)
    if found is None:
        return None
    path, device, _art = found
    try:
        return precompiled.load(path, trust_cpu_isa=device == "cpu")
    except Exception as exc:
        warn_once(f"variant {name}: precompiled function does not load: {type(exc).__name__}: {exc}")
        return None


def load_package(path: Path) -> Any:
    """Load an AOTInductor package: a callable ``fn(q, k, v)`` returning the package's outputs (a list).

    First through torch's C++ package loader directly (``torch._C._aoti.AOTIModelPackageLoader``): it only
    opens the archive and ``dlopen``s the compiled model, milliseconds, where ``aoti_load_package`` first
    imports ``torch._inductor`` (1.35 s on CI's CPU) and runs Inductor's CPU vector-ISA probe. That probe is
    only used there to warn when the package's recorded CPU ISA differs (attnforge's manifest checks the
    environment instead) and compiles and loads a test program per ISA, each in a fresh Python that imports
    torch: 8 s on CI's CPU, about 60 s on a 16-core H100 host (reports/gpu/run-h100-s4), CUDA packages included. A package
    whose call spec is not plain positional tensors, or a torch without that loader, goes through
    ``aoti_load_package`` with the probe skipped (``cpp.vec_isa_ok``; the ISA list is still filtered by the
    CPU's flags, and the answer is cached for the process as after a normal compile).
    """
    import torch

    raw = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if raw is not None:
        loader = raw(str(path), "model", False, 1, -1)
        if _positional_tensors_only(loader):
            return _PackageRunner(loader)
    from torch._inductor import config as inductor_config

    before = inductor_config.cpp.vec_isa_ok
    if before is None:
        inductor_config.cpp.vec_isa_ok = True
    try:
        return torch._inductor.aoti_load_package(str(path))
    finally:
        inductor_config.cpp.vec_isa_ok = before


def _positional_tensors_only(loader: Any) -> bool:
    """Whether the package is called as ``fn(t1, ..., tn)`` and returns a flat list (what FlexModule exports)."""
    from torch.utils import _pytree as pytree

    try:
        in_spec, out_spec = (pytree.treespec_loads(s) for s in loader.get_call_spec())
    except Exception:
        return False
    n = in_spec.num_leaves
    return bool(in_spec == pytree.tree_structure((tuple(range(n)), {})) and out_spec.num_leaves >= 1)


class _PackageRunner:
    """An AOTInductor package run through the C++ loader: positional tensors in, a list of tensors out."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __call__(self, *args: Any) -> Any:
        return self.loader.boxed_run(list(args))


class TrainPackages:
    """A fwd+bwd variant's two AOTInductor packages as one differentiable call ``fn(q, k, v) -> out``: the
    forward package gives ``(out, lse)``, the backward one ``(dq, dk, dv)`` from ``(q, k, v, grad_out, out,
    lse)`` (built by ``attnforge.flex.aoti_train``)."""

    backward = True

    def __init__(self, fwd: Any, bwd: Any) -> None:
        self.fwd = fwd
        self.bwd = bwd
        self._fn: Any = None

    def __call__(self, q: Any, k: Any, v: Any) -> Any:
        if self._fn is None:
            self._fn = _autograd_function(self.fwd, self.bwd)
        return self._fn.apply(q, k, v)


def _autograd_function(fwd: Any, bwd: Any) -> Any:
    import torch

    class FlexPackages(torch.autograd.Function):  # type: ignore[misc, unused-ignore]
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any) -> Any:
            out, lse = fwd(q, k, v)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = bwd(q, k, v, grad_out.contiguous(), out, lse)
            return dq, dk, dv

    return FlexPackages
