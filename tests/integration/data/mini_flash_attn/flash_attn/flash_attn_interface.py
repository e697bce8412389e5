"""Calls into the compiled extension, as upstream's flash_attn_interface does."""

import torch  # noqa: F401, I001  (libtorch and libc10 must be loaded before the extension)
import flash_attn_2_cuda as _ext


def add_one(x):
    """x + 1, computed by the compiled extension (a CUDA kernel for CUDA tensors)."""
    return _ext.add_one(x)


def build_info():
    """What the extension was compiled with: 'cuda' or 'cpu'."""
    return _ext.build_info()
