"""attnforge NGC stand-in: the fake flash-attn the stand-in base bundles (no kernels)."""

from importlib.metadata import version as _version

__version__ = _version("flash_attn")
STANDIN = True
