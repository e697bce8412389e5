"""Check a built aarch64 wheel and record it: ELF machine, the GPU code in it, its platform tag, and (where an arm64
container runs here, through qemu-user-static in binfmt_misc) whether it imports beside torch.

    python benchmarks/build_aarch64.py --wheel wheels/flash_attn-...-linux_aarch64.whl \
        --cuobjdump PATH --command "nox -s build-wheels -- --cell ..." [--import-wheel W --image IMG --site DIR] \
        --out benchmarks/results/build_aarch64.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

IMPORT_CHECK = (
    "import sys, torch, flash_attn, flash_attn_2_cuda, platform; "
    "print('IMPORT-OK', platform.machine(), sys.version.split()[0], torch.__version__, flash_attn.__version__, "
    "flash_attn_2_cuda.__file__)"
)


def run(cmd: list[str]) -> str:
    """stdout+stderr of a command (it must succeed)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout + proc.stderr


def extension(wheel: Path, into: Path) -> Path:
    """The wheel's compiled extension, unpacked."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".so")]
        if len(names) != 1:
            raise SystemExit(f"{wheel.name}: expected one .so, found {names}")
        return Path(zf.extract(names[0], into))


def gpu_code(so: Path, cuobjdump: str) -> dict[str, list[str]]:
    """The cubins' and PTX's arches in an extension (`cuobjdump --list-elf/--list-ptx`)."""

    def arches(flag: str) -> list[str]:
        out = run([cuobjdump, flag, str(so)])
        return sorted(
            {part for line in out.splitlines() for part in line.split(".") if part.startswith("sm_")}
        )

    return {"elf": arches("--list-elf"), "ptx": arches("--list-ptx")}


def import_in_container(image: str, wheel: Path, site: Path) -> tuple[bool, str]:
    """Unpack the wheel beside torch's aarch64 install (`site`) in an arm64 container and import it."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp)
        # no --platform: docker 20.10 cannot record arm64 on an imported rootfs; binfmt_misc runs its binaries
        cmd = ["docker", "run", "--rm", "-v", f"{tmp}:/opt/fa:ro"]
        cmd += [
            "-v",
            f"{site}:/opt/site:ro",
            "-e",
            "PYTHONPATH=/opt/fa:/opt/site",
            image,
            "python3",
            "-c",
            IMPORT_CHECK,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0 and "IMPORT-OK" in out, out.splitlines()[
        -1
    ] if out else f"exit {proc.returncode}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, required=True)
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("--command", required=True, help="the build command, recorded as given")
    ap.add_argument("--route", default="cross-compiled on x86-64 (builder/cross.py, docker backend)")
    ap.add_argument("--import-wheel", type=Path, help="the wheel to import (default: --wheel)")
    ap.add_argument("--image", help="an arm64 image with python3 (its Python must match --import-wheel)")
    ap.add_argument("--site", type=Path, help="torch's aarch64 install for that Python (pip --target)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    manifest = json.loads(args.wheel.with_name(args.wheel.name + ".manifest.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        so = extension(args.wheel, Path(tmp))
        machine = next(
            ln.split(":", 1)[1].strip()
            for ln in run(["readelf", "-h", str(so)]).splitlines()
            if "Machine" in ln
        )
        code = gpu_code(so, args.cuobjdump)
    audit = run([sys.executable, "-m", "auditwheel", "show", str(args.wheel)])
    tag = next((w.strip('".,') for w in audit.split() if w.strip('".,').startswith("manylinux_")), None)
    result: dict[str, Any] = {
        "cell": manifest["cell_id"],
        "wheel": args.wheel.name,
        "route": args.route,
        "wall_s": (manifest.get("build") or {}).get("wall_s"),
        "arches_in_binary": code,
        "elf_machine": machine,
        "platform_tag": tag,
        "auditwheel_show": " ".join(audit.split())[:600],
        "import_ok": None,
        "command": args.command,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, 2 cores, 24 GiB, Debian 12, no GPU, Docker 20.10; shared with other builds",
    }
    if args.image and args.site:
        target = args.import_wheel or args.wheel
        ok, line = import_in_container(args.image, target, args.site)
        result.update(import_ok=ok, import_wheel=target.name, import_output=line, import_image=args.image)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
