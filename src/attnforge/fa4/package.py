"""Package FA4 persistent-cache entries as the ``attnforge-fa4-kernels`` wheel (standard library only).

The wheel holds ``attnforge_fa4`` (``attnforge.fa4.runtime`` copied verbatim), its ``artifacts/`` (the
manifest and ``cache/<kind>/<hash>.o``) and ``attnforge_fa4.pth``. It pins exactly what FA4's cache
fingerprint depends on: the ``flash-attn-4`` release (its sources), ``nvidia-cutlass-dsl`` and
``apache-tvm-ffi`` (their versions), the Python minor (``Requires-Python`` and the ``py3X`` tag), plus what
the compiled objects were made with and the fingerprint does not see: the cutlass-dsl libraries of the CUDA
major and ``quack-kernels``. Its local version names FA4, the CUDA major and the arch
(``0.1.0+fa4v4.0.0b36.cu13.sm90``). Written directly with ``zipfile`` (fixed timestamps, sorted entries), so
it is built on a bare GPU host too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import zipfile
from pathlib import Path
from typing import Any

from attnforge.matrix import fa4_cells

DIST_NAME = fa4_cells.WHEEL_DIST
IMPORT_NAME = "attnforge_fa4"
PTH_NAME = "attnforge_fa4.pth"
PTH = "import attnforge_fa4._auto\n"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
# distributions pinned to the build's versions (dist name -> the manifest's "pins" key)
PINNED = ("flash-attn-4", "nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels")


class PackageError(ValueError):
    """The artifacts cannot be packaged (what is missing or wrong, naming the folder)."""


def wheel_version(manifest: dict[str, Any]) -> str:
    """``0.1.0+fa4v4.0.0b36.cu13.sm90``."""
    env = manifest["env"]
    return fa4_cells.wheel_version(str(env["flash_attn_4"]), env["cuda_major"], env["arch"])


def requirements(manifest: dict[str, Any]) -> list[str]:
    """``Requires-Dist`` lines: every fingerprint input and build input pinned to the build's version."""
    pins = manifest["env"]["pins"]
    missing = [d for d in PINNED if d not in pins]
    if missing:
        raise PackageError(f"the manifest's env.pins lacks {', '.join(missing)}")
    out = [f"{d}=={pins[d]}" for d in PINNED]
    libs = f"nvidia-cutlass-dsl-libs-cu{manifest['env']['cuda_major']}"
    if libs in pins:
        out.append(f"{libs}=={pins[libs]}")
    return out


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _members(artifacts: Path, manifest: dict[str, Any]) -> dict[str, bytes]:
    runtime = Path(__file__).resolve().parent / "runtime"
    files: dict[str, bytes] = {}
    for src in sorted(runtime.glob("*.py")):
        files[f"{IMPORT_NAME}/{src.name}"] = src.read_bytes()
    files[f"{IMPORT_NAME}/py.typed"] = b""
    files[f"{IMPORT_NAME}/artifacts/manifest.json"] = (artifacts / "manifest.json").read_bytes()
    for rel, meta in sorted(manifest["entries"].items()):
        path = artifacts / "cache" / rel
        if not path.is_file():
            raise PackageError(f"{artifacts}: the manifest lists cache/{rel}, which is missing")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            raise PackageError(f"{artifacts}: cache/{rel} does not match its sha256 in the manifest")
        files[f"{IMPORT_NAME}/artifacts/cache/{rel}"] = data
    files[PTH_NAME] = PTH.encode()
    return files


def _metadata(manifest: dict[str, Any], version: str) -> str:
    env = manifest["env"]
    names = ", ".join(d["name"] for d in manifest.get("declarations", []) if d.get("entries"))
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {DIST_NAME}",
        f"Version: {version}",
        f"Summary: FlashAttention-4 kernels compiled ahead of time by attnforge ({names})",
        f"Requires-Python: =={env['python']}.*",
        *(f"Requires-Dist: {r}" for r in requirements(manifest)),
        "Description-Content-Type: text/markdown",
        "",
        f"FA4 persistent-cache entries built on {env.get('gpu')} (sm_{env['arch']}), torch {env.get('torch')}, "
        f"CUDA {env.get('cuda')}, Python {env['python']}, fingerprint {manifest['fingerprint'][:16]}.",
        "Installed, FA4 finds them at its first call (no line in the caller); another environment warns once",
        "and FA4 compiles as usual. `ATTNFORGE_FA4=0` turns it off.",
        "",
    ]
    return "\n".join(lines)


def build_wheel(artifacts: Path, dist: Path) -> Path:
    """Write the wheel for ``artifacts`` (a manifest.json and cache/) into ``dist``; returns its path."""
    try:
        manifest = json.loads((artifacts / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PackageError(f"{artifacts}: no readable manifest.json ({exc})") from None
    for key in ("fingerprint", "env", "entries"):
        if key not in manifest:
            raise PackageError(f"{artifacts}/manifest.json has no {key!r}")
    if not manifest["entries"]:
        raise PackageError(f"{artifacts}: no cache entries to package (did every declaration fail?)")
    version = wheel_version(manifest)
    py_tag = "py" + str(manifest["env"]["python"]).replace(".", "")
    stem = f"{DIST_NAME.replace('-', '_')}-{version}"
    dist_info = f"{stem}.dist-info"
    files = _members(artifacts, manifest)
    files[f"{dist_info}/METADATA"] = _metadata(manifest, version).encode()
    files[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: attnforge\nRoot-Is-Purelib: true\nTag: {py_tag}-none-any\n"
    ).encode()
    files[f"{dist_info}/top_level.txt"] = f"{IMPORT_NAME}\n".encode()
    record = [f"{name},{_record_hash(data)},{len(data)}" for name, data in files.items()]
    files[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    dist.mkdir(parents=True, exist_ok=True)
    target = dist / f"{stem}-{py_tag}-none-any.whl"
    tmp = target.with_name(target.name + ".tmp")
    lib = sorted(n for n in files if not n.startswith(dist_info))
    meta = sorted(n for n in files if n.startswith(dist_info))
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in lib + meta:
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            zf.writestr(info, files[name])
    tmp.replace(target)
    return target
