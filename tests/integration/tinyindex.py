"""A small published index of real (tiny) wheels, for the index page, yank, pip and uv tests (no mocks).

- Tiny flash-attn wheels: a `flash_attn` package of one module (no compiled code), written with
  `attnforge.wheels.wheelio.write_wheel` (the `wheel` project's WheelFile) as a build would leave it
  (`flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl` + the build engine's manifest), then `attnforge wheels
  finalize` gives each its local version, its `Requires-Dist: torch==X.Y.*` and its finalized manifest.
  One stable-ABI wheel (`cp310-abi3`, `torch>=2.10`) too.
- A stand-in `torch` (2.14.1+cu130 and 2.13.0+cu130, pure Python, a few attributes the environment probe
  reads: `__version__`, `version.cuda`, `_C._GLIBCXX_USE_CXX11_ABI`, `cuda.is_available()`), as a PEP 503
  folder index: what pip and uv resolve the wheels' torch pin against, so nothing comes from the public index
  and no CUDA torch is downloaded.
- A project (matrix.yaml next to wheels/, its own site key in keys/: `signing.key`) published with `attnforge
  publish --to local`: every wheel signed by `wheels finalize` (provenance and SBOM beside it, docs/records.md),
  one with a passed parity run (in its manifest: device, driver, date, report URL; and a signed parity record),
  one yanked with `attnforge yank`; its plan has cells refused by a rule (CUDA 12.4 for torch 2.13/2.14) and
  valid cells not built (Python 3.12).

Built once per test session (about 10 s: five `wheels finalize` runs).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from attnforge.parity.parity_statement import sign_run
from attnforge.wheels.manifest import record_parity
from attnforge.wheels.signing_keys import KEY_ENV, TRUSTED_ENV, generate_key
from attnforge.wheels.wheelio import Member, write_wheel
from tests.integration.wheelfactory import cli

EPOCH = 1700000000
V214 = "2.8.3+cu130torch2.14cxx11abiTRUE"
V213 = "2.8.3+cu130torch2.13cxx11abiTRUE"
V214_FWD = "2.8.3+cu130torch2.14cxx11abiTRUE.fwd128"
V_STABLE = "2.8.3+cu130sm90torch2.10abi3.hd128"
YANK_REASON = "wrong output for head dim 128 with causal masks"
REPORT_URL = "https://ci.example.org/runs/4711/parity.md"
TORCHES = ("2.14.1+cu130", "2.13.0+cu130")
PARITY_REPORT = {
    "device": "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)",
    "torch": "2.14.1+cu130",
    "wheel": f"flash_attn-{V214}-cp311-cp311-linux_x86_64.whl",
    "profile": "full",
    "python": "cp311",
    "passed": 12,
    "failed": 0,
    "skipped": 1,
    "cases": [{"kernel": "flash_attn_func", "dtype": "bf16", "shape": "b2 s128 h4 d64", "ok": True}],
}

MATRIX = """\
version: 1
kernels: {flash-attn: {version: "2.8.3"}}
profiles:
  full: {description: "upstream's wheel"}
  hd128: {description: "all features, head dim 128 only", head_dims: [128]}
  fwd128: {description: "forward only, head dim 128, bf16", tag: fwd128, head_dims: [128], dtypes: [bf16],
           disable: [backward, dropout, alibi, softcap, uneven_k, local]}
defaults: {kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: full, arch: [sm_90]}
targets:
  release:
    matrix: {toolkit: [cuda12.4, cuda13.0], torch: ["2.13.0", "2.14.1"], python: ["3.11", "3.12"]}
    include:
      - {toolkit: cuda13.0, torch: "2.14.1", python: "3.11", profile: fwd128}
  stable:
    abi: stable
    matrix: {toolkit: [cuda13.0], torch: ["2.11", "2.12"], python: ["3.11", "3.12"], profile: [hd128]}
destinations:
  local: {kind: static, path: wheels/index, require_parity: false}
