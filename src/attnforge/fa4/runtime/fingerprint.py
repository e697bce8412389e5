"""FA4's persistent-cache fingerprint, computed as ``flash_attn/cute/cache_utils.py`` computes it.

FA4 keeps compiled kernels under ``<cache dir>/<fingerprint>/<kind>/<sha256 of the compile key>.o``; the
fingerprint hashes the Python minor, the ``cutlass`` and ``tvm_ffi`` versions, then every ``.py`` file under
``flash_attn/cute`` (relative path, length, bytes) in sorted order. The same walk without the three version
stamps (``sources_digest``) tells, when a fingerprint differs, whether FA4's sources are what changed.
Standard library only: it runs where neither FA4 nor CUDA is importable.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def _feed_sources(h: hashlib._Hash, root: Path) -> None:
    for src in sorted(root.rglob("*.py")):
        if not src.is_file():
            continue
        h.update(src.relative_to(root).as_posix().encode())
        content = src.read_bytes()
        h.update(len(content).to_bytes(8, "little"))
        h.update(content)


def fingerprint(root: Path, python: str, cutlass: str, tvm_ffi: str) -> str:
    """The directory name FA4 (``_compute_source_fingerprint``) files its cache entries under.

    ``root`` is the installed ``flash_attn/cute`` folder, ``python`` the minor version (``3.12``)."""
    h = hashlib.sha256()
    h.update(f"py{python}".encode())
    h.update(f"cutlass={cutlass}".encode())
    h.update(f"tvm_ffi={tvm_ffi}".encode())
    _feed_sources(h, root)
    return h.hexdigest()


def sources_digest(root: Path) -> str:
    """sha256 over FA4's ``.py`` sources alone (the same walk as the fingerprint)."""
    h = hashlib.sha256()
    _feed_sources(h, root)
    return h.hexdigest()
