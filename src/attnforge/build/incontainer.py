"""Build one cell's wheel: ``python3 incontainer.py --spec SPEC.json``. Standard library only.

Runs inside the builder container (docker backend) or on a host (local backend). Steps: verify the sdist's
sha256; unpack it once into ``build_dir/src`` and apply the named patches (a rerun with the same source and
patches resumes in place, so ninja skips finished objects); create or reuse a venv for (python, torch) with
torch installed *with* its dependencies (setup.py imports torch, and libtorch_cuda.so needs the nvidia-*
libraries to load; they also carry the cuBLAS/cuSPARSE/cuSOLVER headers); set flash-attn's build knobs; run
``pip wheel --no-build-isolation --use-pep517 --no-deps``; check that the wheel's extension imports next to torch; write
``output_dir/result.json`` and ``output_dir/build.log``.

Spec (JSON object; see docs/build-internals.md for the full table)::

    {"schema": 1, "cell_id": "...", "kernel": "flash-attn", "kernel_version": "2.8.3",
     "source": {"path": "/sources/flash_attn-2.8.3.tar.gz", "sha256": "<hex>", "url": null},
     "python": "3.11", "torch": "2.14.1", "torch_requirement": null, "torch_variant": "cu130",
     "pip": {"args": ["--find-links", "/opt/wheels"], "env": {"PIP_CERT": "/run/secrets/ca"}, "cache_dir": null},
     "extra_requirements": ["setuptools>=77", "wheel", "packaging", "ninja"],
     "build_dir": "/cache/build/<cell>", "venv_dir": "/cache/venvs/<py>-<torch>", "output_dir": "/out",
     "kernel_objects_dir": "/cache/kernels/<key>", "kernel_set_key": "<16 hex>",
     "arches": ["sm_90"], "cxx11_abi": true, "local_version": "cu130torch2.14cxx11abiTRUE.hd128fwd",
     "patches": ["cxx20"], "profile_flags": ["-DFLASHATTENTION_DISABLE_BACKWARD"],
     "head_dims": [128], "dtypes": ["bf16"], "backward": false,
     "max_jobs": null, "nvcc_threads": 1, "job_mem_gb": 4.5, "nvcc_append_flags": null,
     "ccache": null, "source_date_epoch": null, "env": {}, "import_check": true, "import_names": null}

Progress goes to stdout as ``@@attnforge {json}`` lines between the tools' own output: ``stage``
(name, status start|done, s), ``sources``, ``unit`` (done, total, name, units_total), ``error``, ``result``.

Exit codes: 0 wheel built; 1 internal error (traceback in the log); 2 bad spec, source sha256 mismatch or a
patch that does not apply; 4 compile or link error (the failing unit and its first error lines are printed);
5 environment problem (no Python of that version, pip could not install torch, wrong torch variant, no nvcc);
6 the built extension does not import; 75 a compiler was killed (OOM: ``Killed``, signal 9, code 137): rerun
with fewer ``max_jobs`` in the same build_dir and it resumes (keep ``nvcc_threads`` and flags unchanged, or
ninja recompiles); 130 interrupted.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder is sys.path[0], and a sibling module there (build/select.py) would
# shadow the standard library's (subprocess imports select): drop the folder before importing anything else.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse
import contextlib
import fnmatch
import hashlib
import json
import re
import resource
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_CONFIG = 2
EXIT_BUILD = 4
EXIT_ENV = 5
EXIT_IMPORT = 6
EXIT_OOM = 75
EXIT_INTERRUPTED = 130

EVENT_PREFIX = "@@attnforge "
PATCHES_DIR = Path(__file__).resolve().parent / "patches"
STATE_FILE = "attnforge-state.json"
VENV_MARKER = ".attnforge-venv.json"
DEFAULT_REQUIREMENTS = ["setuptools>=77", "wheel", "packaging", "ninja"]
FLASH_ATTN_IMPORTS = ["flash_attn_2_cuda", "flash_attn"]
HOOK_PATCH = "setup-hooks"
DISPATCH_PATCH = "dispatch-subset"

NINJA_STATUS_RE = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
FAILED_RE = re.compile(r"^FAILED:\s+(?:\[code=(-?\d+)\]\s+)?(.*)$")
OOM_RE = re.compile(
    r"(\bKilled\b|signal 9|Kill signal|SIGKILL|died due to signal|exit(?:ed)? (?:status|code) 137|"
    r"out of memory|virtual memory exhausted|std::bad_alloc|Cannot allocate memory)",
    re.IGNORECASE,
)
ERROR_LINE_RE = re.compile(r"(\berror\b|fatal)", re.IGNORECASE)


class BuildFailure(Exception):
    """Ends the build with ``code``; ``details`` goes into result.json's ``error``."""

    def __init__(self, code: int, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


# ---------------------------------------------------------------------------------------------- output


class Reporter:
    """Writes tool output and events to stdout and to the build log."""

    def __init__(self, log_path: Path | None) -> None:
        self.log: IO[str] | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log = open(log_path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115

    def line(self, text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        if self.log is not None:
            self.log.write(text + "\n")
            self.log.flush()

    def event(self, event_name: str, /, **fields: Any) -> None:
        payload: dict[str, Any] = {"event": event_name}
        payload.update(fields)
        self.line(EVENT_PREFIX + json.dumps(payload, sort_keys=False))

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


class Stage:
    """Context manager emitting stage start/done events and recording the duration."""

    def __init__(self, rep: Reporter, times: dict[str, float], name: str) -> None:
        self.rep, self.times, self.name = rep, times, name
        self.start = 0.0

    def __enter__(self) -> Stage:
        self.start = time.monotonic()
        self.rep.event("stage", stage=self.name, status="start")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        dt = round(time.monotonic() - self.start, 1)
        self.times[self.name] = dt
        self.rep.event("stage", stage=self.name, status="done" if exc is None else "failed", s=dt)


# ---------------------------------------------------------------------------------------------- spec


def normalize_aliases(spec: dict[str, Any]) -> dict[str, Any]:
    """Accept the flat field names of attnforge.build.incontainer_api.BuildSpec as well."""
    s = dict(spec)
    if "source" not in s and "sdist" in s:
        s["source"] = {
            "path": s.pop("sdist"),
            "sha256": s.pop("sdist_sha256", ""),
            "url": s.pop("sdist_url", None),
        }
    renames = {"out_dir": "output_dir", "objects_dir": "kernel_objects_dir", "cuda_archs": "arches"}
    for old, new in renames.items():
        if old in s and new not in s:
            s[new] = s.pop(old)
    if "pip_args" in s and "pip" not in s:
        s["pip"] = {"args": list(s.pop("pip_args") or [])}
    if "ccache_dir" in s and "ccache" not in s:
        cdir = s.pop("ccache_dir")
        s["ccache"] = {"dir": cdir} if cdir else None
    if s.get("torch_variant") == "cpu" and not s.get("torch_requirement") and "torch" in s:
        s["torch_requirement"] = f"torch=={s['torch']}+cpu"
    if "disable" in s and "profile_flags" not in s:
        disable = [str(d).upper() for d in (s.pop("disable") or [])]
        s["profile_flags"] = [f"-DFLASHATTENTION_DISABLE_{d}" for d in disable]
        if "BACKWARD" in disable and "backward" not in s:
            s["backward"] = False
    return s


def load_spec(path: Path) -> dict[str, Any]:
    """Read and check the spec; fill defaults."""
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BuildFailure(EXIT_CONFIG, f"cannot read spec {path}: {exc}") from exc
    if not isinstance(spec, dict):
        raise BuildFailure(EXIT_CONFIG, "spec must be a JSON object")
    spec = normalize_aliases(spec)
    missing = [
        k
        for k in ("kernel", "source", "python", "torch", "build_dir", "venv_dir", "output_dir")
        if k not in spec
    ]
    if missing:
        raise BuildFailure(EXIT_CONFIG, f"spec lacks {', '.join(missing)}")
    src = spec["source"]
    if not isinstance(src, dict) or "path" not in src or "sha256" not in src:
        raise BuildFailure(EXIT_CONFIG, "spec.source needs path and sha256")
    defaults: dict[str, Any] = {
        "schema": 1,
        "cell_id": None,
        "kernel_version": None,
        "torch_requirement": None,
        "torch_variant": None,
        "pip": {},
        "extra_requirements": list(DEFAULT_REQUIREMENTS),
        "kernel_objects_dir": None,
        "kernel_set_key": None,
        "arches": [],
        "cxx11_abi": True,
        "local_version": None,
        "patches": [],
        "profile_flags": [],
        "head_dims": None,
        "dtypes": None,
        "backward": True,
        "max_jobs": None,
        "nvcc_threads": 1,
        "job_mem_gb": 4.5,
        "nvcc_append_flags": None,
        "ccache": None,
        "source_date_epoch": None,
        "env": {},
        "import_check": True,
        "import_names": None,
        "patches_dir": None,
        "cxx_probe": True,
    }
    for key, value in defaults.items():
        if spec.get(key) is None:
            spec[key] = value
    if spec["dtypes"] and set(spec["dtypes"]) - {"fp16", "bf16"}:
        raise BuildFailure(EXIT_CONFIG, f"unknown dtypes {spec['dtypes']} (fp16, bf16)")
    if spec["head_dims"] and set(spec["head_dims"]) - {32, 64, 96, 128, 192, 256}:
        raise BuildFailure(EXIT_CONFIG, f"unknown head dims {spec['head_dims']} (32 64 96 128 192 256)")
    return spec


def is_flash_attn(spec: dict[str, Any]) -> bool:
    return str(spec["kernel"]) in ("flash-attn", "flash_attn")


# ---------------------------------------------------------------------------------------------- source


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_source(spec: dict[str, Any], rep: Reporter) -> Path:
    """Return the verified sdist path, downloading it from ``source.url`` when the file is absent."""
    src = spec["source"]
    path = Path(src["path"])
    if not path.is_file() and src.get("url"):
        import urllib.request

        path.parent.mkdir(parents=True, exist_ok=True)
        rep.line(f"downloading {src['url']}")
        tmp = path.with_name(path.name + f".part{os.getpid()}")
        with urllib.request.urlopen(src["url"], timeout=120) as resp, open(tmp, "wb") as out:
            shutil.copyfileobj(resp, out)
        os.replace(tmp, path)
    if not path.is_file():
        raise BuildFailure(EXIT_CONFIG, f"source {path} does not exist")
    digest = sha256_file(path)
    if digest != str(src["sha256"]).lower():
        raise BuildFailure(EXIT_CONFIG, f"sha256 mismatch for {path}: expected {src['sha256']}, got {digest}")
    return path


def _safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    root = dest.resolve()
    for member in tar.getmembers():
        target = (dest / member.name).resolve()
        if root != target and root not in target.parents:
            raise BuildFailure(EXIT_CONFIG, f"unsafe path in sdist: {member.name}")
        if member.issym() or member.islnk():
            link = (target.parent / member.linkname).resolve()
            if root != link and root not in link.parents:
                raise BuildFailure(EXIT_CONFIG, f"unsafe link in sdist: {member.name}")
    if sys.version_info >= (3, 12):
        tar.extractall(dest, filter="data")
    else:
        tar.extractall(dest)


def sdist_epoch(path: Path) -> int:
    """mtime of the sdist's PKG-INFO (a stable SOURCE_DATE_EPOCH default)."""
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if member.name.count("/") == 1 and member.name.endswith("/PKG-INFO"):
                return int(member.mtime)
    return 315532800  # 1980-01-01, the zip epoch


# ---------------------------------------------------------------------------------------------- patches


def resolve_patches(spec: dict[str, Any]) -> list[str]:
    """Patch names in application order, with the hook patches added when the spec needs them."""
    names = [str(n) for n in spec["patches"]]
    if is_flash_attn(spec):
        need_hooks = bool(
            spec["profile_flags"]
            or spec["head_dims"]
            or spec["dtypes"]
            or not spec["backward"]
            or spec["kernel_objects_dir"]
        )
        need_dispatch = bool(spec["head_dims"] or spec["dtypes"] or not spec["backward"])
        if need_hooks and HOOK_PATCH not in names:
            names.append(HOOK_PATCH)
        if need_dispatch and DISPATCH_PATCH not in names:
            names.append(DISPATCH_PATCH)
    return names


def patches_dir(spec: dict[str, Any]) -> Path:
    return Path(spec["patches_dir"]) if spec["patches_dir"] else PATCHES_DIR


def load_patch(pdir: Path, name: str) -> dict[str, Any]:
    path = pdir / f"{name}.json"
    if not path.is_file():
        raise BuildFailure(EXIT_CONFIG, f"unknown patch {name!r} (no {path})")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def patch_digest(pdir: Path, names: list[str]) -> str:
    """Hash of the patch files (and files they copy), to tell whether an unpacked tree is current."""
    h = hashlib.sha256()
    for name in names:
        data = load_patch(pdir, name)
        h.update(json.dumps(data, sort_keys=True).encode())
        for edit in data.get("edits", []):
            if edit.get("op") == "copy":
                h.update((pdir / edit["from"]).read_bytes())
    return h.hexdigest()[:16]


def _version_matches(version: str | None, patterns: list[str]) -> bool:
    return not patterns or version is None or any(fnmatch.fnmatch(version, p) for p in patterns)


def apply_patch(tree: Path, pdir: Path, name: str, spec: dict[str, Any], rep: Reporter) -> None:
    """Apply one patch's edits; every edit must match exactly ``count`` times (default 1)."""
    data = load_patch(pdir, name)
    if data.get("kernel") and data["kernel"] != spec["kernel"]:
        raise BuildFailure(EXIT_CONFIG, f"patch {name} is for {data['kernel']}, not {spec['kernel']}")
    if not _version_matches(spec["kernel_version"], list(data.get("versions", []))):
        raise BuildFailure(
            EXIT_CONFIG, f"patch {name} supports {data['versions']}, not {spec['kernel_version']}"
        )
    for i, edit in enumerate(data.get("edits", [])):
        op = edit.get("op")
        where = f"patch {name} edit {i} ({op})"
        if op == "copy":
            dest = tree / edit["to"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pdir / edit["from"], dest)
            continue
        target = tree / edit["file"]
        if not target.is_file():
            raise BuildFailure(EXIT_CONFIG, f"{where}: {edit['file']} not found in the source")
        text = target.read_text(encoding="utf-8")
        needle = edit["old"] if op == "replace" else edit["anchor"]
        found = text.count(needle)
        want = int(edit.get("count", 1))
        if found != want:
            raise BuildFailure(
                EXIT_CONFIG,
                f"{where}: expected {want} occurrence(s) of {needle!r} in "
                f"{edit['file']}, found {found}: the patch does not apply to this source",
            )
        if op == "replace":
            new = text.replace(needle, edit["new"])
        elif op == "insert_before":
            new = text.replace(needle, edit["text"] + needle)
        elif op == "insert_after":
            new = text.replace(needle, needle + edit["text"])
        else:
            raise BuildFailure(EXIT_CONFIG, f"{where}: unknown op")
        target.write_text(new, encoding="utf-8")
    rep.line(f"attnforge: applied patch {name}")


def prepare_tree(spec: dict[str, Any], sdist: Path, patches: list[str], rep: Reporter) -> Path:
    """Unpack + patch into build_dir/src unless a tree for the same source and patches is already there."""
    build_dir = Path(spec["build_dir"])
    build_dir.mkdir(parents=True, exist_ok=True)
    state_path = build_dir / STATE_FILE
    pdir = patches_dir(spec)
    want = {
        "source_sha256": spec["source"]["sha256"].lower(),
        "patches": patches,
        "patch_digest": patch_digest(pdir, patches),
    }
    src_root = build_dir / "src"
    if state_path.is_file():
        try:
            have = json.loads(state_path.read_text(encoding="utf-8"))
        except ValueError:
            have = {}
        tree = Path(have.get("tree", ""))
        if all(have.get(k) == v for k, v in want.items()) and tree.is_dir():
            rep.line(f"attnforge: reusing unpacked tree {tree} (resume)")
            return tree
        rep.line("attnforge: source or patches changed; unpacking afresh")
    if src_root.exists():
        shutil.rmtree(src_root)
    src_root.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        _safe_extract(tar, src_root)
    entries = [p for p in src_root.iterdir() if p.is_dir()]
    tree = entries[0] if len(entries) == 1 else src_root
    if not (tree / "setup.py").is_file() and not (tree / "pyproject.toml").is_file():
        raise BuildFailure(EXIT_CONFIG, f"no setup.py or pyproject.toml in {sdist.name}")
    for name in patches:
        apply_patch(tree, pdir, name, spec, rep)
    want["tree"] = str(tree)
    state_path.write_text(json.dumps(want, indent=1), encoding="utf-8")
    return tree


# ---------------------------------------------------------------------------------------------- python / venv


def run_capture(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> str:
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
    if not re.fullmatch(r"3\.\d+", want):
        raise BuildFailure(EXIT_CONFIG, f"python must be like 3.12 or an absolute path, not {want!r}")
    nodot = want.replace(".", "")
    candidates: list[str] = []
    found = shutil.which(f"python{want}")
    if found:
        candidates.append(found)
    candidates += sorted(str(p) for p in Path("/opt/python").glob(f"cp{nodot}-cp{nodot}/bin/python{want}"))
    pyenv_root = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv"))
    candidates += sorted(
        (str(p) for p in pyenv_root.glob(f"versions/{want}.*/bin/python{want}")), reverse=True
    )
    candidates += [f"/usr/local/bin/python{want}", f"/usr/bin/python{want}"]
    for cand in candidates:
        if not os.access(cand, os.X_OK):
            continue
        try:
            got = run_capture([cand, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout=60)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            continue
        if got == want:
            return cand
    raise BuildFailure(
        EXIT_ENV, f"no Python {want} found (PATH, /opt/python, $PYENV_ROOT/versions, /usr/bin)"
    )


def pip_env(spec: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    pip = spec["pip"] or {}
    for key, value in (pip.get("env") or {}).items():
        env[str(key)] = str(value)
    if pip.get("cache_dir"):
        env["PIP_CACHE_DIR"] = str(pip["cache_dir"])
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


TORCH_INFO = """
import json, os, platform, torch
ext = os.path.join(torch.__path__[0], "utils", "cpp_extension.py")
print(json.dumps({
    "torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
    "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI), "python": platform.python_version(),
    "auto_wrap": "TORCH_NO_COMPILER_WRAPPER" in open(ext).read(),
}))
"""


def torch_info(vpy: str) -> dict[str, Any]:
    """torch's version, CUDA/HIP, ABI and whether its cpp_extension prepends ccache by itself."""
    code = TORCH_INFO
    out = run_capture([vpy, "-W", "ignore", "-c", code], timeout=300)
    info: dict[str, Any] = json.loads(out.splitlines()[-1])
    return info


@contextlib.contextmanager
def file_lock(path: Path) -> Any:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def variant_mismatch(variant: str, info: dict[str, Any]) -> str | None:
    """A sentence when the installed torch is not the spec's variant (cu130, rocm6.4, cpu), else None."""
    cuda, hip = info.get("cuda"), info.get("hip")
    if variant.startswith("cu") and variant[2:].isdigit():
        want = f"{variant[2:-1]}.{variant[-1]}"
        if cuda != want:
            return f"torch {info['torch']} is built for CUDA {cuda}, the cell wants {variant} (CUDA {want})"
    elif variant == "cpu" and (cuda or hip):
        return f"torch {info['torch']} is a GPU build, the cell wants the CPU variant"
    elif variant.startswith("rocm") and not hip:
        return f"torch {info['torch']} is not a ROCm build, the cell wants {variant}"
    return None


def ensure_venv(spec: dict[str, Any], rep: Reporter, env: dict[str, str]) -> dict[str, Any]:
    """Create or reuse the (python, torch) venv; return its python path and torch facts."""
    venv = Path(spec["venv_dir"])
    python = find_python(str(spec["python"]))
    torch_req = spec["torch_requirement"] or f"torch=={spec['torch']}"
    pip = spec["pip"] or {}
    reqs = [torch_req, *spec["extra_requirements"]]
    want = {"python": python, "requirements": reqs, "pip_args": list(pip.get("args") or [])}
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
            raise BuildFailure(EXIT_ENV, f"cannot create a venv with {python}: {exc}") from exc
        cmd = [vpy, "-m", "pip", "install", "--progress-bar", "off", *want["pip_args"], *reqs]
        rep.line("attnforge: " + " ".join(cmd))
        rc, _ = stream([*cmd], pip_env(spec, env), rep, parse=False)
        if rc != 0:
            raise BuildFailure(EXIT_ENV, f"pip could not install {' '.join(reqs)} (exit {rc})")
        try:
            info = torch_info(vpy)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise BuildFailure(EXIT_ENV, f"torch does not import in {venv}: {exc}") from exc
        if not str(info["torch"]).split("+")[0] == str(spec["torch"]).split("+")[0]:
            raise BuildFailure(EXIT_ENV, f"venv has torch {info['torch']}, spec wants {spec['torch']}")
        marker.write_text(json.dumps({"want": want, "torch": info}, indent=1), encoding="utf-8")
        return {**info, "vpy": vpy, "reused": False}


# ---------------------------------------------------------------------------------------------- processes


class RssSampler(threading.Thread):
    """Samples /proc every ``interval`` s: peak RSS of the process tree under ``root`` and of one process."""

    def __init__(self, root: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak_tree = 0
        self.peak_single = 0
        self._stop = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def stop(self) -> None:
        self._stop.set()

    def _sample(self) -> None:
        parents: dict[int, int] = {}
        rss: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read().decode(errors="replace")
                with open(f"/proc/{entry}/statm", "rb") as fh:
                    pages = int(fh.read().split()[1])
            except (OSError, ValueError, IndexError):
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            pid = int(entry)
            parents[pid] = int(fields[1])
            rss[pid] = pages * self._page
        total = 0
        for pid, size in rss.items():
            p, hops = pid, 0
            while p > 1 and hops < 64:
                if p == self.root:
                    total += size
                    self.peak_single = max(self.peak_single, size)
                    break
                p, hops = parents.get(p, 0), hops + 1
        self.peak_tree = max(self.peak_tree, total)

    def run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self._sample()
            self._stop.wait(self.interval)


_CURRENT: list[subprocess.Popen[str]] = []


def stream(
    cmd: list[str],
    env: dict[str, str],
    rep: Reporter,
    parse: bool = True,
    cwd: str | None = None,
    on_line: Callable[[str], None] | None = None,
    sampler: bool = False,
) -> tuple[int, dict[str, int]]:
    """Run ``cmd`` in its own session, echo its output line by line; return (exit code, rss facts in bytes)."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        cwd=cwd,
        bufsize=1,
        start_new_session=True,
    )
    _CURRENT.append(proc)
    smp = RssSampler(proc.pid) if sampler else None
    if smp is not None:
        smp.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            text = raw.rstrip("\n")
            rep.line(text)
            if on_line is not None and parse:
                on_line(text)
        rc = proc.wait()
    finally:
        _CURRENT.remove(proc)
        if smp is not None:
            smp.stop()
    facts = {"tree": smp.peak_tree if smp else 0, "single": smp.peak_single if smp else 0}
    return rc, facts


def _terminate(signum: int, frame: Any) -> None:
    for proc in list(_CURRENT):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)
    raise KeyboardInterrupt


def rusage_wrap(out_path: str, cmd: list[str]) -> int:
    """``--rusage-wrap OUT -- cmd``: run cmd, write the peak RSS (KiB) of its process tree's largest member."""
    rc = subprocess.call(cmd)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    Path(out_path).write_text(json.dumps({"maxrss_kb": usage.ru_maxrss, "rc": rc}), encoding="utf-8")
    return rc if rc >= 0 else 128 - rc


# ---------------------------------------------------------------------------------------------- build


class NinjaParser:
    """Follows ninja's ``[N/M] cmd`` and ``FAILED:`` lines, and setup-hook events."""

    def __init__(self, rep: Reporter) -> None:
        self.rep = rep
        self.finished: list[str] = []
        self.failures: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None
        self.sources_event: dict[str, Any] | None = None
        self.units_total: int | None = None
        self.other_errors: list[str] = []

    @staticmethod
    def unit_name(cmd: str) -> str:
        """The source file a compile command compiles (torch's commands say ``-c -c SRC -o OBJ``)."""
        m = re.search(r"\s(\S+\.(?:cu|cpp|cc|cxx|c|hip))\s+-o\s", cmd) or re.search(r"\s-o\s+(\S+)", cmd)
        name = m.group(1) if m else (cmd.split() or ["?"])[-1]
        return os.path.basename(name.strip("'\""))

    def __call__(self, raw: str) -> None:
        line = raw.strip()  # pip -v indents the build's output by two spaces
        if line.startswith(EVENT_PREFIX):
            with contextlib.suppress(ValueError):
                ev = json.loads(line[len(EVENT_PREFIX) :])
                if ev.get("event") == "sources":
                    self.sources_event = ev
                    self.units_total = len(ev.get("compile", [])) + len(ev.get("prebuilt", []))
            return
        m = NINJA_STATUS_RE.match(line)
        if m:
            self._current = None
            done, total, cmd = int(m.group(1)), int(m.group(2)), m.group(3)
            name = self.unit_name(cmd)
            self.finished.append(name)
            self.rep.event("unit", done=done, total=total, name=name, units_total=self.units_total)
            return
        m = FAILED_RE.match(line)
        if m:
            obj = m.group(2).split()[0] if m.group(2).split() else "?"
            code = int(m.group(1)) if m.group(1) else None
            self._current = {
                "unit": os.path.basename(obj),
                "object": obj,
                "command": None,
                "lines": [],
                "code": code,
            }
            self.failures.append(self._current)
            if (
                self.finished
            ):  # ninja printed this edge's [N/M] line as it finished (failed): not a compiled unit
                self.finished.pop()
            return
        if line.startswith("ninja: build stopped") or line.startswith("ninja: error"):
            self._current = None
            self.other_errors.append(line)
            return
        if self._current is not None:
            if self._current["command"] is None and re.search(r"\s-c\s", line):
                self._current["command"] = line
                self._current["unit"] = self.unit_name(line)
            else:
                self._current["lines"].append(line)
        elif ERROR_LINE_RE.search(line) and (
            "undefined reference" in line or "ld:" in line or "error:" in line
        ):
            self.other_errors.append(line)

    def failure_summary(self, oom_killed: bool = False) -> tuple[str, dict[str, Any]]:
        """Classify the failure: ("oom"|"compile"|"other", details).

        A failed unit counts as killed when its output names a kill (``Killed``, signal 9, ...), or is empty
        (the compiler died without a word), or the cgroup's OOM-kill counter rose (``oom_killed``); but never
        when it also shows a real compiler error.
        """
        for fail in self.failures:
            lines = [ln for ln in fail["lines"] if ln]
            real = [
                ln for ln in lines if re.search(r"\berror\b", ln, re.IGNORECASE) and not OOM_RE.search(ln)
            ]
            first = next((i for i, ln in enumerate(lines) if ERROR_LINE_RE.search(ln)), 0)
            fail["error_lines"] = lines[first : first + 20]
            killed = (
                bool(OOM_RE.search("\n".join(lines)))
                or not lines
                or oom_killed
                or fail.get("code") in (137, -9)
            )
            fail["oom"] = killed and not real
        real = [f for f in self.failures if not f["oom"]]
        if real:
            f = real[0]
            return "compile", {"unit": f["unit"], "lines": f["error_lines"]}
        if self.failures:
            f = self.failures[0]
            return "oom", {"unit": f["unit"], "lines": f["lines"][-10:]}
        return "other", {"lines": self.other_errors[-20:]}


def arch_numbers(arches: list[str]) -> list[str]:
    """["sm_90", "sm_100a"] -> ["90", "100a"]."""
    out = []
    for a in arches:
        m = re.fullmatch(r"(?:sm_|compute_)?(\d+)([af]?)", str(a))
        if not m:
            raise BuildFailure(EXIT_CONFIG, f"unknown CUDA arch {a!r} (expected like sm_90)")
        out.append(m.group(1) + m.group(2))
    return out


def torch_arch_list(nums: list[str]) -> str:
    """["90", "100a"] -> "9.0 10.0a"."""
    out = []
    for n in nums:
        digits = n.rstrip("af")
        out.append(f"{digits[:-1]}.{digits[-1]}{n[len(digits) :]}")
    return " ".join(out)


def auto_max_jobs(spec: dict[str, Any]) -> int:
    if spec["max_jobs"]:
        return max(1, int(spec["max_jobs"]))
    cpus = os.cpu_count() or 1
    avail_gb = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail_gb = int(line.split()[1]) / 1024 / 1024
    limit = cgroup_memory_limit_gb()
    if limit:
        avail_gb = min(avail_gb or limit, limit)
    by_mem = int(avail_gb // float(spec["job_mem_gb"])) if avail_gb else cpus
    return max(1, min(cpus, by_mem))


def cgroup_oom_kills() -> int:
    """The cgroup's OOM-kill counter (v2 memory.events, v1 memory.oom_control); 0 when unknown."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(path).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def cgroup_memory_limit_gb() -> float | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            raw = Path(path).read_text().strip()
            if raw != "max" and int(raw) < (1 << 60):
                return int(raw) / 1024**3
    return None


# ---------------------------------------------------------------------------------------------- host compiler

# A C++ exception thrown by torch (TORCH_CHECK in libc10) must unwind through code this compiler built and
# reach Python as RuntimeError: that is how a flash-attn wheel reports a head dim or dtype it was built
# without. Seen on a GPU machine: a gcc wrapper in /opt/gcc (named by CC/CXX) that links its own crt files
# made every such exception a SIGSEGV, and AOTInductor packages crashed on load the same way.
CXX_PROBE = r"""
import sys
from torch.utils.cpp_extension import load_inline
src = '''
#include <torch/extension.h>
namespace probe { inline void bad(int d) { TORCH_CHECK(false, "attnforge probe: excluded head dim ", d); } }
int64_t dispatch(int64_t d) {
  return [&] {
    if (d <= 32) { if constexpr (false) { return int64_t(1); } else { probe::bad(int(d)); } }
    return int64_t(2);
  }();
}
'''
m = load_inline("attnforge_cxx_probe", cpp_sources=[src], functions=["dispatch"], build_directory=sys.argv[1])
assert m.dispatch(64) == 2
try:
    m.dispatch(16)
except RuntimeError as exc:
    print("RAISED", str(exc).splitlines()[0], flush=True)
"""
CXX_PROBE_FILE = ".attnforge-cxx-probe.json"
FALLBACK_CXX = ("/usr/bin/g++", "/usr/bin/c++")


def c_compiler_for(cxx: str) -> str | None:
    """The C compiler beside a C++ one (``.../g++`` -> ``.../gcc``, ``c++`` -> ``cc``), when it exists."""
    head, name = os.path.split(cxx)
    for plus, plain in (("clang++", "clang"), ("g++", "gcc"), ("c++", "cc")):
        if name.endswith(plus):
            cand = os.path.join(head, name[: -len(plus)] + plain)
            return cand if shutil.which(cand) else None
    return None


def compiler_identity(cxx: str) -> str | None:
    """``realpath | first line of --version``; None when ``cxx`` does not run."""
    exe = shutil.which(cxx.split()[-1])
    if not exe:
        return None
    try:
        first = run_capture([exe, "--version"], timeout=60).splitlines()[0]
    except (RuntimeError, OSError, IndexError, subprocess.TimeoutExpired):
        return None
    return f"{os.path.realpath(exe)} | {first}"


def probe_cxx(vpy: str, cxx: str, env: dict[str, str], work: Path) -> str:
    """'' when an exception thrown through torch from code ``cxx`` built reaches Python, else why not."""
    penv = dict(env, CXX=cxx, TORCH_NO_COMPILER_WRAPPER="1")
    penv["PATH"] = os.pathsep.join([str(Path(vpy).parent), env.get("PATH", "/usr/bin:/bin")])  # ninja
    cc = c_compiler_for(cxx.split()[-1])
    if cc:
        penv["CC"] = cc
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cxx-probe-", dir=work) as tmp:
        try:
            proc = subprocess.run([vpy, "-X", "faulthandler", "-c", CXX_PROBE, tmp], env=penv,
                                  capture_output=True, text=True, timeout=900)  # fmt: skip
        except subprocess.TimeoutExpired:
            return "the probe extension hung for 15 min"
    if proc.returncode == 0 and "RAISED" in proc.stdout:
        return ""
    if proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        return f"a C++ exception thrown through torch killed the process with {sig}"
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip() and len(ln) < 300]
    tail = " | ".join(lines[-2:])
    return f"the probe extension did not build or raise (exit {proc.returncode}): {tail}"


def choose_host_compiler(
    vpy: str, venv_dir: Path, env: dict[str, str], rep: Reporter, fallbacks: tuple[str, ...] = FALLBACK_CXX
) -> dict[str, Any]:
    """The C++ compiler for torch's extension build: ``$CXX`` (else ``c++``) when it passes ``CXX_PROBE``,
    else the first fallback that does (with a warning). Results are cached per compiler in the venv.
    Raises BuildFailure(EXIT_ENV) when none passes."""
    first = env.get("CXX") or "c++"
    cache_path = venv_dir / CXX_PROBE_FILE
    try:
        cache: dict[str, str] = json.loads(cache_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    tried: list[tuple[str, str]] = []
    seen: set[str] = set()
    for cxx in (first, *fallbacks):
        ident = compiler_identity(cxx)
        if ident is None or ident.split(" | ")[0] in seen:
            continue
        seen.add(ident.split(" | ")[0])
        why = cache.get(ident)
        if why is None:
            rep.line(f"attnforge: checking that C++ exceptions from {cxx}-built code reach Python")
            why = probe_cxx(vpy, cxx, env, venv_dir)
            cache[ident] = why
            with contextlib.suppress(OSError):
                cache_path.write_text(json.dumps(cache, indent=1), encoding="utf-8")
        tried.append((cxx, why))
        if not why:
            if cxx != first:
                rep.line(f"attnforge: warning: {first}: {tried[0][1]}; building with {cxx} instead")
            return {"cxx": cxx, "cc": c_compiler_for(cxx.split()[-1]), "switched": cxx != first,
                    "rejected": {c: w for c, w in tried if w}}  # fmt: skip
    detail = "; ".join(f"{c}: {w}" for c, w in tried) or f"{first} does not run"
    raise BuildFailure(EXIT_ENV, f"no usable host C++ compiler ({detail}); set CXX/CC to a working g++")


def toolchain(cuda_home: str | None, tinfo: dict[str, Any], cxx: str | None = None) -> dict[str, str | None]:
    nvcc = None
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        with contextlib.suppress(RuntimeError, OSError):
            out = run_capture([os.path.join(cuda_home, "bin", "nvcc"), "--version"])
            m = re.search(r"V(\d+\.\d+\.\d+)", out)
            nvcc = m.group(1) if m else None
    gcc = None
    with contextlib.suppress(RuntimeError, OSError):
        gcc = run_capture([(cxx or os.environ.get("CXX", "c++")).split()[-1], "-dumpfullversion"])
    return {"nvcc": nvcc, "gcc": gcc, "python": tinfo.get("python"), "torch": tinfo.get("torch")}


def kernel_objects_manifest(spec: dict[str, Any], tool: dict[str, str | None]) -> dict[str, Any]:
    """What must match for prebuilt kernel objects to be reused (Python is deliberately absent)."""
    return {
        "kernel": spec["kernel"],
        "kernel_version": spec["kernel_version"],
        "source_sha256": spec["source"]["sha256"].lower(),
        "kernel_set_key": spec["kernel_set_key"],
        "arches": list(spec["arches"]),
        "profile_flags": list(spec["profile_flags"]),
        "torch": tool.get("torch"),
        "nvcc": tool.get("nvcc"),
        "cxx11_abi": bool(spec["cxx11_abi"]),
        "nvcc_append_flags": spec["nvcc_append_flags"],
    }


def usable_prebuilt(spec: dict[str, Any], ident: dict[str, Any], rep: Reporter) -> Path | None:
    d = spec["kernel_objects_dir"]
    if not d or not is_flash_attn(spec):
        return None
    manifest = Path(d) / "manifest.json"
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except ValueError:
        return None
    if data.get("identity") != ident:
        rep.line(f"attnforge: kernel objects in {d} were built for something else; compiling")
        return None
    return Path(d)


def save_kernel_objects(
    spec: dict[str, Any], tree: Path, compiled: list[str], ident: dict[str, Any], py_tag: str, rep: Reporter
) -> bool:
    """Copy the compiled kernel (.cu) objects to kernel_objects_dir, atomically; True when saved."""
    dest = Path(spec["kernel_objects_dir"])
    if (dest / "manifest.json").is_file():
        return False
    kernels = [s for s in compiled if s.endswith(".cu")]
    if not kernels:
        return False
    temps = sorted(tree.glob(f"build/temp.*-{py_tag}"))
    if not temps:
        rep.line(f"attnforge: no build/temp.*-{py_tag} directory; kernel objects not saved")
        return False
    objects: dict[str, str] = {}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp", dir=str(dest.parent)))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; other users' builds read it
    try:
        for src in kernels:
            obj = temps[0] / (os.path.splitext(src)[0] + ".o")
            if not obj.is_file():
                rep.line(f"attnforge: missing object {obj}; kernel objects not saved")
                return False
            name = os.path.basename(str(obj))
            shutil.copyfile(obj, tmp / name)
            objects[src] = name
        (tmp / "manifest.json").write_text(
            json.dumps(
                {"schema": 1, "identity": ident, "objects": objects, "created_by": spec["cell_id"]}, indent=1
            ),
            encoding="utf-8",
        )
        try:
            os.rename(tmp, dest)
        except OSError:
            return False  # another cell saved them first
        rep.line(f"attnforge: saved {len(objects)} kernel objects to {dest}")
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_env(
    spec: dict[str, Any],
    vpy: str,
    tree: Path,
    sdist: Path,
    max_jobs: int,
    prebuilt: Path | None,
    auto_wrap: bool = False,
) -> dict[str, str]:
    env = pip_env(spec, dict(os.environ))
    venv_bin = str(Path(vpy).parent)
    cuda_home = env.get("CUDA_HOME") or ("/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None)
    path = [venv_bin]
    if cuda_home:
        env["CUDA_HOME"] = cuda_home
        path.append(os.path.join(cuda_home, "bin"))
    env["PATH"] = os.pathsep.join([*path, env.get("PATH", "/usr/bin:/bin")])
    env["MAX_JOBS"] = str(max_jobs)
    env["NVCC_THREADS"] = str(int(spec["nvcc_threads"]))
    nums = arch_numbers(list(spec["arches"]))
    if nums:
        env["TORCH_CUDA_ARCH_LIST"] = torch_arch_list(nums)
    epoch = spec["source_date_epoch"] or sdist_epoch(sdist)
    env["SOURCE_DATE_EPOCH"] = str(int(epoch))
    if spec["nvcc_append_flags"]:
        env["NVCC_APPEND_FLAGS"] = str(spec["nvcc_append_flags"])
    if is_flash_attn(spec):
        env["FLASH_ATTENTION_FORCE_BUILD"] = "TRUE"
        env["FLASH_ATTENTION_SKIP_CUDA_BUILD"] = "FALSE"
        env["BUILD_TARGET"] = "cuda"
        if nums:
            env["FLASH_ATTN_CUDA_ARCHS"] = ";".join(nums)
        env["FLASH_ATTENTION_FORCE_CXX11_ABI"] = "TRUE" if spec["cxx11_abi"] else "FALSE"
        if spec["local_version"]:
            env["FLASH_ATTN_LOCAL_VERSION"] = str(spec["local_version"])
        flags = list(spec["profile_flags"])
        if not spec["backward"] and "-DFLASHATTENTION_DISABLE_BACKWARD" not in flags:
            flags.append("-DFLASHATTENTION_DISABLE_BACKWARD")
        env["ATTNFORGE_DEFINES"] = " ".join(flags)
        env["ATTNFORGE_HEAD_DIMS"] = ",".join(str(d) for d in (spec["head_dims"] or []))
        env["ATTNFORGE_DTYPES"] = ",".join(spec["dtypes"] or [])
        env["ATTNFORGE_DROP_BACKWARD"] = "0" if spec["backward"] else "1"
        env["ATTNFORGE_PREBUILT_OBJECTS"] = str(prebuilt) if prebuilt else ""
    cc = spec["ccache"]
    if cc and shutil.which("ccache", path=env["PATH"]):
        env["CCACHE_DIR"] = str(cc["dir"])
        env["CCACHE_MAXSIZE"] = str(cc.get("max_size", "20G"))
        env["CCACHE_BASEDIR"] = str(tree)
        env["CCACHE_NOHASHDIR"] = "true"
        env["CCACHE_COMPILERCHECK"] = "content"
        if not auto_wrap and cuda_home:
            # Older torch: wrap nvcc ourselves (CXX="ccache c++" would fail torch's compiler version check).
            env["PYTORCH_NVCC"] = "ccache " + os.path.join(cuda_home, "bin", "nvcc")
    else:
        # torch >= 2.14 prepends ccache/sccache by itself when one is on PATH, with the default cache dir
        # (inside a --rm container: thrown away); attnforge decides: no spec.ccache, no wrapper.
        env["TORCH_NO_COMPILER_WRAPPER"] = "1"
    for key, value in (spec["env"] or {}).items():
        env[str(key)] = str(value)
    return env


def ccache_stats(env: dict[str, str]) -> dict[str, int]:
    """ccache's counters (hits, misses, uncacheable) for ``CCACHE_DIR``; empty when ccache is not in use."""
    if "CCACHE_DIR" not in env:
        return {}
    try:
        out = run_capture(["ccache", "--print-stats"], env=env, timeout=60)
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return {}
    raw: dict[str, int] = {}
    for line in out.splitlines():
        key, _, value = line.partition("\t")
        if value.strip().isdigit():
            raw[key] = int(value)
    return {
        "hits": raw.get("direct_cache_hit", 0) + raw.get("preprocessed_cache_hit", 0),
        "misses": raw.get("cache_miss", 0),
        "uncacheable": sum(
            v for k, v in raw.items() if k.startswith(("unsupported", "could_not", "compiler_"))
        ),
    }


def count_ninja_units(tree: Path, py_tag: str) -> int | None:
    for ninja in sorted(tree.glob(f"build/temp.*-{py_tag}/build.ninja")):
        text = ninja.read_text(encoding="utf-8", errors="replace")
        return len(re.findall(r"^build \S+\.o: (?:cuda_)?compile ", text, re.MULTILINE))
    return None


def import_check(vpy: str, wheel: Path, names: list[str], workdir: Path, rep: Reporter) -> dict[str, Any]:
    """Unpack the wheel and import its modules with the venv's torch; also look for undefined kernel symbols."""
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
                ln.split(None, 1)[-1] for ln in out.splitlines() if "flash::" in ln or "run_mha" in ln
            ]
    ok = proc.returncode == 0 and not undefined
    return {"ok": ok, "output": output[-4000:], "undefined_kernel_symbols": undefined[:20], "modules": names}


def build(spec: dict[str, Any], rep: Reporter, result: dict[str, Any]) -> None:
    """The whole cell; fills ``result`` as it goes and raises BuildFailure on errors."""
    times: dict[str, float] = result["stages"]
    out_dir = Path(spec["output_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    with Stage(rep, times, "source"):
        sdist = fetch_source(spec, rep)
    patches = resolve_patches(spec)
    result["patches_applied"] = patches
    with Stage(rep, times, "unpack"):
        tree = prepare_tree(spec, sdist, patches, rep)
    base_env = dict(os.environ)
    with Stage(rep, times, "venv"):
        venv = ensure_venv(spec, rep, base_env)
    vpy = venv["vpy"]
    problem = variant_mismatch(str(spec["torch_variant"] or ""), venv)
    if problem:
        raise BuildFailure(EXIT_ENV, problem)
    result["venv_reused"] = venv["reused"]
    cuda_home = base_env.get("CUDA_HOME") or ("/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None)
    host_cxx: dict[str, Any] = {}
    if spec["cxx_probe"]:
        with Stage(rep, times, "compiler"):
            host_cxx = choose_host_compiler(vpy, Path(spec["venv_dir"]), base_env, rep)
    tool = toolchain(cuda_home, venv, host_cxx.get("cxx"))
    result["toolchain"] = tool
    result["host_compiler"] = host_cxx
    if is_flash_attn(spec) and not tool["nvcc"] and not venv.get("hip"):
        raise BuildFailure(EXIT_ENV, f"no nvcc under CUDA_HOME={cuda_home}")
    if venv.get("cuda") and tool["nvcc"] and venv["cuda"].split(".")[0] != tool["nvcc"].split(".")[0]:
        raise BuildFailure(
            EXIT_ENV, f"nvcc {tool['nvcc']} and torch's CUDA {venv['cuda']} differ in major version"
        )
    py_tag = "cpython-" + "".join(str(venv["python"]).split(".")[:2])
    ident = kernel_objects_manifest(spec, tool)
    prebuilt = usable_prebuilt(spec, ident, rep)
    result["kernel_objects"] = {
        "dir": spec["kernel_objects_dir"],
        "reused": prebuilt is not None,
        "saved": False,
    }
    max_jobs = auto_max_jobs(spec)
    result["max_jobs"] = max_jobs
    result["nvcc_threads"] = int(spec["nvcc_threads"])
    env = build_env(spec, vpy, tree, sdist, max_jobs, prebuilt, auto_wrap=bool(venv.get("auto_wrap")))
    if host_cxx.get("switched") or (host_cxx and "CXX" in base_env):
        env["CXX"] = host_cxx["cxx"]
        if host_cxx.get("cc"):
            env["CC"] = host_cxx["cc"]  # torch passes CC to nvcc as -ccbin
    dist = Path(spec["build_dir"]) / "dist"
    if dist.exists():
        shutil.rmtree(dist)
    dist.mkdir(parents=True)
    rusage_out = Path(spec["build_dir"]) / f"rusage-{os.getpid()}.json"
    pip_cmd = [
        vpy,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--use-pep517",  # the legacy path runs `setup.py clean --all` after a failure: no resume
        "--no-deps",
        "-v",
        "-w",
        str(dist),
        str(tree),
    ]
    cmd = [sys.executable, os.path.abspath(__file__), "--rusage-wrap", str(rusage_out), "--", *pip_cmd]
    parser = NinjaParser(rep)
    rep.line("attnforge: " + " ".join(pip_cmd) + f"  (MAX_JOBS={max_jobs})")
    oom_before = cgroup_oom_kills()
    cc_before = ccache_stats(env)
    with Stage(rep, times, "compile"):
        rc, rss = stream(cmd, env, rep, cwd=str(tree), on_line=parser, sampler=True)
    cc_after = ccache_stats(env)
    if cc_after:
        result["ccache"] = {k: cc_after[k] - cc_before.get(k, 0) for k in cc_after}
    maxrss_kb = 0
    with contextlib.suppress(OSError, ValueError):
        maxrss_kb = int(json.loads(rusage_out.read_text())["maxrss_kb"])
        rusage_out.unlink()
    result["peak_rss_gb"] = round(max(maxrss_kb * 1024, rss["single"]) / 1024**3, 2)
    result["peak_tree_rss_gb"] = round(rss["tree"] / 1024**3, 2)
    ev = parser.sources_event or {}
    prebuilt_units = len(ev.get("prebuilt", []))
    ninja_units = count_ninja_units(tree, py_tag)
    compiled_now = len(parser.finished)
    total = parser.units_total if parser.units_total is not None else ninja_units
    result["units_total"] = total
    result["units_compiled"] = compiled_now
    result["units_reused"] = (total - compiled_now) if total is not None and rc == 0 else None
    result["units_prebuilt"] = prebuilt_units
    if rc != 0:
        kind, details = parser.failure_summary(oom_killed=cgroup_oom_kills() > oom_before)
        if kind == "oom" or (kind == "other" and rc in (137, -9)):
            rep.event("error", kind="oom", **details)
            raise BuildFailure(
                EXIT_OOM,
                f"a compiler was killed (likely out of memory) in unit {details.get('unit')}; "
                f"rerun with fewer max_jobs (now {max_jobs}) in the same build_dir",
                kind="oom",
                **details,
            )
        if kind == "compile":
            rep.line(f"attnforge: compile error in unit {details['unit']}:")
            for ln in details["lines"]:
                rep.line("    " + ln)
            rep.event("error", kind="compile", **details)
            raise BuildFailure(
                EXIT_BUILD, f"compile error in unit {details['unit']}", kind="compile", **details
            )
        rep.event("error", kind="build", rc=rc, **details)
        raise BuildFailure(EXIT_BUILD, f"build failed (pip exit {rc})", kind="build", rc=rc, **details)
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildFailure(EXIT_BUILD, f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    if spec["kernel_objects_dir"] and prebuilt is None and is_flash_attn(spec):
        result["kernel_objects"]["saved"] = save_kernel_objects(
            spec, tree, list(ev.get("compile", [])), ident, py_tag, rep
        )
    final = out_dir / wheels[0].name
    shutil.copyfile(wheels[0], final)
    result["wheel"] = str(final)
    result["wheel_name"] = final.name
    result["size"] = final.stat().st_size
    result["sha256"] = sha256_file(final)
    if spec["import_check"]:
        names = list(spec["import_names"] or (FLASH_ATTN_IMPORTS if is_flash_attn(spec) else []))
        with Stage(rep, times, "import_check"):
            chk = import_check(vpy, final, names, Path(spec["build_dir"]), rep)
        result["import_check"] = chk
        if not chk["ok"]:
            raise BuildFailure(
                EXIT_IMPORT, "the built extension does not import: " + chk["output"][-500:], kind="import"
            )


def main(argv: list[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["--rusage-wrap"]:
        sep = args_in.index("--")
        return rusage_wrap(args_in[1], args_in[sep + 1 :])
    ap = argparse.ArgumentParser(description="Build one attnforge cell's wheel (stdlib only).")
    ap.add_argument("--spec", required=True, type=Path, help="cell spec JSON")
    args = ap.parse_args(args_in)
    start = time.monotonic()
    result: dict[str, Any] = {
        "schema": 1,
        "ok": False,
        "exit_code": None,
        "stages": {},
        "wheel": None,
        "error": None,
    }
    rep = Reporter(None)
    spec: dict[str, Any] = {}
    signal.signal(signal.SIGTERM, _terminate)
    code = EXIT_OK
    try:
        spec = load_spec(args.spec)
        result["cell_id"] = spec["cell_id"]
        rep = Reporter(Path(spec["output_dir"]) / "build.log")
        rep.line(f"attnforge: building {spec['cell_id'] or spec['kernel']} in {spec['build_dir']}")
        build(spec, rep, result)
        result["ok"] = True
    except BuildFailure as exc:
        code = exc.code
        result["error"] = {"message": exc.message, **exc.details}
        rep.line(f"attnforge: error: {exc.message}")
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
        result["error"] = {"message": "interrupted", "kind": "interrupted"}
    except Exception as exc:  # a bug or an unexpected OS error: still leave a result.json behind
        import traceback

        code = EXIT_INTERNAL
        result["error"] = {"message": f"internal error: {exc!r}", "kind": "internal"}
        for ln in traceback.format_exc().splitlines():
            rep.line(ln)
    result["exit_code"] = code
    result["wall_s"] = round(time.monotonic() - start, 1)
    if spec.get("output_dir"):
        out = Path(spec["output_dir"]) / "result.json"
        with contextlib.suppress(OSError):
            out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    rep.event(
        "result",
        **{
            k: result.get(k)
            for k in (
                "ok",
                "exit_code",
                "wheel",
                "wall_s",
                "peak_rss_gb",
                "units_total",
                "units_compiled",
                "units_reused",
            )
        },
    )
    rep.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
