"""One stable-ABI flash-attn wheel file, imported under several (Python, torch) pairs on a CPU-only machine.

For each pair: a fresh venv of that Python, torch and its CUDA libraries installed from a folder of
downloaded wheels (`pip download torch==X`; no index is reached), the wheel under test installed with
`--no-deps`, then in that venv: `import flash_attn, flash_attn_2_cuda`, the ops registered under
`torch.ops.flash_attn_stable`, and `flash_attn_func` traced on meta tensors through the registered fakes
(forward and backward shapes). No GPU is needed. Writes one JSON record per pair and the wheel's sha256.

    python scripts/stable_abi_imports.py --wheel W --wheels DL --pair python3.13:2.14.1 --pair python3.10:2.13.0 \
        --out reports/cpu/stable_abi_imports.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = """
import json, torch, flash_attn, flash_attn_2_cuda
ops = sorted(n for n in ("fwd", "varlen_fwd", "bwd", "varlen_bwd", "fwd_kvcache")
             if hasattr(torch.ops.flash_attn_stable, n))
q = torch.empty(2, 128, 8, 128, device="meta", dtype=torch.bfloat16, requires_grad=True)
out = flash_attn.flash_attn_func(q, q, q, causal=True)
out.sum().backward()
raw = torch.ops.flash_attn_stable.fwd(q.detach(), q.detach(), q.detach(), None, None, 0.0, 0.088, True, -1, -1,
                                      0.0, False, None)
print(json.dumps({"op_fake_out": [list(t.shape) for t in raw[:2]], "torch": torch.__version__, "flash_attn": flash_attn.__version__, "ops": ops,
                  "meta_out": list(out.shape), "meta_grad": list(q.grad.shape),
                  "extension": flash_attn_2_cuda.__file__.rsplit("/", 1)[-1]}))
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_pair(python: str, torch_version: str, wheel: Path, wheels: Path, work: Path) -> dict[str, object]:
    """Install and probe one (Python, torch) pair; the venv is removed afterwards."""
    interp = shutil.which(python) or python
    version = subprocess.run(
        [interp, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    venv = work / f"py{version}-torch{torch_version}"
    t0 = time.monotonic()
    subprocess.run([interp, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    tag = "cp" + version.replace(".", "")
    (torch_wheel,) = wheels.glob(f"torch-{torch_version}-*{tag}-{tag}-*.whl")  # a build tag may sit between
    libs = [str(p) for p in wheels.glob("nvidia_*.whl")] + [
        str(p)
        for name in ("filelock", "typing_extensions", "sympy", "mpmath", "networkx", "fsspec")
        for p in wheels.glob(f"{name}-*.whl")
    ]
    # torch's pure-Python needs as downloaded for the newest Python; their Requires-Python is not what is tested
    pip = [
        str(py),
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--ignore-requires-python",
    ]
    subprocess.run([*pip, str(torch_wheel), *libs], check=True)
    subprocess.run([*pip, str(wheel)], check=True)
    proc = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, cwd=work, check=False)
    record: dict[str, object] = {
        "python": version,
        "interpreter": python,
        "torch_wheel": torch_wheel.name,
        "ok": proc.returncode == 0,
    }
    if proc.returncode == 0:
        record.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    else:
        record["error"] = proc.stderr.strip().splitlines()[-3:]
    record["seconds"] = round(time.monotonic() - t0, 1)
    shutil.rmtree(venv)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", type=Path, required=True, help="the stable-ABI flash_attn wheel")
    ap.add_argument(
        "--wheels", type=Path, required=True, help="folder of downloaded torch + CUDA library wheels"
    )
    ap.add_argument(
        "--pair",
        action="append",
        required=True,
        help="INTERPRETER:TORCH, e.g. python3.13:2.14.1 (a path or a command)",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stable-abi-imports-") as tmp:
        results = [
            check_pair(*pair.split(":", 1), args.wheel.resolve(), args.wheels.resolve(), Path(tmp))
            for pair in args.pair
        ]
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, no GPU",
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "wheel": args.wheel.name,
        "wheel_sha256": sha256(args.wheel),
        "pairs": results,
        "all_ok": all(r["ok"] for r in results),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    sys.exit(0 if report["all_ok"] else 1)


if __name__ == "__main__":
    main()
