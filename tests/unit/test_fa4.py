"""FA4 ahead of time without a GPU: declarations, the stack's cells and rules, the fingerprint, the wheel
(its pins, its RECORD, a real pip install into a fresh venv) and, through the installed wheel's ``.pth``
hook, seeding and the stale / foreign-GPU / off cases against a STAND-IN FA4 (``flash_attn.cute`` with a
``cache_utils`` and ``interface`` of a few lines: the real FA4 imports the CUDA-only CuTe DSL)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from attnforge.cli import main as cli_main
from attnforge.fa4 import declare
from attnforge.fa4.package import PackageError, build_wheel, wheel_version
from attnforge.fa4.runtime import check, fingerprint, sources_digest
from attnforge.matrix import fa4_cells

CACHE_UTILS = """\
import os, tempfile, types
from pathlib import Path
from getpass import getuser
cutlass = types.SimpleNamespace(__version__=os.environ.get("STANDIN_CUTLASS", "4.8.1"))
tvm_ffi = types.SimpleNamespace(__version__="0.1.15.post2")
CUTE_DSL_CACHE_ENABLED = os.getenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "0") == "1"
CUTE_DSL_CACHE_DIR = os.getenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", None)
def get_cache_path():
    p = Path(CUTE_DSL_CACHE_DIR) if CUTE_DSL_CACHE_DIR else Path(tempfile.gettempdir()) / getuser() / "fa4c"
    p.mkdir(parents=True, exist_ok=True)
    return p
