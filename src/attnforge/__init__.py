"""attnforge: prebuilt, tested attention-kernel wheels and images from one version matrix."""

__version__ = "0.1.0"
