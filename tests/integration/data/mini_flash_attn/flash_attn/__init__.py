"""Test fixture shaped like flash-attn: the real package's layout, not its kernels."""

__version__ = "2.8.3"

from flash_attn.flash_attn_interface import add_one, build_info  # noqa: F401
