"""The per-cell builder (the package src/attnforge/builder), for real, in the cuda-builder image.

The docker tests build tests/integration/data/tinyext (a one-kernel torch CUDA extension with three compile
units) with CUDA 13.0 from PyPI wheels and torch from this machine's pip configuration: wheel produced and
importable, an OOM-killed compiler (nvcc SIGKILLed by a test double) gives exit 75 and the rerun resumes,
a compile error names its unit. The venv and the builder image are cached between runs (first run: about
40 s for the image and 70 s for the venv; then about 3 min on 2 cores). The other tests need no Docker.

Environment: ATTNFORGE_TEST_CACHE (default .attnforge-cache/tests), ATTNFORGE_TEST_BUILDER_IMAGE (an existing
image to use instead of building one), ATTNFORGE_FA_SDIST (flash_attn-2.8.3.tar.gz for the patch test and
the slow build).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from attnforge.builder.exits import EVENT_PREFIX, EXIT_BUILD, EXIT_CONFIG, EXIT_OOM, BuildFailure
from attnforge.builder.files import sha256_file
from attnforge.builder.knobs import arch_numbers, torch_arch_list
from attnforge.builder.ninja import NinjaParser
from attnforge.builder.objects import identity
from attnforge.builder.patches import PATCHES_DIR, apply_patch, resolve_patches
from attnforge.builder.report import Reporter
from attnforge.builder.source import prepare_tree
from attnforge.builder.spec import BuildSpec, Source
from attnforge.builder.torchenv import variant_mismatch
from attnforge.core.docker_cli import docker_executable
from attnforge.core.errors import EnvironmentProblem
from attnforge.core.package_files import packaged_docker_dir
from attnforge.engine.backends.debian_base import bootstrap_debian_base, image_id
from attnforge.engine.sources import _download as download
from attnforge.matrix.source_lock import sdist_url

ROOT = Path(__file__).resolve().parents[2]
BUILDER_PKG = ROOT / "src" / "attnforge" / "builder"
TINYEXT = Path(__file__).resolve().parent / "data" / "tinyext"
DOCKER = docker_executable()  # ATTNFORGE_DOCKER, as attnforge itself
BASE = "local/debian:bookworm"
CA = Path("/etc/ssl/certs/ca-certificates.crt")
FA_SHA256 = "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"
FA_DISABLE = ("BACKWARD", "DROPOUT", "ALIBI", "SOFTCAP", "UNEVEN_K", "LOCAL")


def cache_root() -> Path:
    path = Path(os.environ.get("ATTNFORGE_TEST_CACHE", ROOT / ".attnforge-cache" / "tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def fa_sdist() -> Path | None:
    """flash-attn 2.8.3's sdist: $ATTNFORGE_FA_SDIST, else a per-user cache filled once from the package index
    (8.4 MB, checked against FA_SHA256). None only where the index can't be reached outside CI: in CI the tests
    that need it run, they never skip for want of it."""
    env = os.environ.get("ATTNFORGE_FA_SDIST")
    if env and Path(env).is_file():
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cached = base / "attnforge" / "sources" / "flash_attn-2.8.3.tar.gz"
    if not cached.is_file():
        try:
            url, _ = sdist_url("flash-attn", "2.8.3")
            download(url, cached)
        except EnvironmentProblem as exc:
            if os.environ.get("CI"):
                raise
            print(f"flash-attn 2.8.3 sdist not reachable: {exc}")
            return None
        if sha256_file(cached) != FA_SHA256:
            cached.unlink()
            raise AssertionError(f"{url}: sha256 differs from FA_SHA256")
    return cached


def host_pip() -> tuple[list[str], list[Path]]:
    """pip arguments from this machine's pip config, and the local paths they name (mounted read-only)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    conf: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        conf[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
    args: list[str] = []
    paths: list[Path] = []
    for flag, key in (("--index-url", "index-url"), ("--extra-index-url", "extra-index-url")):
        for url in conf.get(key, "").split():
            args += [flag, url]
            if urlparse(url).scheme == "file":
                paths.append(Path(urlparse(url).path).parent)
    for link in conf.get("find-links", "").split():
        args += ["--find-links", link]
        paths.append(Path(urlparse(link).path if "://" in link else link))
    if conf.get("constraint"):
        args += ["--constraint", conf["constraint"]]
        paths.append(Path(conf["constraint"]))
    return args, [p for p in paths if p.exists()]


