"""Zero lines in the client: with ``ATTNFORGE_FLEX_AUTO=1`` in the environment (an image's ``ENV``), the
wheel's ``attnforge_flex.pth`` imports this module at interpreter start, and it enables attnforge for
transformers and diffusers right after their attention registries are imported (a post-import hook; nothing
is imported early, torch included). Without the variable it does nothing. A failure warns and leaves the
client as it is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import warnings
from typing import Any

from . import enable

ENV = "ATTNFORGE_FLEX_AUTO"
# module whose import completes the client's registry -> the client enable() serves
TARGETS = {"transformers.modeling_utils": "transformers", "diffusers.models.attention_dispatch": "diffusers"}


class _Loader(importlib.abc.Loader):
    """The module's own loader, then ``attnforge_flex.enable([client])``."""

    def __init__(self, loader: Any, client: str) -> None:
        self.loader = loader
        self.client = client

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        try:
            enable([self.client])
        except Exception as exc:  # never break the client's import
            warnings.warn(f"attnforge_flex: {ENV}: enabling {self.client} failed: {exc}", stacklevel=2)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the ``TARGETS`` modules (found by the other finders)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        client = TARGETS.get(name)
        if client is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, client)
                return spec
        return None


def install() -> bool:
    """Add the hook when ``ATTNFORGE_FLEX_AUTO`` is set (1, true, yes); whether it was added."""
    if os.environ.get(ENV, "").strip().lower() not in ("1", "true", "yes"):
        return False
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return True


install()