signing: {key: keys/site.pem}
"""


@dataclass(frozen=True)
class TinyIndex:
    """The published project: its folder, the index in it, the wheels by version, the stand-in torch index."""

    project: Path
    wheels: dict[str, Path]  # version -> finalized wheel (outside the index)
    torch_index: Path  # a PEP 503 folder: <torch_index>/torch/index.html

    @property
    def index(self) -> Path:
        return self.project / "wheels" / "index"

    def sha256(self, version: str) -> str:
        return hashlib.sha256(self.wheels[version].read_bytes()).hexdigest()


def _raw_manifest(name: str, torch: str, profile: str, extra: dict[str, Any]) -> dict[str, Any]:
    """What the build engine writes beside a freshly built wheel (docs/contracts.md)."""
    return {
        "schema": 1,
        "cell_id": f"flash-attn-2.8.3-cu130-torch{torch}-cp311-abi1-sm90-{profile}-x86_64",
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "wheel": name,
        "sha256": None,
        "size": None,
        "inputs": {
            "source": "path",
            "source_sha256": None,
            "toolkit": "cuda13.0",
            "torch": torch,
            "torch_variant": "cu130",
            "python": "3.11",
            "cxx11_abi": True,
            "arches": ["sm_90"],
            "profile": profile,
            "profile_flags": [],
            "head_dims": None,
            "patches": [],
            **extra,
        },
        "kernel_set_key": "0" * 16,
        "input_hash": "0" * 16,
        "toolchain": {"python": "3.11", "torch": torch},
        "build": {"backend": "local", "wall_s": 0.0},
        "platform_tag": None,
        "parity": None,
    }


def signing_env(key: Path) -> dict[str, str]:
    """This environment with `key` as the site key (and no trusted keys named by another module)."""
    env = {k: v for k, v in os.environ.items() if k != TRUSTED_ENV}
    env[KEY_ENV] = str(key)
    return env


def tiny_wheel(
    out: Path, torch: str, profile: str = "full", *, stable: bool = False, env: dict[str, str]
) -> Path:
    """A raw tiny flash-attn wheel and its build manifest, finalized (and signed) by the CLI; the finalized
    wheel."""
    tag = "cp310-abi3-linux_x86_64" if stable else "cp311-cp311-linux_x86_64"
    raw = out / f"raw-{torch}-{profile}"
    dist_info = "flash_attn-2.8.3.dist-info"
    members = {
        "flash_attn/__init__.py": Member(
            f'__version__ = "2.8.3"\nBUILT_FOR = "torch {torch} {profile}"\n'.encode()
        ),
        f"{dist_info}/METADATA": Member(
            b"Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3\nRequires-Python: >=3.9\n\n"
        ),
        f"{dist_info}/WHEEL": Member(
            f"Wheel-Version: 1.0\nGenerator: tinyindex\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
        ),
    }
    wheel = write_wheel(raw, f"flash_attn-2.8.3-{tag}.whl", dist_info, members, EPOCH)
    extra: dict[str, Any] = {"profile_tag": profile} if profile not in ("full", "hd128") else {}
    if stable:
        extra.update(torch_floor="2.10", abi3_python="3.10")
    manifest = _raw_manifest(wheel.name, torch, profile, extra)
    wheel.with_name(wheel.name + ".manifest.json").write_text(json.dumps(manifest, indent=2))
    proc = cli(
        "wheels",
        "finalize",
        wheel,
        "--out-dir",
        out / "final",
        env=dict(env, SOURCE_DATE_EPOCH=str(EPOCH)),
    )
    return Path(proc.stdout.strip().splitlines()[-1])


def torch_stand_in(root: Path) -> Path:
    """A PEP 503 folder index holding the stand-in torch releases; returns its root."""
    project = root / "torch"
    links = []
    for version in TORCHES:
        dist_info = f"torch-{version}.dist-info"
        members = {
            "torch/__init__.py": Member(
                f'__version__ = "{version}"\nfrom torch import _C, cuda, version\n'.encode()
            ),
            "torch/version.py": Member(b'cuda = "13.0"\nhip = None\n'),
            "torch/_C.py": Member(b"_GLIBCXX_USE_CXX11_ABI = True\n"),
            "torch/cuda.py": Member(b"def is_available():\n    return False\n"),
            f"{dist_info}/METADATA": Member(
                f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n\n".encode()
            ),
            f"{dist_info}/WHEEL": Member(
                b"Wheel-Version: 1.0\nGenerator: tinyindex\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            ),
        }
        wheel = write_wheel(project, f"torch-{version}-py3-none-any.whl", dist_info, members, EPOCH)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        links.append(f'<a href="{wheel.name.replace("+", "%2B")}#sha256={digest}">{wheel.name}</a><br>')
    (project / "index.html").write_text(
        "<!DOCTYPE html>\n<html><body>\n" + "\n".join(links) + "\n</body></html>\n"
    )
    (root / "index.html").write_text(
        '<!DOCTYPE html>\n<html><body><a href="torch/">torch</a></body></html>\n'
    )
    return root


def build_tiny_index(root: Path) -> TinyIndex:
    """Finalize the wheels, publish them, record a parity run on one and yank another (see the docstring)."""
    made = root / "made"
    project = root / "project"
    key_path = project / "keys" / "site.pem"
    key = generate_key(key_path)  # the project's own key, never this user's local one
    env = signing_env(key_path)
    with ThreadPoolExecutor(max_workers=2) as pool:  # each finalize is a CLI run with auditwheel: ~2 s
        futures = {
            V214: pool.submit(tiny_wheel, made, "2.14.1", env=env),
            V213: pool.submit(tiny_wheel, made, "2.13.0", env=env),
            V214_FWD: pool.submit(tiny_wheel, made, "2.14.1", "fwd128", env=env),
            V_STABLE: pool.submit(tiny_wheel, made, "2.11.0", "hd128", stable=True, env=env),
        }
        wheels = {version: future.result() for version, future in futures.items()}
    for version, wheel in wheels.items():
        assert wheel.name.startswith(f"flash_attn-{version}-"), (version, wheel.name)
    record_parity(
        wheels[V214].with_name(wheels[V214].name + ".manifest.json"),
        True,
        "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)",
        REPORT_URL,
        "2026-11-20T10:00:00+00:00",
        driver="580.65.06",
    )
    report = root / "parity.json"  # what `attnforge parity run` leaves; the run's outcome, signed
    report.write_text(json.dumps(PARITY_REPORT))
    sign_run(wheels[V214], report, key, report_ref=REPORT_URL)
    (project / "wheels").mkdir(parents=True)
    (project / "matrix.yaml").write_text(MATRIX)
    for wheel in wheels.values():  # the wheel, its manifest, its signed records and SBOM
        for f in wheel.parent.glob(glob.escape(wheel.name) + "*"):
            (project / "wheels" / f.name).write_bytes(f.read_bytes())
    cli("publish", "--to", "local", cwd=project, env=env)
    cli("yank", wheels[V214_FWD].name, "--reason", YANK_REASON, cwd=project, env=env)
    return TinyIndex(project, wheels, torch_stand_in(root / "torch-index"))


@pytest.fixture(scope="session")
def tiny_index(tmp_path_factory: pytest.TempPathFactory) -> TinyIndex:
    return build_tiny_index(tmp_path_factory.mktemp("tinyindex"))
