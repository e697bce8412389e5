"""Precompiled FlexAttention functions: ``torch.compile(...).aot_compile`` saved to a file and loaded back.

A precompiled function holds what a cold first call would produce (Dynamo's bytecode and guards, the
AOTAutograd forward *and* backward graphs, Inductor's kernels), so loading it skips tracing and every cache
lookup. It is the fwd+bwd fallback where a variant's forward and backward AOTInductor packages
(``attnforge.flex.aoti_train``) do not build; a Mega-Cache still re-traces with Dynamo. Loading imports torch's
compile stack (about 2.5 s on a 16-core H100 host), the floor of this path. Needs torch >= 2.10 (``aot_compile``);
``supported()`` says whether this torch has it. Guards on shapes and dtypes are kept: a call with other
inputs raises ``GuardMismatch`` and the caller compiles as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

# guard kinds that hold object identities or dict versions of the building process: never serializable
_PROCESS_LOCAL = ("ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION")
# the loader's import name in the attnforge-flex-kernels wheel
WHEEL_PACKAGE = "attnforge_flex"


def wheel_package(*, source_first: bool) -> Any:
    """This loader package under the wheel's import name (``attnforge_flex``), imported when needed.

    A saved function's guards name the modules of the functions they hold (``attend``, the mask and score
    mods) and import them at load. Built from attnforge's sources those would be ``attnforge.flex.runtime.*``,
    which a machine with only the wheel lacks (CI found it). So functions are built with this package loaded
    under the wheel's name (``source_first``: always this source folder, never an installed wheel), and loaded
    with that name importable: the wheel itself, an installed wheel, or else this folder under that name.
    """
    import importlib
    import importlib.util
    import sys

    if WHEEL_PACKAGE in sys.modules:
        return sys.modules[WHEEL_PACKAGE]
    if not source_first and importlib.util.find_spec(WHEEL_PACKAGE) is not None:
        return importlib.import_module(WHEEL_PACKAGE)
    here = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location(
        WHEEL_PACKAGE, here / "__init__.py", submodule_search_locations=[str(here)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {here} as {WHEEL_PACKAGE}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[WHEEL_PACKAGE] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[WHEEL_PACKAGE]
        raise
    return mod


class GuardMismatch(RuntimeError):
    """The inputs differ from those the function was precompiled for (shape, dtype, device, grad)."""


def supported() -> str | None:
    """None when this torch can precompile and load functions, else the reason it cannot."""
    import torch

    if not hasattr(torch.compiler, "load_compiled_function"):
        return f"torch {torch.__version__} has no torch.compiler.load_compiled_function (needs >= 2.10)"
    with _aot_compile_enabled(torch):
        if not hasattr(torch.compile(attend), "aot_compile"):
            return f"torch {torch.__version__}: torch.compile(...) has no aot_compile"
    return None


def _aot_compile_enabled(torch: Any) -> Any:
    """torch 2.10/2.11 only offer ``aot_compile`` under ``torch._dynamo.config.enable_aot_compile``."""
    import contextlib

    cfg = torch._dynamo.config
    return (
        cfg.patch(enable_aot_compile=True) if hasattr(cfg, "enable_aot_compile") else contextlib.nullcontext()
    )


def guard_filter(entries: Sequence[Any]) -> list[bool]:
    """Keep the guards a saved function can check in another process: tensor shapes, dtypes, devices and
    constants; drop globals and guards on process-local identities (pytree registries, closures)."""
    keep = []
    for e in entries:
        derived = tuple(getattr(e, "derived_guard_types", ()) or ())
        local = e.guard_type in _PROCESS_LOCAL or any(d in _PROCESS_LOCAL for d in derived)
        keep.append(not (local or e.is_global))
    return keep


def attend(
    q: Any, k: Any, v: Any, block_mask: Any, score_mod: Any, enable_gqa: bool, scale: float | None = None
) -> Any:
    """The function that is precompiled: module level, so its saved form names no local object."""
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(
        q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa, scale=scale
    )


def compile_and_save(
    example: tuple[Any, ...], out: str | Path, *, dynamic: bool = False, mode: str = "default"
) -> Callable[..., Any]:
    """``aot_compile`` ``attend`` for the example arguments ``(q, k, v, block_mask, score_mod, gqa, scale)``, write
    it to ``out`` and return the compiled function (call it to check it)."""
    import torch

    why = supported()
    if why:
        raise RuntimeError(why)
    if mode != "default":
        raise ValueError(f"compile mode {mode!r} is not precompiled (default mode only)")
    with _aot_compile_enabled(torch):
        compiled = torch.compile(
            attend, fullgraph=True, dynamic=dynamic, options={"guard_filter_fn": guard_filter}
        )
    fn = cast(Any, compiled).aot_compile((example, {}))  # torch >= 2.10; `supported()` checked that
    fn.save_compiled_function(str(out))
    return _Checked(fn)


def load(path: str | Path, *, trust_cpu_isa: bool = False) -> Callable[..., Any]:
    """Load a precompiled function. Raises on a torch without support or a broken file.

    ``trust_cpu_isa``: skip Inductor's vector-ISA probe (it compiles test programs, seconds) because the
    recorded CPU capability already matched this CPU's; CPU kernels are still compiled from C++ at load.
    """
    import torch
    from torch._guards import TracingContext, tracing
    from torch._inductor import config as inductor_config
    from torch._subclasses.fake_tensor import FakeTensorMode

    why = supported()
    if why:
        raise RuntimeError(why)
    wheel_package(source_first=False)  # the modules the saved guards name
    before = inductor_config.cpp.vec_isa_ok
    if trust_cpu_isa and before is None:
        inductor_config.cpp.vec_isa_ok = True
    try:
        # unpickling some guard sources installs guards, which needs a tracing context (torch 2.13)
        with open(path, "rb") as fh, tracing(TracingContext(FakeTensorMode())):
            fn = torch.compiler.load_compiled_function(fh)
    finally:
        inductor_config.cpp.vec_isa_ok = before
    return _Checked(fn)


class _Checked:
    """Turns the loaded function's guard failure into ``GuardMismatch``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.check = getattr(fn, "guard_check", None)
        if self.check is not None and hasattr(fn, "disable_guard_check"):
            fn.disable_guard_check()  # checked here instead, once per call

    def __call__(self, *args: Any) -> Any:
        if self.check is not None and not self.check(*args):
            raise GuardMismatch("inputs differ from those the function was precompiled for")
        return self.fn(*args)
