"""No line in the client: the wheel's ``attnforge_fa4.pth`` imports this module at interpreter start.

It sets ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` unless the environment already says otherwise, and adds
a post-import hook (nothing is imported early, FA4 and torch included): right after FA4's ``cache_utils`` is
imported, the installed FA4's fingerprint is compared with the manifest's and, if equal, the entries are
copied into FA4's cache folder (``seed``); right after FA4's ``interface`` is imported, its device-arch
lookup is wrapped so that a GPU the kernels were not built for warns once. ``ATTNFORGE_FA4=0`` turns all of
it off. A failure warns and leaves FA4 as it is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path
from typing import Any

from . import _STATS, check, python_minor, read_manifest, seed, warn_once

OFF_ENV = "ATTNFORGE_FA4"
FA4_ENABLED_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
CACHE_UTILS = "flash_attn.cute.cache_utils"
INTERFACE = "flash_attn.cute.interface"


def after_cache_utils(mod: Any) -> None:
    """Check the installed FA4's fingerprint against the manifest; seed FA4's cache folder when they match."""
    manifest = read_manifest()
    if not getattr(mod, "CUTE_DSL_CACHE_ENABLED", False):
        warn_once(
            "disabled",
            f"attnforge_fa4: {FA4_ENABLED_ENV} is not 1, so FA4 does not read its persistent cache and the "
            "precompiled kernels are not used; FA4 compiles at the first call as usual",
        )
        return
    root = Path(mod.__file__).resolve().parent
    result = check(
        manifest,
        root,
        python_minor(),
        str(mod.cutlass.__version__),
        str(mod.tvm_ffi.__version__),
        actual=str(mod._compute_source_fingerprint()),
    )
    _STATS["fingerprint"] = "match" if result.ok else "stale"
    if not result.ok:
        warn_once(
            "stale",
            f"attnforge_fa4: the precompiled FA4 kernels do not fit this environment ({result.reason}); "
            "FA4 compiles at the first call as usual",
        )
        return
    seed(Path(mod.get_cache_path()))


def after_interface(mod: Any) -> None:
    """Wrap FA4's ``_get_device_arch`` so a GPU arch the kernels were not built for warns once."""
    original = getattr(mod, "_get_device_arch", None)
    built = read_manifest().get("env", {}).get("arch")
    if original is None or built is None:
        return

    def device_arch(*args: Any, **kwargs: Any) -> Any:
        arch = original(*args, **kwargs)
        if arch != built:
            warn_once(
                "arch",
                f"attnforge_fa4: the precompiled FA4 kernels were built for sm_{built}, this GPU is sm_{arch}; "
                "FA4 compiles at the first call as usual",
            )
        return arch

    for attr in ("cache_clear", "cache_info"):
        if hasattr(original, attr):
            setattr(device_arch, attr, getattr(original, attr))
    mod._get_device_arch = device_arch


HOOKS = {CACHE_UTILS: after_cache_utils, INTERFACE: after_interface}
_DONE: set[str] = set()


def run_hook(name: str, mod: Any) -> None:
    """Run the hook of module ``name`` once; any failure becomes one warning."""
    if name in _DONE:
        return
    _DONE.add(name)
    try:
        HOOKS[name](mod)
    except Exception as exc:  # never break FA4's import
        warn_once(f"hook-{name}", f"attnforge_fa4: {name}: {type(exc).__name__}: {exc}; FA4 is left as it is")


class _Loader(importlib.abc.Loader):
    """The module's own loader, then its hook."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        run_hook(self.name, module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the hooked FA4 modules (found by the other finders)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


def install() -> bool:
    """Turn FA4's persistent cache on (unless set) and add the hook; False when ``ATTNFORGE_FA4=0``.

    FA4 modules imported already get their hook at once."""
    if os.environ.get(OFF_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    os.environ.setdefault(FA4_ENABLED_ENV, "1")
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in HOOKS:
        if name in sys.modules:
            run_hook(name, sys.modules[name])
    return True


install()
