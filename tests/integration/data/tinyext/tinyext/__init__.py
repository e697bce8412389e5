"""tinyext: attnforge's test extension (x + 1 and x * 2 on CUDA tensors)."""

from tinyext_cuda import add_one, times_two

__all__ = ["add_one", "times_two"]
