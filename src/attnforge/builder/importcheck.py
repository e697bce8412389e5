"""The built wheel's check: its extension modules import next to the build's torch, and no kernel symbol
is left undefined (a profile that pruned a unit the binding still calls)."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

from .report import Reporter

KERNEL_SYMBOL_HINTS = ("flash::", "run_mha")


def import_check(
    vpy: str, wheel: Path, names: list[str], workdir: Path, rep: Reporter, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Unpack the wheel and import ``names`` (default: its top-level .so modules) with the venv's torch."""
    target = workdir / "importcheck"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    sos = sorted(p.name for p in target.glob("*.so"))
    if not names:
        names = [n.split(".")[0] for n in sos]
    code = (
        f"import sys; sys.path.insert(0, {str(target)!r})\nimport torch\nimport importlib\n"
        f"for n in {names!r}:\n    m = importlib.import_module(n)\n"
        "    print('imported', n, 'from', getattr(m, '__file__', '?'))\n"
        "print('torch', torch.__version__)\n"
    )
    proc = subprocess.run(
        [vpy, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        cwd=str(workdir),
        check=False,
        timeout=600,
        env=env,
    )
    output = (proc.stdout + proc.stderr).strip()
    for ln in output.splitlines():
        rep.line(ln)
    undefined: list[str] = []
    if shutil.which("nm"):
        for so in sos:
            out = subprocess.run(
                ["nm", "-D", "--undefined-only", "-C", str(target / so)],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            undefined += [
                ln.split(None, 1)[-1] for ln in out.splitlines() if any(h in ln for h in KERNEL_SYMBOL_HINTS)
            ]
    ok = proc.returncode == 0 and not undefined
    return {"ok": ok, "output": output[-4000:], "undefined_kernel_symbols": undefined[:20], "modules": names}


def wheel_members(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


# Suffixes of compiled code a pure (py3-none-any) wheel must not carry.
NATIVE_SUFFIXES: tuple[str, ...] = (".so", ".pyd", ".dylib", ".dll", ".hsaco", ".co", ".o", ".a", ".fatbin")
# Members a ROCm Triton-backend flash-attn wheel must have.
TRITON_MEMBERS: tuple[str, ...] = (
    "flash_attn/__init__.py",
    "flash_attn/flash_attn_interface.py",
    "flash_attn/flash_attn_triton_amd/__init__.py",
    "flash_attn/flash_attn_triton_amd/interface_fa.py",
)


def pure_wheel_check(wheel: Path) -> dict[str, Any]:
    """A Triton-backend wheel: no compiled file, the Triton AMD backend inside; {"ok", "problems", ...}."""
    names = wheel_members(wheel)
    problems = []
    native = [n for n in names if n.lower().endswith(NATIVE_SUFFIXES)]
    if native:
        problems.append(f"compiled files in a Triton wheel: {', '.join(native[:5])}")
    missing = [m for m in TRITON_MEMBERS if m not in names]
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if not wheel.name.endswith("-py3-none-any.whl"):
        problems.append(f"{wheel.name} is not tagged py3-none-any")
    amd = sum(1 for n in names if n.startswith("flash_attn/flash_attn_triton_amd/"))
    return {"ok": not problems, "problems": problems, "members": len(names), "triton_amd_files": amd}
