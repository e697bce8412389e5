"""attnforge's STAND-IN for the flash-attn that NGC bundles: a small real wheel, no kernels."""

import os

from setuptools import setup

setup(
    name="flash_attn",
    version=os.environ.get("FAKE_FLASH_ATTN_VERSION", "2.7.4+standin"),
    description="attnforge NGC stand-in: fake bundled flash-attn (pure Python, no kernels)",
    packages=["flash_attn"],
    py_modules=["flash_attn_2_cuda"],
    python_requires=">=3.8",
)
