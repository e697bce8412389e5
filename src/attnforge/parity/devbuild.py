"""Build a flash-attn wheel on a GPU machine that has torch but no network (the parity/benchmark bench).

Drives attnforge's own cell builder (``attnforge/build/incontainer.py``) with a spec, after preparing the
(python, torch) venv it expects from the machine's torch (``--system-site-packages``: nothing to download),
then writes a contract-shaped ``<wheel>.manifest.json`` beside the wheel so the parity run reads the profile
from it and records its outcome there. Standard library only::

    python -m attnforge.parity.devbuild --sdist flash_attn-2.8.3.tar.gz --out dist \\
        --head-dims 128 --dtypes bf16,fp16 --arches sm_90 --max-jobs 16 --tag hd128
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

INCONTAINER = Path(__file__).resolve().parents[1] / "build" / "incontainer.py"
VENV_MARKER = ".attnforge-venv.json"
DEFAULT_REQS = ["setuptools>=77", "wheel", "packaging", "ninja"]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def torch_facts(python: str) -> dict[str, Any]:
    code = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
            "'abi': bool(torch._C._GLIBCXX_USE_CXX11_ABI)}))")  # fmt: skip
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def prepare_venv(venv: Path, python: str, spec: dict[str, Any]) -> None:
    """A venv over the machine's torch, marked so the builder reuses it instead of pip-installing torch."""
    from .venv import make_venv

    make_venv(venv, python)
    torch_req = spec.get("torch_requirement") or f"torch=={spec['torch']}"
    want = {"python": python, "requirements": [torch_req, *spec["extra_requirements"]],
            "pip_args": list((spec.get("pip") or {}).get("args") or [])}  # fmt: skip
    (venv / VENV_MARKER).write_text(json.dumps({"want": want}), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="attnforge.parity.devbuild", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--sdist", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path, help="where the wheel and its manifest go")
    ap.add_argument("--work", type=Path, default=Path("/tmp/attnforge-devbuild"))
    ap.add_argument("--python", default=sys.executable, help="interpreter whose torch to build against")
    ap.add_argument("--head-dims", default="", help="comma list (empty = all)")
    ap.add_argument("--dtypes", default="", help="comma list of fp16,bf16 (empty = both)")
    ap.add_argument("--disable", default="", help="comma list: backward,dropout,alibi,softcap,uneven_k,local")
    ap.add_argument("--arches", default="sm_90")
    ap.add_argument("--max-jobs", type=int, default=0)
    ap.add_argument("--nvcc-threads", type=int, default=2)
    ap.add_argument("--tag", default="", help="profile tag for the local version (empty = full)")
    ap.add_argument(
        "--profile", default="", help="profile name recorded in the manifest (default: tag or full)"
    )
    a = ap.parse_args(argv)
    facts = torch_facts(a.python)
    tv = facts["torch"].split("+")[0]
    cuda = str(facts["cuda"] or "0.0")
    cu = "cu" + cuda.replace(".", "")
    local = f"{cu}torch{'.'.join(tv.split('.')[:2])}cxx11abi{'TRUE' if facts['abi'] else 'FALSE'}"
    if a.tag:
        local += f".{a.tag}"
    head_dims = [int(x) for x in a.head_dims.split(",") if x]
    dtypes = [x for x in a.dtypes.split(",") if x]
    disable = [x.strip().upper() for x in a.disable.split(",") if x.strip()]
    flags = [f"-DFLASHATTENTION_DISABLE_{d}" for d in disable]
    arches = [x for x in a.arches.split(",") if x]
    work = a.work.resolve()
    out = a.out.resolve()
    spec: dict[str, Any] = {
        "schema": 1, "cell_id": f"flash-attn-2.8.3-{cu}-torch{tv}-devbuild-{a.tag or 'full'}",
        "kernel": "flash-attn", "kernel_version": "2.8.3",
        "source": {"path": str(a.sdist.resolve()), "sha256": sha256(a.sdist), "url": None},
        "python": a.python, "torch": tv, "extra_requirements": DEFAULT_REQS,
        "build_dir": str(work / "build"), "venv_dir": str(work / "venv"), "output_dir": str(out),
        "arches": arches, "cxx11_abi": bool(facts["abi"]), "local_version": local,
        "patches": [], "profile_flags": flags, "head_dims": head_dims or None, "dtypes": dtypes or None,
        "backward": "BACKWARD" not in disable, "max_jobs": a.max_jobs or None, "nvcc_threads": a.nvcc_threads,
    }  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    prepare_venv(Path(spec["venv_dir"]), a.python, spec)
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    t0 = time.time()
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    rc = subprocess.call([sys.executable, str(INCONTAINER), "--spec", str(spec_path)])
    wall = time.time() - t0
    result_path = out / "result.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    if rc != 0 or not result.get("wheel"):
        print(f"devbuild: build failed (exit {rc}): {result.get('error')}", file=sys.stderr)
        return rc or 4
    wheel = Path(result["wheel"])
    manifest = {
        "schema": 1, "cell_id": spec["cell_id"], "variant": f"{cu}-torch{'.'.join(tv.split('.')[:2])}",
        "kernel": "flash-attn", "kernel_version": "2.8.3", "wheel": wheel.name, "sha256": sha256(wheel),
        "size": wheel.stat().st_size,
        "inputs": {"source": "pypi-sdist", "source_sha256": spec["source"]["sha256"], "toolkit": f"cuda{cuda}",
                   "torch": tv, "torch_variant": cu, "python": ".".join(platform.python_version_tuple()[:2]),
                   "cxx11_abi": spec["cxx11_abi"], "arches": arches, "profile": a.profile or a.tag or "full",
                   "profile_flags": flags, "head_dims": head_dims or None, "dtypes": dtypes or None,
                   "patches": result.get("patches_applied", [])},
        "kernel_set_key": None, "input_hash": None, "toolchain": result.get("toolchain", {}),
        "build": {"backend": "devbuild", "image": None, "started": started,
                  "wall_s": round(wall, 1), "max_jobs": result.get("max_jobs"),
                  "nvcc_threads": result.get("nvcc_threads"), "peak_rss_gb": result.get("peak_tree_rss_gb"),
                  "units_total": result.get("units_total"), "units_compiled": result.get("units_compiled"),
                  "units_reused": result.get("units_reused"), "oom_retries": 0},
        "platform_tag": {"tag": "linux_x86_64", "reason": "as built"},
        "parity": None,
    }  # fmt: skip
    mpath = wheel.with_name(wheel.name + ".manifest.json")
    mpath.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(f"devbuild: {wheel} ({wheel.stat().st_size / 1e6:.1f} MB) in {wall:.0f} s; manifest {mpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