def make_sdist(src: Path, dest: Path) -> tuple[Path, str]:
    """tar.gz of a source folder (one top-level folder, like an sdist) and its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(src, arcname=src.name, filter=lambda ti: None if "__pycache__" in ti.name else ti)
    return dest, hashlib.sha256(dest.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def builder_image() -> str:
    """The cuda-builder image (local Debian base, CUDA 13.0 from PyPI); built once, then reused."""
    override = os.environ.get("ATTNFORGE_TEST_BUILDER_IMAGE")
    if override:
        return override
    bootstrap_debian_base(BASE)
    digest = hashlib.sha256((packaged_docker_dir() / "cuda-builder.Dockerfile").read_bytes()).hexdigest()[:12]
    tag = f"attnforge/cuda-builder:test-cu130-{digest}"
    if image_id(tag) is not None:
        return tag
    cmd = [DOCKER, "build", "-f", str(packaged_docker_dir() / "cuda-builder.Dockerfile"), "--network", "host"]
    cmd += [
        "--build-arg",
        f"BASE_IMAGE={BASE}",
        "--build-arg",
        "CUDA_FROM=pypi",
        "--build-arg",
        "CUDA_VERSION=13.0",
    ]
    if CA.exists():
        cmd += ["--secret", f"id=ca_bundle,src={CA}"]
    cmd += ["-t", tag, str(packaged_docker_dir())]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tag


@pytest.fixture(scope="session")
def tinyext_sdist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return make_sdist(TINYEXT, tmp_path_factory.mktemp("sdist") / "tinyext-0.1.0.tar.gz")


class Builder:
    """Runs the builder in the builder image with the mounts the docker backend uses."""

    def __init__(self, image: str, workdir: Path) -> None:
        self.image = image
        self.workdir = workdir
        self.cache = cache_root()
        self.pip_args, self.pip_paths = host_pip()

    def spec(self, name: str, sdist: tuple[Path, str], **fields: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "cell_id": f"test-{name}",
            "kernel": "tinyext",
            "kernel_version": "0.1.0",
            "source": {"path": str(sdist[0]), "sha256": sdist[1]},
            "python": "3.11",
            "torch": "2.14.1",
            "pip_args": self.pip_args,
            "pip_env": {"PIP_CERT": "/run/secrets/ca_bundle"} if CA.exists() else {},
            "pip_cache_dir": str(self.cache / "pip"),
            "build_dir": str(self.workdir / name / "build"),
            "venv_dir": str(self.cache / "venvs" / "bookworm-cp311-torch2.14.1"),
            "output_dir": str(self.workdir / name / "out"),
            "arches": ["sm_90"],
            "max_jobs": 2,
            "import_names": ["tinyext_cuda", "tinyext"],
        }
        spec.update(fields)
        return BuildSpec.from_json(spec).to_json()  # the spec type's own check and defaults

    def run(
        self, spec: dict[str, Any], *docker_args: str, timeout: int = 900
    ) -> tuple[int, str, dict[str, Any]]:
        spec_path = Path(spec["output_dir"]).parent / "spec.json"
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(json.dumps(spec, indent=1))
        mounts = {
            str(self.cache): "rw",
            str(self.workdir): "rw",
            str(Path(spec["source"]["path"]).parent): "ro",
        }
        mounts.update({str(p): "ro" for p in self.pip_paths})
        cmd = [DOCKER, "run", "--rm", "--network", "host", "-e", "PIP_CONFIG_FILE=/dev/null"]
        for path, mode in mounts.items():
            cmd += ["-v", f"{path}:{path}:{mode}"]
        cmd += ["-v", f"{BUILDER_PKG}:/opt/attnforge/builder:ro", "--workdir", "/opt/attnforge"]
        if CA.exists():
            cmd += ["-v", f"{CA}:/run/secrets/ca_bundle:ro"]
        cmd += [
            *docker_args,
            self.image,
            "python3",
            "-m",
            "builder",
            "--spec",
            str(spec_path),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        output = proc.stdout + proc.stderr
        result_path = Path(spec["output_dir"]) / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
        return proc.returncode, output, result


@pytest.fixture
def builder(builder_image: str, tmp_path: Path) -> Builder:
    return Builder(builder_image, tmp_path)


def events(output: str, kind: str) -> list[dict[str, Any]]:
    out = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith(EVENT_PREFIX):
            ev = json.loads(line[len(EVENT_PREFIX) :])
            if ev.get("event") == kind:
                out.append(ev)
    return out


# ------------------------------------------------------------------------------------------ docker: tinyext


@pytest.mark.docker
def test_tinyext_wheel_builds_and_imports(builder: Builder, tinyext_sdist: tuple[Path, str]) -> None:
    ccache = str(builder.workdir / "ccache")
    # ccache must see nvcc itself, not the test double (torch wraps nvcc only when PYTORCH_NVCC is unset)
    real_nvcc = {"PYTORCH_NVCC": "ccache /usr/local/cuda/bin/nvcc"}
    rc, output, result = builder.run(builder.spec("ok", tinyext_sdist, ccache_dir=ccache, env=real_nvcc))
    assert rc == 0, output[-4000:]
    assert result["ccache"]["misses"] == 3 and result["ccache"]["hits"] == 0
    assert result["ok"] and result["exit_code"] == 0
    wheel = Path(result["wheel"])
    assert wheel.name == "tinyext-0.1.0-cp311-cp311-linux_x86_64.whl" and wheel.is_file()
    assert result["units_total"] == 3 and result["units_compiled"] == 3 and result["units_reused"] == 0
    assert result["import_check"]["ok"], result["import_check"]
    assert re.fullmatch(r"13\.0\.\d+", result["toolchain"]["nvcc"])
    assert result["toolchain"]["torch"].startswith("2.14.1")
    assert result["peak_rss_gb"] > 0 and result["wall_s"] > 0
    units = events(output, "unit")
    assert [u["done"] for u in units] == [1, 2, 3] and {u["total"] for u in units} == {3}
    assert {u["name"] for u in units} == {"ext.cpp", "kernel_a.cu", "kernel_b.cu"}
    stages = {e["stage"] for e in events(output, "stage") if e["status"] == "done"}
    assert {"source", "unpack", "venv", "compile", "import_check"} <= stages
    assert (Path(result["wheel"]).parent / "build.log").is_file()

    # the same cell in another build dir: every unit comes from ccache (CCACHE_BASEDIR makes paths relative)
    rc, output, again = builder.run(builder.spec("ok-again", tinyext_sdist, ccache_dir=ccache, env=real_nvcc))
    assert rc == 0, output[-4000:]
    assert again["ccache"]["hits"] == 3 and again["ccache"]["misses"] == 0


@pytest.mark.docker
def test_killed_compiler_exits_75_and_rerun_resumes(
    builder: Builder, tinyext_sdist: tuple[Path, str]
) -> None:
    killing = builder.spec("oom", tinyext_sdist, max_jobs=1, env={"TINYEXT_KILL_UNIT": "kernel_b.cu"})
    rc, output, result = builder.run(killing)
    assert rc == EXIT_OOM, output[-4000:]
    assert result["error"]["kind"] == "oom" and result["error"]["unit"] == "kernel_b.cu"
    assert "rerun with fewer max_jobs" in output
    objects = list(Path(killing["build_dir"]).glob("src/tinyext/build/temp.*/csrc/*.o"))
    assert 0 < len(objects) < 3, objects  # the units before the killed one finished

    rc, output, result = builder.run(builder.spec("oom", tinyext_sdist, max_jobs=1))
    assert rc == 0, output[-4000:]
    assert "reusing unpacked tree" in output
    assert result["units_total"] == 3
    assert result["units_compiled"] == 3 - len(objects)  # resumed: only what had not finished
    assert result["units_reused"] == len(objects)
    assert [u["name"] for u in events(output, "unit")] == ["kernel_b.cu"]


@pytest.mark.docker
def test_compile_error_names_the_unit(builder: Builder, tinyext_sdist: tuple[Path, str]) -> None:
    rc, output, result = builder.run(builder.spec("err", tinyext_sdist, env={"TINYEXT_BREAK": "1"}))
    assert rc == EXIT_BUILD, output[-4000:]
    assert "compile error in unit kernel_b.cu" in output
    assert result["error"]["kind"] == "compile" and result["error"]["unit"] == "kernel_b.cu"
    assert any("deliberate compile error" in ln for ln in result["error"]["lines"])
    assert any(e["kind"] == "compile" for e in events(output, "error"))


@pytest.mark.docker
def test_sha256_mismatch_is_a_configuration_error(builder: Builder, tinyext_sdist: tuple[Path, str]) -> None:
    spec = builder.spec("sha", tinyext_sdist)
    spec["source"]["sha256"] = "0" * 64
    rc, _output, result = builder.run(spec)
    assert rc == EXIT_CONFIG
    assert "sha256 mismatch" in result["error"]["message"]


# ------------------------------------------------------------------------------------------ no docker


def test_ninja_parser_classifies_kills_and_errors() -> None:
    rep = Reporter(None)
    cmd = "/usr/local/cuda/bin/nvcc -I/x -c -c /s/csrc/k.cu -o /b/temp/csrc/k.o -O3"
    killed = NinjaParser(rep)
    for line in [
        "  [1/2] c++ -c -c /s/a.cpp -o /b/a.o",
        "  [2/2] " + cmd,
        "  FAILED: [code=137] /b/temp/csrc/k.o",
        "  " + cmd,
        "  Killed",
        "  ninja: build stopped: subcommand failed.",
    ]:
        killed(line)
    assert killed.finished == ["a.cpp"]
    assert killed.failure_summary() == ("oom", {"unit": "k.cu", "lines": ["Killed"]})

    cicc = NinjaParser(rep)
    for line in ["FAILED: /b/temp/csrc/k.o", cmd, "nvcc error   : 'cicc' died due to signal 9 (Kill signal)"]:
        cicc(line)
    assert cicc.failure_summary()[0] == "oom"

    broken = NinjaParser(rep)
    for line in [
        "FAILED: /b/temp/csrc/k.o",
        cmd,
        "/s/csrc/k.cu(6): error: identifier x is undefined",
        "1 error",
    ]:
        broken(line)
    kind, details = broken.failure_summary()
    assert kind == "compile" and details["unit"] == "k.cu"
    assert details["lines"][0].endswith("identifier x is undefined")


def test_spec_round_trips_and_names_what_is_wrong(tmp_path: Path) -> None:
    spec = BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source("/s/fa.tar.gz", "ab"),
        python="3.11",
        torch="2.14.1",
        build_dir="/b",
        venv_dir="/v",
        output_dir="/o",
        arches=["sm_90"],
        disable=["backward", "dropout"],
        head_dims=[128],
    )
    path = tmp_path / "spec.json"
    path.write_text(spec.dumps())
    assert BuildSpec.load(path) == spec
    assert not spec.backward and arch_numbers(spec.arches) == ["90"]
    assert resolve_patches(spec) == ["setup-hooks", "dispatch-subset"]
    for change, message in [
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"max_jobs": "4"}, "spec.max_jobs: '4' is not int"),
        ({"python": "python3"}, "spec.python must be like 3.12"),
        ({"source": {"path": "/x"}}, "spec.source needs path and sha256"),
        ({"schema": 1}, "spec schema 1 is not 2"),
    ]:
        with pytest.raises(BuildFailure, match=re.escape(message)) as exc:
            BuildSpec.from_json({**spec.to_json(), **change})
        assert exc.value.code == EXIT_CONFIG
    without = spec.to_json()
    del without["build_dir"]
    with pytest.raises(BuildFailure, match="spec lacks build_dir"):
        BuildSpec.from_json(without)


def test_torch_variant_is_checked() -> None:
    gpu = {"torch": "2.14.1+cu130", "cuda": "13.0", "hip": None}
    assert variant_mismatch("cu130", gpu) is None
    assert "cu128" in (variant_mismatch("cu128", gpu) or "")
    assert variant_mismatch("cpu", gpu) is not None
    assert variant_mismatch("cpu", {"torch": "2.13.0+cpu", "cuda": None, "hip": None}) is None


def test_kernel_object_identity_leaves_out_torch_only_for_torch_free_kernels() -> None:
    base = BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source("/s", FA_SHA256),
        python="3.11",
        torch="2.14.1",
        build_dir="/b",
        venv_dir="/v",
        output_dir="/o",
    )
    here = {"nvcc": "13.0.88", "torch": "2.14.1+cu130"}
    there = {"nvcc": "13.0.48", "torch": "2.11.0+cu130"}  # another torch and nvcc 13.0 release
    free = base.replace(patches=["torch-free-kernels"])
    assert identity(free, here) == identity(free, there) and identity(free, here)["nvcc"] == "13.0"
    assert identity(base, here) != identity(base, there)
    assert identity(free, here) != identity(free, {**here, "nvcc": "13.1.0"})


def test_arch_names() -> None:
    assert arch_numbers(["sm_90", "sm_100a", "120"]) == ["90", "100a", "120"]
    assert torch_arch_list(["90", "100a"]) == "9.0 10.0a"


def test_setup_hook_filters_kernel_units() -> None:
    sys.path.insert(0, str(PATCHES_DIR))
    try:
        import setup_hook
    finally:
        sys.path.pop(0)
    keep = setup_hook.keep_source
    src = "csrc/flash_attn/src/flash_{}_hdim{}_{}{}_sm80.cu"
    assert keep("csrc/flash_attn/flash_api.cpp", {128}, {"bf16"}, True)
    assert keep(src.format("fwd", 128, "bf16", "_causal"), {128}, {"bf16"}, True)
    assert keep(src.format("fwd_split", 128, "bf16", ""), {128}, {"bf16"}, True)
    assert not keep(src.format("fwd", 64, "bf16", ""), {128}, {"bf16"}, True)
    assert not keep(src.format("fwd", 128, "fp16", ""), {128}, {"bf16"}, True)
    assert not keep(src.format("bwd", 128, "bf16", ""), {128}, {"bf16"}, True)
    assert keep(src.format("bwd", 128, "bf16", ""), {128}, {"bf16"}, False)
    assert keep(src.format("fwd", 64, "fp16", ""), set(), set(), False)


@pytest.mark.skipif(fa_sdist() is None, reason="flash_attn-2.8.3.tar.gz not found (set ATTNFORGE_FA_SDIST)")
def test_patches_apply_to_flash_attn_2_8_3(tmp_path: Path) -> None:
    sdist = fa_sdist()
    assert sdist is not None
    spec = BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source(str(sdist), FA_SHA256),
        python="3.11",
        torch="2.14.1",
        build_dir=str(tmp_path),
        venv_dir="/v",
        output_dir="/o",
        patches=["cxx20"],
        head_dims=[128],
        dtypes=["bf16"],
        disable=["backward"],
    )
    names = resolve_patches(spec)
    assert names == ["cxx20", "setup-hooks", "dispatch-subset"]
    tree = prepare_tree(spec, sdist, names, Reporter(None))
    setup_py = (tree / "setup.py").read_text()
    assert '"-std=c++17"' not in setup_py.split("elif not SKIP_CUDA_BUILD and IS_ROCM")[0]
    assert "attnforge_setup_hook.apply(ext_modules)" in setup_py
    api = (tree / "csrc" / "flash_attn" / "flash_api.cpp").read_text()
    assert '#include "attnforge_dispatch.h"' in api and "ATTNFORGE_BWD_CALL(run_mha_bwd_<" in api
    assert (tree / "csrc" / "flash_attn" / "attnforge_dispatch.h").is_file()
    # a second call finds the same tree (resume) instead of unpacking again
    marker = tree / "marker"
    marker.write_text("x")
    assert prepare_tree(spec, sdist, names, Reporter(None)) == tree and marker.exists()
    # and a patch that does not match fails loudly
    with pytest.raises(BuildFailure, match="found 0"):
        apply_patch(tree, PATCHES_DIR, "cxx20", spec, Reporter(None))


# ------------------------------------------------------------------------------------------ slow: flash-attn


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.skipif(fa_sdist() is None, reason="flash_attn-2.8.3.tar.gz not found (set ATTNFORGE_FA_SDIST)")
def test_flash_attn_narrow_profile_and_second_python(builder: Builder, tmp_path: Path) -> None:
    """hd128 bf16 forward-only for sm_90 (about 6 min on 2 cores), then Python 3.12 reusing its kernels."""
    sdist = fa_sdist()
    assert sdist is not None
    py312 = sorted(Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")).glob("versions/3.12.*/bin/python3.12"))
    kernels = tmp_path / "kernels" / "hd128fwd-bf16-sm90"
    common: dict[str, Any] = {
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "source": {"path": str(sdist), "sha256": FA_SHA256},
        "patches": ["cxx20"],
        "disable": [d.lower() for d in FA_DISABLE],
        "head_dims": [128],
        "dtypes": ["bf16"],
        "kernel_objects_dir": str(kernels),
        "kernel_set_key": "test-hd128fwd",
        "local_version": "cu130torch2.14cxx11abiTRUE.hd128fwd",
        "import_names": ["flash_attn_2_cuda", "flash_attn"],
    }
    rc, output, result = builder.run(builder.spec("fa311", (sdist, FA_SHA256), **common), "--memory", "14g")
    assert rc == 0, output[-4000:]
    assert (
        result["wheel_name"]
        == "flash_attn-2.8.3+cu130torch2.14cxx11abitrue.hd128fwd-cp311-cp311-linux_x86_64.whl"
    )
    assert result["units_total"] == 5 and result["import_check"]["ok"]
    assert result["kernel_objects"]["saved"] and (kernels / "manifest.json").is_file()
    if not py312:
        pytest.skip("no pyenv Python 3.12 to mount for the second cell")
    prefix = py312[-1].parent.parent
    spec = builder.spec(
        "fa312",
        (sdist, FA_SHA256),
        python=str(py312[-1]),
        torch="2.14.1",
        venv_dir=str(builder.cache / "venvs" / "pyenv-cp312-torch2.14.1"),
        **common,
    )
    rc, output, result = builder.run(spec, "-v", f"{prefix}:{prefix}:ro")
    assert rc == 0, output[-4000:]
    assert (
        result["kernel_objects"]["reused"] and result["units_prebuilt"] == 4 and result["units_compiled"] == 1
    )
    assert result["wheel_name"].endswith("-cp312-cp312-linux_x86_64.whl")
