"""Fresh venvs that reuse a machine's torch, and installing the wheel under test into one. Stdlib only.

``--system-site-packages`` alone is not enough when the machine's Python is itself a venv (e.g. a
GPU host whose torch lives in ``/opt/torch/.venv``): the new venv would see the base interpreter's packages, not torch. A ``.pth`` file
naming the parent's site-packages fixes that; the parent stays read-only and packages installed into the new
venv shadow the parent's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PTH_NAME = "_attnforge_parent_site.pth"


def site_packages(python: str) -> list[str]:
    code = "import json, site, sys; print(json.dumps(site.getsitepackages() + [site.getusersitepackages()]))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return [p for p in json.loads(out.strip().splitlines()[-1]) if Path(p).is_dir()]


def make_venv(path: Path, python: str = sys.executable) -> Path:
    """Create ``path`` (if absent) over ``python``'s packages; returns the venv's interpreter."""
    vpy = path / "bin" / "python"
    if not vpy.exists():
        subprocess.run([python, "-m", "venv", "--system-site-packages", str(path)], check=True)
    parent = site_packages(python)
    own = site_packages(str(vpy))
    target = next((p for p in own if p.startswith(str(path))), None)
    if target:
        lines = [p for p in parent if not p.startswith(str(path))]
        (Path(target) / PTH_NAME).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return vpy


def install(vpy: Path, wheels: list[Path], find_links: list[Path] | None = None) -> None:
    """Install the wheels offline, without dependencies (torch comes from the parent)."""
    cmd = [str(vpy), "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir", "--force-reinstall"]
    for fl in find_links or []:
        cmd += ["--find-links", str(fl)]
    subprocess.run([*cmd, *map(str, wheels)], check=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m attnforge.parity.venv PATH [WHEEL ...]``: make the venv, install the wheels, print its python."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m attnforge.parity.venv VENV [WHEEL ...]", file=sys.stderr)
        return 2
    vpy = make_venv(Path(args[0]))
    if args[1:]:
        install(vpy, [Path(w) for w in args[1:]])
    print(vpy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