def _compute_source_fingerprint():
    import sys
    from attnforge_fa4.fingerprint import fingerprint
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return fingerprint(Path(__file__).resolve().parent, py, cutlass.__version__, tvm_ffi.__version__)
"""
INTERFACE = '''\
import os
from flash_attn.cute import cache_utils
def _get_device_arch():
    return int(os.environ.get("STANDIN_ARCH", "90"))
def first_call():
    """'loaded' when FA4 would find the entry on disk, else 'compiled'."""
    _get_device_arch()
    if not cache_utils.CUTE_DSL_CACHE_ENABLED:
        return "compiled"
    p = cache_utils.get_cache_path() / cache_utils._compute_source_fingerprint() / "fwd" / "k1.o"
    return "loaded" if p.is_file() else "compiled"
'''


def _standin(root: Path) -> Path:
    cute = root / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "__init__.py").write_text("from flash_attn.cute import interface\n")
    (cute / "cache_utils.py").write_text(CACHE_UTILS)
    (cute / "interface.py").write_text(INTERFACE)
    return cute


def _artifacts(tmp: Path, cute: Path) -> Path:
    art = tmp / "artifacts"
    (art / "cache" / "fwd").mkdir(parents=True)
    entry = b"\x7fELF stand-in object " * 40
    (art / "cache" / "fwd" / "k1.o").write_bytes(entry)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    pins = {
        "flash-attn-4": "4.0.0b36",
        "nvidia-cutlass-dsl": "4.8.1",
        "apache-tvm-ffi": "0.1.15.post2",
        "quack-kernels": "0.6.5",
        "nvidia-cutlass-dsl-libs-cu13": "4.8.1",
    }
    manifest = {
        "format": 1,
        "fingerprint": fingerprint(cute, py, "4.8.1", "0.1.15.post2"),
        "env": {
            "python": py,
            "flash_attn_4": "4.0.0b36",
            "cutlass": "4.8.1",
            "tvm_ffi": "0.1.15.post2",
            "sources_sha256": sources_digest(cute),
            "pins": pins,
            "cuda_major": "13",
            "arch": 90,
            "gpu": "stand-in",
            "torch": "2.11.0+cu130",
            "cuda": "13.0",
        },
        "declarations": [{"name": "gqa-causal-bf16", "entries": ["fwd/k1.o"]}],
        "entries": {"fwd/k1.o": {"sha256": hashlib.sha256(entry).hexdigest(), "size": len(entry)}},
    }
    (art / "manifest.json").write_text(json.dumps(manifest))
    return art


def test_declarations_parse_and_refuse_with_the_field() -> None:
    ds = declare.parse_all(declare.DEFAULTS)
    assert ds[0].gqa_ratio == 4
    assert ds[0].describe() == "D128 bf16 causal H32/8 B2 S2048 fwd+bwd"
    for bad, words in (
        ({"name": "x", "head_dim": 80}, "head_dim 80"),
        ({"name": "x", "heads_q": 12, "heads_kv": 5}, "not a multiple"),
        ({"name": "x", "dtype": "fp8"}, "dtype"),
        ({"name": "x", "window": 3}, r"unknown field\(s\) window"),
        ({"name": "x", "training": "yes"}, "training must be true or false"),
    ):
        with pytest.raises(declare.DeclarationError, match=words):
            declare.parse(bad)
    with pytest.raises(declare.DeclarationError, match="used twice"):
        declare.parse_all([{"name": "a"}, {"name": "a"}])


def test_stack_cells_and_rules() -> None:
    assert fa4_cells.rules(fa4_cells.Cell(13, (2, 11), (3, 12), 90)) == []
    assert fa4_cells.rules(fa4_cells.Cell(13, (2, 11), (3, 12), 80))[0].startswith("[fa4-arch]")
    assert fa4_cells.rules(fa4_cells.Cell(13, (2, 10), (3, 12), 90))[0].startswith("[fa4-torch]")
    assert fa4_cells.rules(fa4_cells.Cell(12, (2, 12), (3, 12), 100))[0].startswith("[fa4-torch-cuda]")
    assert fa4_cells.rules(fa4_cells.Cell(13, (2, 11), (3, 9), 120))[0].startswith("[fa4-python]")
    assert fa4_cells.rules(fa4_cells.Cell(12, (2, 8), (3, 12), 90), [13])[0].startswith("[fa4-cuda]")
    valid = [c.id for c, why in fa4_cells.cells() if not why]
    assert "fa4-cu13-torch2.11-py3.12-sm90" in valid and all("sm80" not in v for v in valid)


def test_fingerprint_follows_what_fa4_hashes(tmp_path: Path) -> None:
    cute = _standin(tmp_path)
    fp = fingerprint(cute, "3.12", "4.8.1", "0.1.15.post2")
    assert fp == fingerprint(cute, "3.12", "4.8.1", "0.1.15.post2")
    assert fp != fingerprint(cute, "3.13", "4.8.1", "0.1.15.post2")
    assert fp != fingerprint(cute, "3.12", "4.8.2", "0.1.15.post2")
    (cute / "__pycache__").mkdir()
    (cute / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"bytecode")
    assert fingerprint(cute, "3.12", "4.8.1", "0.1.15.post2") == fp  # bytecode is not hashed
    digest = sources_digest(cute)
    (cute / "utils.py").write_text("# changed\n")
    assert fingerprint(cute, "3.12", "4.8.1", "0.1.15.post2") != fp
    assert sources_digest(cute) != digest


def test_check_names_what_differs(tmp_path: Path) -> None:
    cute = _standin(tmp_path)
    manifest = json.loads((_artifacts(tmp_path, cute) / "manifest.json").read_text())
    py = manifest["env"]["python"]
    assert check(manifest, cute, py, "4.8.1", "0.1.15.post2").ok
    r = check(manifest, cute, py, "4.9.0", "0.1.15.post2")
    assert not r.ok and r.reasons == ["nvidia-cutlass-dsl 4.9.0 here, built with 4.8.1"]
    (cute / "mask.py").write_text("x = 1\n")
    assert "FA4's sources" in check(manifest, cute, py, "4.8.1", "0.1.15.post2").reason


def test_wheel_pins_the_fingerprint_inputs(tmp_path: Path) -> None:
    cute = _standin(tmp_path)
    art = _artifacts(tmp_path, cute)
    whl = build_wheel(art, tmp_path / "dist")
    py = "".join(map(str, sys.version_info[:2]))
    assert whl.name == f"attnforge_fa4_kernels-0.1.0+fa4v4.0.0b36.cu13.sm90-py{py}-none-any.whl"
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith("METADATA"))).decode()
        record = zf.read(next(n for n in names if n.endswith("RECORD"))).decode()
        assert zf.read("attnforge_fa4.pth") == b"import attnforge_fa4._auto\n"
    assert "attnforge_fa4/artifacts/cache/fwd/k1.o" in names
    for pin in (
        "flash-attn-4==4.0.0b36",
        "nvidia-cutlass-dsl==4.8.1",
        "apache-tvm-ffi==0.1.15.post2",
        "quack-kernels==0.6.5",
        "nvidia-cutlass-dsl-libs-cu13==4.8.1",
    ):
        assert f"Requires-Dist: {pin}" in meta
    assert f"Requires-Python: =={sys.version_info.major}.{sys.version_info.minor}.*" in meta
    assert len(record.splitlines()) == len(names)
    assert wheel_version(json.loads((art / "manifest.json").read_text())) == "0.1.0+fa4v4.0.0b36.cu13.sm90"
    (art / "cache" / "fwd" / "k1.o").write_bytes(b"tampered")
    with pytest.raises(PackageError, match="does not match its sha256"):
        build_wheel(art, tmp_path / "dist2")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A fresh venv with the wheel pip-installed (no deps: FA4's stack is the stand-in) and the stand-in FA4."""
    tmp = tmp_path_factory.mktemp("fa4wheel")
    cute = _standin(tmp / "standin")
    whl = build_wheel(_artifacts(tmp, cute), tmp / "dist")
    env = tmp / "venv"
    venv.create(env, with_pip=False, symlinks=True)
    py = env / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(whl),
        ],
        check=True,
    )
    return py, tmp / "standin", cute


