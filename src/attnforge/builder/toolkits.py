"""Toolkit spellings, one home: CUDA "13.0" <-> PyTorch's variant "cu130", ROCm "6.4" <-> "rocm6.4", and
the matrix's toolkit names ("cuda13.0", "rocm6.4"). Stdlib only (the builder reads torch variants too,
inside build containers); the host imports them through `attnforge.names`."""

from __future__ import annotations


def cuda_variant(version: str) -> str:
    """PyTorch's variant of a CUDA version: "13.0" (or "13.0.88") -> "cu130"."""
    major, _, rest = version.partition(".")
    return f"cu{major}{rest.split('.')[0] or '0'}"


def cuda_of_variant(variant: str) -> str | None:
    """The CUDA version of a PyTorch variant: "cu130" -> "13.0", "cu128" -> "12.8"; None for others."""
    digits = variant[2:]
    if not variant.startswith("cu") or len(digits) < 2 or not digits.isdigit():
        return None
    return f"{digits[:-1]}.{digits[-1]}"


def rocm_variant(version: str) -> str:
    """PyTorch's variant of a ROCm/HIP version: "6.4" (or "6.4.43482") -> "rocm6.4"."""
    return "rocm" + ".".join(version.split(".")[:2])


def toolkit_variant(toolkit: str) -> str | None:
    """A matrix toolkit's PyTorch variant: "cuda13.0" -> "cu130", "rocm6.4" -> "rocm6.4"; None for others."""
    if toolkit.startswith("cuda"):
        return cuda_variant(toolkit[4:])
    if toolkit.startswith("rocm"):
        return toolkit
    return None


def toolkit_of_variant(variant: str) -> str | None:
    """A PyTorch variant's matrix toolkit: "cu130" -> "cuda13.0", "rocm6.4" -> "rocm6.4"; None for others."""
    cuda = cuda_of_variant(variant)
    if cuda is not None:
        return f"cuda{cuda}"
    return variant if variant.startswith("rocm") else None
