"""The interpreter a cell builds with and the torch in it: a cached (python, torch) venv, or an existing
interpreter as it is (the env backend: a GPU runner's or an NGC image's own torch)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .exits import EXIT_CONFIG, EXIT_ENV, BuildFailure
from .files import file_lock
from .procs import stream
from .report import Reporter
from .spec import BuildSpec
from .toolkits import cuda_of_variant

VENV_MARKER = ".attnforge-venv.json"

TORCH_INFO = """
import json, os, platform, torch
ext = os.path.join(torch.__path__[0], "utils", "cpp_extension.py")
print(json.dumps({
    "torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
    "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI), "python": platform.python_version(),
    "auto_wrap": "TORCH_NO_COMPILER_WRAPPER" in open(ext).read(), "site": os.path.dirname(torch.__path__[0]),
}))
"""
# "3.12", or "3.14t" for a free-threaded build (Py_GIL_DISABLED): what `spec.python` names.
PYTHON_ID = (
    "import sys, sysconfig; print('%d.%d' % sys.version_info[:2] "
    "+ ('t' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''))"
)
# What `pip wheel --no-build-isolation` needs beside torch in an interpreter used as it is.
BUILD_MODULES = ("setuptools", "wheel", "packaging", "ninja")


def run_capture(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> str:
    """stdout of ``cmd``; RuntimeError with its stderr tail when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}"
        )
    return proc.stdout.strip()


def find_python(want: str) -> str:
    """An interpreter path for a spec's ``python`` ("3.12" or an absolute path)."""
    if os.path.isabs(want):
        if not os.access(want, os.X_OK):
            raise BuildFailure(EXIT_ENV, f"python {want} is not executable")
        return want
    if not re.fullmatch(r"3\.\d+t?", want):
        raise BuildFailure(EXIT_CONFIG, f"python must be like 3.12, 3.14t or an absolute path, not {want!r}")
    release, ft = want.removesuffix("t"), "t" if want.endswith("t") else ""
    nodot = release.replace(".", "")
    candidates: list[str] = []
    found = shutil.which(f"python{want}")
    if found:
        candidates.append(found)
    candidates += sorted(
        str(p) for p in Path("/opt/python").glob(f"cp{nodot}-cp{nodot}{ft}/bin/python{want}")
    )
    pyenv_root = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv"))
    pattern = f"versions/{release}.*{ft}/bin/python{want}"
    candidates += sorted(
        (str(p) for p in pyenv_root.glob(pattern) if ft or not p.parts[-3].endswith("t")), reverse=True
    )
    candidates += [f"/usr/local/bin/python{want}", f"/usr/bin/python{want}"]
    for cand in candidates:
        if not os.access(cand, os.X_OK):
            continue
        try:
            got = run_capture([cand, "-c", PYTHON_ID], timeout=60)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            continue
        if got == want:
            return cand
    raise BuildFailure(
        EXIT_ENV, f"no Python {want} found (PATH, /opt/python, $PYENV_ROOT/versions, /usr/bin)"
    )


def pip_env(spec: BuildSpec, base: dict[str, str]) -> dict[str, str]:
    """``base`` plus the spec's pip variables (CA bundle, cache folder)."""
    env = dict(base)
    env.update({str(k): str(v) for k, v in spec.pip_env.items()})
    if spec.pip_cache_dir:
        env["PIP_CACHE_DIR"] = spec.pip_cache_dir
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def torch_info(python: str) -> dict[str, Any]:
    """torch's version, CUDA/HIP, ABI, Python, and whether its cpp_extension prepends ccache by itself."""
    out = run_capture([python, "-W", "ignore", "-c", TORCH_INFO], timeout=300)
    info: dict[str, Any] = json.loads(out.splitlines()[-1])
    return info


