"""The glibc floor on real ELF files compiled here (g++ 12 on glibc 2.36): a shared object whose libstdc++ code
reads `__libc_single_threaded` (GLIBC_2.32) and calls `std::__throw_bad_array_new_length` (GLIBCXX_3.4.29) is
refused under torch's manylinux_2_28 floor, naming the symbol and the member; linked with the builder's hidden
definitions it needs nothing above GLIBC_2.14 and GLIBCXX_3.4.24."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.builder.glibc_floor import SHIM_SYMBOLS, link_shim, shim_object, wheel_tags
from attnforge.core.errors import BuildError
from attnforge.wheels.glibc_floor import check_contents, floor_policy
from attnforge.wheels.manifest import manifest_path_for
from attnforge.wheels.wheelio import Member, WheelContents, write_wheel

# shared_ptr copies: libstdc++'s ext/atomicity.h asks glibc whether the process is single-threaded;
# a vector of n (at -O0): std::allocator's size check throws through std::__throw_bad_array_new_length;
# dlsym: in libc from glibc 2.34 on (torch's stable-ABI headers call it)
SOURCE = """
#include <dlfcn.h>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>
std::shared_ptr<std::string> make(const char* s) { return std::make_shared<std::string>(s); }
long use(std::shared_ptr<std::string> p) { auto q = p; return q.use_count(); }
std::vector<float> zeros(std::size_t n) { return std::vector<float>(n); }
extern "C" void* find(const char* name) { return dlsym(RTLD_DEFAULT, name); }
extern "C" void* find_next(const char* name) { return dlsym(RTLD_NEXT, name); }
"""
TORCH_TAGS = ["cp311-cp311-manylinux_2_28_x86_64"]
MEMBER = "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def compile_so(tmp_path: Path, name: str, extra: list[str]) -> bytes:
    src = tmp_path / "ext.cpp"
    src.write_text(SOURCE)
    out = tmp_path / name
    subprocess.run(["g++", "-O0", "-fPIC", "-shared", *extra, str(src), "-o", str(out)], check=True)
    return out.read_bytes()


def contents(data: bytes) -> WheelContents:
    dist_info = "flash_attn-2.8.3.dist-info"
    return WheelContents("flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl", dist_info, {MEMBER: Member(data)})


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def glibc() -> tuple[int, ...]:
    out = subprocess.run(["ldd", "--version"], capture_output=True, text=True, check=True).stdout
    return version(out.splitlines()[0].rsplit(" ", 1)[1])


def test_a_symbol_above_the_floor_is_refused_by_name(tmp_path: Path) -> None:
    if glibc() < (2, 32):
        pytest.skip("this glibc has no __libc_single_threaded")
    data = compile_so(tmp_path, "plain.so", [])
    with pytest.raises(BuildError) as err:
        check_contents(contents(data), TORCH_TAGS, "x86_64")
    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 4
    assert f"{MEMBER} needs __libc_single_threaded@GLIBC_2.32 from libc.so.6" in message
    assert (
        "above manylinux_2_28_x86_64, the floor of the torch wheel it pins (and 2 more above it)" in message
    )


def test_the_builder_shim_keeps_the_object_inside_the_floor(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "LDFLAGS": "-Wl,-O1"}
    obj = shim_object(None, tmp_path, env)
    link_shim(env, obj)
    link_shim(env, obj)  # once only
    assert env["LDFLAGS"].split()[:2] == ["-Wl,-O1", str(obj)] and env["LDFLAGS"].count(str(obj)) == 1
    data = compile_so(tmp_path, "shimmed.so", env["LDFLAGS"].split())
    found = check_contents(contents(data), TORCH_TAGS, "x86_64")
    assert found.floor == "manylinux_2_28_x86_64"
    assert version(found.highest["GLIBC"]) <= (2, 14) and version(found.highest["GLIBCXX"]) <= (3, 4, 24)
    # the definition stays inside the object: nothing exported, nothing needed from glibc for it
    dyn = subprocess.run(["nm", "-D", str(tmp_path / "shimmed.so")], capture_output=True, text=True).stdout
    assert dyn and not [s for s in SHIM_SYMBOLS[:2] if s in dyn]
    assert "dlsym@GLIBC_2.2.5" in dyn  # the wrapper calls glibc's under its base version
    lib = ctypes.CDLL(str(tmp_path / "shimmed.so"), mode=os.RTLD_NOW)
    lib.find.restype = lib.find_next.restype = ctypes.c_void_p
    assert lib.find(b"printf") and lib.find_next(b"printf") and not lib.find(b"no_such_symbol_here")


def test_the_floor_comes_from_torch_wheel_tags(tmp_path: Path) -> None:
    assert floor_policy(TORCH_TAGS, "x86_64").name == "manylinux_2_28_x86_64"
    both = ["cp310-cp310-manylinux_2_28_x86_64", "cp310-cp310-manylinux2014_x86_64"]
    assert floor_policy(both, "x86_64").name == "manylinux_2_17_x86_64"  # the most compatible one
    assert floor_policy(["cp312-cp312-manylinux_2_28_aarch64"], "x86_64") is None
    assert floor_policy(["cp312-cp312-manylinux_2_28_aarch64"], "aarch64").name == "manylinux_2_28_aarch64"
    dist_info = tmp_path / "torch-2.14.1.dist-info"
    dist_info.mkdir()
    (dist_info / "WHEEL").write_text("Wheel-Version: 1.0\nTag: cp311-cp311-manylinux_2_28_x86_64\n")
    assert wheel_tags(tmp_path) == TORCH_TAGS and wheel_tags(tmp_path / "none") == []


def test_without_torch_tags_nothing_is_refused_and_the_record_says_why(tmp_path: Path) -> None:
    data = compile_so(tmp_path, "plain.so", [])
    found = check_contents(contents(data), [], "x86_64")
    assert found.floor is None and found.record()["from"] == "not checked: torch's wheel tags are unknown"
    assert "GLIBC" in found.highest


def raw_cuda_wheel(folder: Path, so: bytes) -> Path:
    """A wheel shaped like setup.py's CUDA build (its extension: a real object compiled here) and its manifest
    with the torch wheel tags the builder records."""
    dist_info = "flash_attn-2.8.3.dist-info"
    tag = "cp311-cp311-linux_x86_64"
    members = {
        "flash_attn/__init__.py": Member(b"__version__ = '2.8.3'\n"),
        MEMBER: Member(so),
        f"{dist_info}/METADATA": Member(b"Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3\n\n"),
        f"{dist_info}/WHEEL": Member(f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()),
        f"{dist_info}/top_level.txt": Member(b"flash_attn\nflash_attn_2_cuda\n"),
    }
    wheel = write_wheel(folder, f"flash_attn-2.8.3-{tag}.whl", dist_info, members, 1700000000)
    inputs = {"toolkit": "cuda13.0", "torch": "2.14.1", "torch_variant": "cu130", "python": "3.11"}
    inputs |= {"cxx11_abi": True, "arches": ["sm_90"], "profile": "full"}
    manifest = {
        "schema": 1,
        "cell_id": "flash-attn-2.8.3-cu130-torch2.14.1-cp311-abi1-sm90-full-x86_64",
        "variant": "cu130-torch2.14",
        "local_version": "cu130torch2.14cxx11abiTRUE",
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "wheel": wheel.name,
        "inputs": inputs,
        "build": {"glibc_floor": {"torch_wheel_tags": TORCH_TAGS}},
    }
    manifest_path_for(wheel).write_text(json.dumps(manifest))
    return wheel


def finalize_cli(wheel: Path, out: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from attnforge.cli import main; sys.argv[0] = 'attnforge'; sys.exit(main())"
    cmd = [sys.executable, "-c", code, "wheels", "finalize", str(wheel), "--out-dir", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)


def test_finalize_refuses_a_wheel_above_the_floor_and_keeps_one_inside(tmp_path: Path) -> None:
    if glibc() < (2, 32):
        pytest.skip("this glibc has no __libc_single_threaded")
    out = tmp_path / "out"
    refused = finalize_cli(raw_cuda_wheel(tmp_path / "plain", compile_so(tmp_path, "plain.so", [])), out)
    assert refused.returncode == 4, refused.stderr
    lines = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in refused.stderr and len([ln for ln in lines if "error" in ln.lower()]) == 1
    assert (
        f"flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl: {MEMBER} needs __libc_single_threaded@GLIBC_2.32"
        in refused.stderr
    )
    assert not list(out.glob("*.whl")), "nothing is written for a refused wheel"

    env = {"PATH": "/usr/bin:/bin"}
    obj = shim_object(None, tmp_path / "shim", env)
    link_shim(env, obj)
    shimmed = raw_cuda_wheel(tmp_path / "shimmed", compile_so(tmp_path, "shimmed.so", env["LDFLAGS"].split()))
    done = finalize_cli(shimmed, out)
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("*.whl")
    manifest = json.loads(manifest_path_for(wheel).read_text())
    assert manifest["finalize"]["glibc_floor"]["floor"] == "manylinux_2_28_x86_64"
    assert "glibc-floor" in manifest["finalize"]["checks"]
    plat = wheel.name.removesuffix(".whl").rsplit("-", 1)[1]
    assert plat.startswith("manylinux_") and version(plat.split("_")[1] + "." + plat.split("_")[2]) <= (2, 28)


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None, reason="needs g++-aarch64-linux-gnu")
def test_the_cross_compiler_object_keeps_an_aarch64_extension_inside_the_floor(tmp_path: Path) -> None:
    """The aarch64 lane's case: the object compiled by the cross g++ (bookworm's arm64 glibc 2.36)."""
    src = tmp_path / "ext.cpp"
    src.write_text(SOURCE)
    tags = ["cp312-cp312-manylinux_2_28_aarch64"]
    env = {"PATH": "/usr/bin:/bin"}
    link_shim(env, shim_object("aarch64-linux-gnu-g++", tmp_path, env))
    for name, extra in (("plain.so", []), ("shimmed.so", env["LDFLAGS"].split())):
        cmd = [
            "aarch64-linux-gnu-g++",
            "-O0",
            "-fPIC",
            "-shared",
            *extra,
            str(src),
            "-o",
            str(tmp_path / name),
        ]
        subprocess.run(cmd, check=True)
    with pytest.raises(
        BuildError, match=r"__libc_single_threaded@GLIBC_2\.32 .* above manylinux_2_28_aarch64"
    ):
        check_contents(contents((tmp_path / "plain.so").read_bytes()), tags, "aarch64")
    found = check_contents(contents((tmp_path / "shimmed.so").read_bytes()), tags, "aarch64")
    assert found.floor == "manylinux_2_28_aarch64" and version(found.highest["GLIBC"]) <= (2, 17)
