"""Build the Triton-profile flash-attn wheel from the sdist: pure Python, the AMD Triton backend inside.

With ``BUILD_TARGET=rocm FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE``
flash-attn's setup.py declares no extension, so nothing is compiled and the wheel is ``py3-none-any``. The
build only *imports* torch (setup.py does ``import torch`` and ``torch.utils.cpp_extension``): any torch
build works, a CPU one included, and ``torch.version.hip`` is never read (FORCE_BUILD skips the prebuilt-wheel
guess that reads it). The wheel carries ``flash_attn/flash_attn_triton_amd``; at run time ``import flash_attn``
needs ``FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE`` (else it imports the absent ``flash_attn_2_cuda``) and a
``triton`` module (on ROCm torch installs: ``pytorch-triton-rocm``, a dependency of the ROCm torch wheel).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..build.incontainer_api import SOURCE_DATE_EPOCH
from ..build.sources import sha256_of
from ..cell import Cell
from ..errors import BuildError, ConfigurationError, EnvironmentProblem
from ..wheels.finalize import NATIVE_SUFFIXES
from .backends import ENV_TO_CLEAR, TRITON_IMPORT_ENV, backend_of, triton_env

# Members a Triton-backend wheel must have (compiled suffixes it must not have: finalize.NATIVE_SUFFIXES).
REQUIRED_MEMBERS: tuple[str, ...] = (
    "flash_attn/__init__.py",
    "flash_attn/flash_attn_interface.py",
    "flash_attn/flash_attn_triton_amd/__init__.py",
    "flash_attn/flash_attn_triton_amd/interface_fa.py",
)
_FACTS = (
    "import json, platform, setuptools, wheel, torch\n"
    "print(json.dumps({'torch': torch.__version__, 'hip': getattr(torch.version, 'hip', None),"
    " 'cuda': torch.version.cuda, 'setuptools': setuptools.__version__, 'wheel': wheel.__version__,"
    " 'python': platform.python_version()}))\n"
)
LineSink = Callable[[str], None]
ProcessSink = Callable[[subprocess.Popen[str]], None]


@dataclass(frozen=True)
class TritonWheelInputs:
    """What names and pins the wheel (a subset of a Cell, so a build can run without a matrix)."""

    kernel_version: str
    local_version: str
    torch: str
    toolkit: str = "rocm6.4"
    python: str = "3.12"
    cxx11_abi: bool = True
    target_arches: tuple[str, ...] = ()
    source_sha256: str | None = None

    @classmethod
    def from_cell(cls, cell: Cell) -> TritonWheelInputs:
        if backend_of(cell) != "triton":
            raise ConfigurationError(f"{cell.id}: not a Triton-profile cell (rocm_backend is CK)")
        if cell.kernel != "flash-attn":
            raise ConfigurationError(f"{cell.id}: only flash-attn has a Triton AMD backend")
        return cls(
            kernel_version=cell.kernel_version,
            local_version=cell.local_version,
            torch=cell.torch,
            toolkit=str(cell.toolkit),
            python=cell.python,
            cxx11_abi=cell.cxx11_abi,
            target_arches=cell.arches,
            source_sha256=cell.source_sha256,
        )

    @property
    def version(self) -> str:
        return f"{self.kernel_version}+{self.local_version}"

    @property
    def wheel_name(self) -> str:
        """`flash_attn-2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton-py3-none-any.whl` (the cell's spelling)."""
        return f"flash_attn-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class WheelCheck:
    """What the built wheel was verified to be."""

    tag: str
    version: str
    root_is_purelib: bool
    members: int
    triton_amd_files: int
    requires_dist: tuple[str, ...]
    top_level: tuple[str, ...]


@dataclass(frozen=True)
class TritonWheelResult:
    """The built wheel and how it was made."""

    wheel: Path
    sha256: str
    size: int
    built_as: str  # setuptools' own file name (PEP 440 lower-cases the local version)
    check: WheelCheck
    build_python: str
    build_torch: dict[str, str | None]
    seconds: float
    env: dict[str, str] = field(default_factory=dict)
    log_tail: str = ""

    def manifest_fields(self, target_arches: tuple[str, ...] = ()) -> dict[str, object]:
        """The manifest's ROCm fields: Triton backend, no CK kernels, nothing compiled, the stand-in torch."""
        return {
            "rocm_backend": "triton",
            "ck_kernels": False,
            "compiled_arches": [],
            "target_arches": list(target_arches),
            "pure_python": True,
            "build_torch": self.build_torch.get("torch"),
            "import_env": dict(TRITON_IMPORT_ENV),
        }


def python_facts(python: str) -> dict[str, str | None]:
    """torch/setuptools/wheel versions of the build interpreter; EnvironmentProblem when one is missing."""
    proc = subprocess.run(
        [python, "-W", "ignore", "-c", _FACTS], capture_output=True, text=True, check=False, timeout=300
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EnvironmentProblem(
            f"{python} cannot build the Triton wheel: it needs torch (any build, CPU is fine), setuptools and "
            f"wheel ({tail[0]})"
        )
    facts: dict[str, str | None] = json.loads(proc.stdout.strip().splitlines()[-1])
    return facts


def make_build_python(venv: Path, requirements: list[str], pip_args: list[str] | None = None) -> Path:
    """Create `venv` with `requirements` (e.g. a CPU torch, setuptools, wheel) and return its python."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    python = venv / "bin" / "python"
    cmd = [
        str(python),
        "-m",
        "pip",
        "install",
        "-q",
        "--progress-bar",
        "off",
        *(pip_args or []),
        *requirements,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"pip could not install {' '.join(requirements)}:\n{proc.stderr[-2000:]}")
    return python


def _extract(sdist: Path, dest: Path) -> Path:
    """Unpack the sdist (no absolute paths, no escapes, no links out) and return its top folder."""
    with tarfile.open(sdist) as tar:
        root = dest.resolve()
        for m in tar.getmembers():
            target = (dest / m.name).resolve()
            ok = target.is_relative_to(root) and not m.isdev()
            if ok and (m.issym() or m.islnk()):
                base = root if m.islnk() else target.parent
                ok = (base / m.linkname).resolve().is_relative_to(root)
            if not ok:
                raise BuildError(f"{sdist.name}: unsafe member {m.name!r}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Python < 3.10.12 / 3.11.4
            tar.extractall(dest)  # members checked above
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1 or not (tops[0] / "setup.py").is_file():
        raise BuildError(f"{sdist.name}: expected one top folder with setup.py")
    return tops[0]


def verify_triton_wheel(path: Path, inputs: TritonWheelInputs) -> WheelCheck:
    """The wheel is pure Python, has the Triton AMD backend, no compiled code and the cell's version."""
    _name, version, _build, tags = parse_wheel_filename(path.name)
    tag = ".".join(sorted(str(t) for t in tags))
    problems: list[str] = []
    if tag != "py3-none-any":
        problems.append(f"tag {tag} is not py3-none-any")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        dist_info = sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")})
        if len(dist_info) != 1:
            raise BuildError(f"{path.name}: {len(dist_info)} .dist-info folders")
        wheel_meta = Parser().parsestr(zf.read(f"{dist_info[0]}/WHEEL").decode())
        meta = Parser().parsestr(zf.read(f"{dist_info[0]}/METADATA").decode())
    purelib = str(wheel_meta.get("Root-Is-Purelib", "")).strip().lower() == "true"
    if not purelib:
        problems.append("Root-Is-Purelib is not true")
    native = [n for n in names if n.lower().endswith(NATIVE_SUFFIXES)]
    if native:
        problems.append(f"compiled files in a Triton wheel: {', '.join(native[:5])}")
    missing = [m for m in REQUIRED_MEMBERS if m not in names]
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    try:
        meta_version = Version(str(meta.get("Version", "")))
    except InvalidVersion:
        meta_version = None
    want = Version(inputs.version)
    if meta_version != want or version != want:
        problems.append(f"version {meta.get('Version')} (file {version}) is not {inputs.version}")
    if problems:
        raise BuildError(f"{path.name}: not a Triton-profile wheel: " + "; ".join(problems))
    tops = sorted({n.split("/")[0] for n in names if "/" in n and not n.split("/")[0].endswith(".dist-info")})
    return WheelCheck(
        tag=tag,
        version=str(meta.get("Version")),
        root_is_purelib=purelib,
        members=len(names),
        triton_amd_files=sum(1 for n in names if n.startswith("flash_attn/flash_attn_triton_amd/")),
        requires_dist=tuple(meta.get_all("Requires-Dist") or ()),
        top_level=tuple(tops),
    )


def run_streaming(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    on_line: LineSink | None = None,
    on_process: ProcessSink | None = None,
) -> tuple[int | None, str]:
    """Run `cmd`, passing each output line to `on_line`; (exit code, None past `timeout`; the output)."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    if on_process:
        on_process(proc)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if on_line:
                on_line(line)
        code = proc.wait()
    finally:
        expired = not timer.is_alive()
        timer.cancel()
    return (None if expired and code < 0 else code), "".join(lines)


def build_triton_wheel(
    sdist: Path,
    inputs: TritonWheelInputs,
    out_dir: Path,
    *,
    python: str | None = None,
    work_dir: Path | None = None,
    source_date_epoch: int = SOURCE_DATE_EPOCH,
    timeout: float = 600,
    on_line: LineSink | None = None,
    on_process: ProcessSink | None = None,
) -> TritonWheelResult:
    """Run flash-attn's own setup.py (pip wheel, no build isolation) with the Triton knobs; verify; name it.

    `python` must have torch, setuptools and wheel (a CPU torch is enough). The wheel lands in `out_dir`
    as `inputs.wheel_name`; the same inputs give the same bytes (SOURCE_DATE_EPOCH). `on_line` gets pip's
    output as it comes, `on_process` the pip process (to stop it).
    """
    start = time.monotonic()
    python = python or sys.executable
    if inputs.source_sha256 and sha256_of(sdist) != inputs.source_sha256:
        raise BuildError(f"{sdist.name}: sha256 does not match the pin {inputs.source_sha256[:16]}…")
    facts = python_facts(python)
    env = {k: v for k, v in os.environ.items() if k not in ENV_TO_CLEAR}
    knobs = triton_env(local_version=inputs.local_version, cxx11_abi=inputs.cxx11_abi)
    env.update(knobs)
    env.update({"SOURCE_DATE_EPOCH": str(source_date_epoch), "PYTHONUNBUFFERED": "1", "PIP_NO_INPUT": "1"})
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_ctx = tempfile.TemporaryDirectory(prefix="attnforge-triton-") if work_dir is None else None
    work = Path(tmp_ctx.name) if tmp_ctx else work_dir
    assert work is not None
    try:
        src_root, dist = work / "src", work / "dist"
        for d in (src_root, dist):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        tree = _extract(sdist, src_root)
        cmd = [
            python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--use-pep517",
            "--no-cache-dir", "--no-index", "-v", "-w", str(dist), str(tree),
        ]  # fmt: skip
        code, log = run_streaming(cmd, tree, env, timeout, on_line, on_process)
        (work / "build.log").write_text(log, encoding="utf-8")
        tail = "\n".join(log.strip().splitlines()[-15:])
        if code is None:
            raise BuildError(f"the Triton wheel build ran past {timeout:.0f} s:\n{tail}")
        if code != 0:
            raise BuildError(f"flash-attn setup.py failed (pip exit {code}):\n{tail}")
        wheels = sorted(dist.glob("*.whl"))
        if len(wheels) != 1:
            raise BuildError(f"expected one wheel, found {[w.name for w in wheels]}:\n{tail}")
        check = verify_triton_wheel(wheels[0], inputs)
        final = out_dir / inputs.wheel_name
        tmp_final = final.with_name(final.name + ".part")
        shutil.copyfile(wheels[0], tmp_final)
        tmp_final.replace(final)
    finally:
        if tmp_ctx:
            tmp_ctx.cleanup()
    return TritonWheelResult(
        wheel=final,
        sha256=sha256_of(final),
        size=final.stat().st_size,
        built_as=wheels[0].name,
        check=check,
        build_python=python,
        build_torch=facts,
        seconds=round(time.monotonic() - start, 1),
        env=knobs,
        log_tail=tail,
    )