def variant_mismatch(variant: str, info: dict[str, Any]) -> str | None:
    """A sentence when the installed torch is not the spec's variant (cu130, rocm6.4, cpu), else None."""
    cuda, hip = info.get("cuda"), info.get("hip")
    want = cuda_of_variant(variant)
    if want is not None:
        if cuda != want:
            return f"torch {info['torch']} is built for CUDA {cuda}, the cell wants {variant} (CUDA {want})"
    elif variant == "cpu" and (cuda or hip):
        return f"torch {info['torch']} is a GPU build, the cell wants the CPU variant"
    elif variant.startswith("rocm") and not hip:
        return f"torch {info['torch']} is not a ROCm build, the cell wants {variant}"
    return None


def use_interpreter(spec: BuildSpec, rep: Reporter) -> dict[str, Any]:
    """The env backend's case: ``spec.python`` itself, whose torch must be the one the cell names."""
    python = find_python(spec.python)
    try:
        info = torch_info(python)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        raise BuildFailure(EXIT_ENV, f"torch does not import with {python}: {exc}") from None
    if info["torch"] != spec.torch:
        raise BuildFailure(
            EXIT_ENV, f"{python} has torch {info['torch']}, the spec was made for {spec.torch}"
        )
    missing = []
    for module in BUILD_MODULES:
        try:
            run_capture([python, "-c", f"import {module}"], timeout=120)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            missing.append(module)
    if missing:
        raise BuildFailure(
            EXIT_ENV,
            f"{python} lacks {', '.join(missing)} (pip install {' '.join(missing)}): "
            "a build against an existing torch installs nothing into it",
        )
    rep.line(f"attnforge: building with {python} as it is (torch {info['torch']}, no venv)")
    return {**info, "vpy": python, "reused": True}


def ensure_venv(spec: BuildSpec, rep: Reporter, env: dict[str, str]) -> dict[str, Any]:
    """Create or reuse the (python, torch) venv; its python path and torch facts."""
    if spec.use_interpreter:
        return use_interpreter(spec, rep)
    venv = Path(spec.venv_dir)
    python = find_python(spec.python)
    reqs = [spec.torch_requirement or f"torch=={spec.torch}", *spec.extra_requirements]
    want = {"python": python, "requirements": reqs, "pip_args": list(spec.pip_args)}
    vpy = str(venv / "bin" / "python")
    with file_lock(venv.with_name(venv.name + ".lock")):
        marker = venv / VENV_MARKER
        if marker.is_file():
            try:
                have = json.loads(marker.read_text(encoding="utf-8"))
            except ValueError:
                have = {}
            if have.get("want") == want:
                try:
                    info = torch_info(vpy)
                    rep.line(f"attnforge: reusing venv {venv} (torch {info['torch']})")
                    return {**info, "vpy": vpy, "reused": True}
                except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                    rep.line(f"attnforge: venv {venv} is broken ({exc}); recreating")
        if venv.exists():
            shutil.rmtree(venv)
        try:
            run_capture([python, "-m", "venv", str(venv)], timeout=300)
        except (RuntimeError, OSError) as exc:
            raise BuildFailure(EXIT_ENV, f"cannot create a venv with {python}: {exc}") from None
        # --no-compile: byte-compiling all of torch's sources is CPU the kernel lane needs; a build imports a
        # small part of torch, and Python caches what it imports
        cmd = [vpy, "-m", "pip", "install", "--progress-bar", "off", "--no-compile", *want["pip_args"], *reqs]
        rep.line("attnforge: " + " ".join(cmd))
        rc, _ = stream(cmd, pip_env(spec, env), rep)
        if rc != 0:
            raise BuildFailure(EXIT_ENV, f"pip could not install {' '.join(reqs)} (exit {rc})")
        try:
            info = torch_info(vpy)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise BuildFailure(EXIT_ENV, f"torch does not import in {venv}: {exc}") from None
        if str(info["torch"]).split("+")[0] != spec.torch.split("+")[0]:
            raise BuildFailure(EXIT_ENV, f"venv has torch {info['torch']}, spec wants {spec.torch}")
        marker.write_text(json.dumps({"want": want, "torch": info}, indent=1), encoding="utf-8")
        return {**info, "vpy": vpy, "reused": False}
