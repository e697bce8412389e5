"""The built wheel's check: its extension modules import next to the build's torch, and no kernel symbol
is left undefined (a profile that pruned a unit the binding still calls); for a stable-ABI build, that its
extension imports no torch C++ symbol (``require_stable_abi``)."""

from __future__ import annotations

import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

from .exits import EXIT_ABI, EXIT_ENV, EXIT_IMPORT, BuildFailure
from .report import Reporter

KERNEL_SYMBOL_HINTS = ("flash::", "run_mha")


# A torch error thrown inside the binding (CPU tensors where CUDA ones are due) must reach Python as a
# RuntimeError: the compiler verdict (builder.compiler) checked again on the code it built. Bindings whose
# ``fwd`` takes other arguments say "skipped".
EXCEPTION_RECHECK = """
fwd = getattr(m, "fwd", None)
if callable(fwd):
    t = torch.zeros(1, 8, 1, 64)
    try:
        fwd(t, t, t, None, None, 0.0, 0.125, False, -1, -1, 0.0, False, None)
        print("RECHECK none", n)
    except RuntimeError as exc:
        print("RECHECK raised", n, str(exc).splitlines()[0][:120])
    except TypeError:
        print("RECHECK skipped", n)
"""


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
    recheck = "".join("    " + ln + "\n" for ln in EXCEPTION_RECHECK.strip().splitlines())
    code = (
        f"import sys; sys.path.insert(0, {str(target)!r})\nimport torch\nimport importlib\n"
        f"for n in {names!r}:\n    m = importlib.import_module(n)\n"
        "    print('imported', n, 'from', getattr(m, '__file__', '?'))\n"
        f"{recheck}"
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
    verdicts = [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("RECHECK ")]
    return {
        "ok": ok,
        "output": output[-4000:],
        "undefined_kernel_symbols": undefined[:20],
        "modules": names,
        "exceptions": verdicts[0] if verdicts else "crashed" if proc.returncode < 0 else "not checked",
    }


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


# ------------------------------------------------------------------------------------------ stable-ABI check

# A stable-ABI extension reaches torch only through its C shim (aoti_torch_*, torch_* functions): an
# undefined C++ symbol of one of these namespaces ties the .so to one torch release's C++ ABI.
TORCH_CXX_NAMESPACES = ("at", "c10", "torch", "caffe2")
_TORCH_CXX = re.compile(r"(?:^|[^\w:])(?:" + "|".join(TORCH_CXX_NAMESPACES) + r")::")


def torch_cxx_imports(nm_output: str) -> list[str]:
    """The demangled symbols of ``nm -D --undefined-only -C`` output that name a torch C++ namespace
    anywhere (``c10::detail::torchCheckFail(...)``, ``vtable for at::TensorImpl``, ``foo(c10::Half)``)."""
    found = []
    for line in nm_output.splitlines():
        parts = line.split(None, 1)  # "U <symbol>"; a defined symbol has its address first: not an import
        if len(parts) == 2 and parts[0] in ("U", "w", "v") and _TORCH_CXX.search(parts[1]):
            found.append(parts[1].strip())
    return found


def undefined_symbols(so: Path) -> str:
    """``nm -D --undefined-only -C`` of a shared object; BuildFailure where nm is missing or fails."""
    nm = shutil.which("nm")
    if nm is None:
        raise BuildFailure(EXIT_ENV, "the stable-ABI check needs nm (binutils), not found on PATH")
    proc = subprocess.run(
        [nm, "-D", "--undefined-only", "-C", str(so)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise BuildFailure(EXIT_IMPORT, f"nm failed on {so.name}: {proc.stderr.strip()[-400:]}")
    return proc.stdout


def stable_abi_check(sos: list[Path]) -> dict[str, Any]:
    """Whether the shared objects import no torch C++ symbol; ``leaks`` maps a .so's name to its symbols."""
    leaks = {so.name: syms for so in sos if (syms := torch_cxx_imports(undefined_symbols(so)))}
    return {"ok": bool(sos) and not leaks, "checked": [so.name for so in sos], "leaks": leaks}


def require_stable_abi(sos: list[Path], rep: Reporter) -> dict[str, Any]:
    """Fail the build (EXIT_ABI) naming the first leaked symbol of each .so that imports torch C++."""
    if not sos:
        raise BuildFailure(
            EXIT_ABI, "stable-ABI check: no extension module (.so) to check", kind="stable_abi"
        )
    result = stable_abi_check(sos)
    for name, syms in result["leaks"].items():
        rep.line(f"attnforge: {name} imports {len(syms)} torch C++ symbol(s), e.g. {syms[0]}")
    if result["leaks"]:
        first = next(iter(result["leaks"].items()))
        raise BuildFailure(
            EXIT_ABI,
            f"stable-ABI check: {first[0]} imports the torch C++ symbol {first[1][0]!r} "
            "(only the C shim, aoti_torch_* / torch_*, is allowed)",
            kind="stable_abi",
            stable_abi=result,
        )
    rep.line(f"attnforge: stable-ABI check passed ({', '.join(result['checked'])})")
    return result


def wheel_extensions(wheel: Path, dest: Path) -> list[Path]:
    """Unpack every compiled extension (``*.so``, at any depth: FA3's is ``flash_attn_3/_C.abi3.so``) of a
    wheel under ``dest``; their paths, in member order."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    out = []
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.endswith(".so") or ".so." in member.rsplit("/", 1)[-1]:
                out.append(Path(zf.extract(member, dest)))
    return out


def require_stable_abi_wheel(wheel: Path, workdir: Path, rep: Reporter) -> dict[str, Any]:
    """``require_stable_abi`` on every compiled extension of a built wheel (BuildFailure EXIT_ABI)."""
    return require_stable_abi(wheel_extensions(wheel, workdir / "abicheck"), rep)