def _run(installed: tuple[Path, Path, Path], tmp: Path, **env: str) -> dict[str, object]:
    py, standin, _ = installed
    code = (
        "import warnings, json, os; warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    import flash_attn.cute as fa; used = fa.interface.first_call()\n"
        "print(json.dumps({'used': used, 'warnings': [str(x.message) for x in w],\n"
        "    'enabled': os.environ.get('FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED')}))"
    )
    base = {
        "PYTHONPATH": str(standin),
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(tmp / "cache"),
        "HOME": str(tmp),
    }
    p = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env={**base, **env})
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout))


def test_installed_wheel_seeds_fa4s_cache_with_no_line(
    installed: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    r = _run(installed, tmp_path)
    assert r == {"used": "loaded", "warnings": [], "enabled": "1"}
    assert len(list((tmp_path / "cache").rglob("k1.o"))) == 1
    assert _run(installed, tmp_path)["used"] == "loaded"  # second process: already there


def test_stale_stack_warns_once_and_compiles(installed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    r = _run(installed, tmp_path, STANDIN_CUTLASS="4.9.0")
    assert r["used"] == "compiled"
    assert r["warnings"] == [
        "attnforge_fa4: the precompiled FA4 kernels do not fit this environment (nvidia-cutlass-dsl 4.9.0 here, "
        "built with 4.8.1); FA4 compiles at the first call as usual"
    ]
    assert not list((tmp_path / "cache").rglob("*.o"))


def test_foreign_gpu_and_switches(installed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    r = _run(installed, tmp_path / "a", STANDIN_ARCH="100")
    warned = r["warnings"]
    assert (
        isinstance(warned, list) and len(warned) == 1 and "built for sm_90, this GPU is sm_100" in warned[0]
    )
    off = _run(installed, tmp_path / "b", ATTNFORGE_FA4="0")
    assert off == {"used": "compiled", "warnings": [], "enabled": None}
    disabled = _run(installed, tmp_path / "c", FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="0")
    assert disabled["used"] == "compiled" and "is not 1" in str(disabled["warnings"])


def test_cli_plan_and_package_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["fa4", "plan", "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert any(c["cell"] == "fa4-cu13-torch2.11-py3.12-sm90" and c["valid"] for c in cells)
    assert cli_main(["fa4", "package", str(tmp_path)]) == 4
    assert "no readable manifest.json" in capsys.readouterr().err
