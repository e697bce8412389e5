"""The stable-ABI check (builder/importcheck.py) on real shared objects: g++ builds one that calls a c10::
function (a torch C++ import) and one that calls only a C shim function; the check fails the first naming
the symbol and passes the second. Through the builder (main.check_stable_abi): a stable-ABI spec's wheel
fails with EXIT_ABI when any of its extensions (at any depth) leaks, a per-torch spec's is not checked."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from attnforge.builder.exits import EXIT_ABI, BuildFailure
from attnforge.builder.importcheck import require_stable_abi, stable_abi_check, torch_cxx_imports
from attnforge.builder.main import check_stable_abi
from attnforge.builder.report import Reporter
from attnforge.builder.spec import BuildSpec, Source

needs_toolchain = pytest.mark.skipif(
    shutil.which("g++") is None or shutil.which("nm") is None, reason="needs g++ and nm"
)

LEAKY = """
namespace c10 { namespace detail {
[[noreturn]] void torchCheckFail(const char* func, const char* file, unsigned line, const char* msg);
} }
extern "C" int leaky(int x) {
    if (x < 0) c10::detail::torchCheckFail("leaky", "leaky.cpp", 1, "negative");
    return x;
}
"""

CLEAN = """
#include <cstdint>
extern "C" int32_t aoti_torch_get_current_device_index(int8_t* ret);
namespace flash { int run(int x) { return x + 1; } }  // a C++ namespace of its own is fine
extern "C" int clean(int x) {
    int8_t device = 0;
    aoti_torch_get_current_device_index(&device);
    return flash::run(x) + device;
}
"""


def shared_object(tmp_path: Path, name: str, source: str) -> Path:
    cpp = tmp_path / f"{name}.cpp"
    cpp.write_text(source)
    so = tmp_path / f"{name}.so"
    # undefined symbols are allowed in a shared object: resolved at load time (here: never loaded)
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", str(cpp), "-o", str(so)], check=True)
    return so


@needs_toolchain
def test_a_c10_import_fails_the_build_naming_the_symbol(tmp_path: Path) -> None:
    so = shared_object(tmp_path, "leaky", LEAKY)
    result = stable_abi_check([so])
    assert not result["ok"]
    assert result["leaks"]["leaky.so"] == [
        "c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)"
    ]
    with pytest.raises(
        BuildFailure, match=r"leaky\.so imports the torch C\+\+ symbol 'c10::detail::torchCheckFail"
    ):
        require_stable_abi([so], Reporter(None))
    try:
        require_stable_abi([so], Reporter(None))
    except BuildFailure as exc:
        assert exc.code == EXIT_ABI and exc.details["stable_abi"]["leaks"]


@needs_toolchain
def test_only_the_c_shim_passes(tmp_path: Path) -> None:
    so = shared_object(tmp_path, "clean", CLEAN)
    assert require_stable_abi([so], Reporter(None)) == {"ok": True, "checked": ["clean.so"], "leaks": {}}


def test_torch_cxx_imports_reads_nm_output() -> None:
    nm = "\n".join(
        [
            "                 U aoti_torch_empty_strided",
            "                 U torch_call_dispatcher",
            "                 U vtable for at::TensorImpl",
            "                 w typeinfo for c10::Error",
            "                 U void flash::run<c10::Half>(int)",
            "                 U std::__cxx11::basic_string<char>::~basic_string()",
            "                 U caffe2::TypeMeta::fromScalarType(int)",
            "                 U data::torch_ops()",
            "0000000000001139 T at::defined_here()",
        ]
    )
    assert torch_cxx_imports(nm) == [
        "vtable for at::TensorImpl",
        "typeinfo for c10::Error",
        "void flash::run<c10::Half>(int)",
        "caffe2::TypeMeta::fromScalarType(int)",
    ]


def test_no_extension_module_is_a_failure() -> None:
    with pytest.raises(BuildFailure, match="no extension module"):
        require_stable_abi([], Reporter(None))


def spec(tmp_path: Path, stable_abi: bool) -> BuildSpec:
    return BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source("/s.tar.gz", "0" * 64),
        python="3.12",
        torch="2.11.0",
        build_dir=str(tmp_path / "build"),
        venv_dir="/v",
        output_dir=str(tmp_path / "out"),
        stable_abi=stable_abi,
    )


def wheel_with(tmp_path: Path, members: dict[str, Path]) -> Path:
    wheel = tmp_path / "flash_attn-2.8.3+cu130sm90torch2.10abi3-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("flash_attn/__init__.py", "")
        for name, so in members.items():
            zf.write(so, name)
    return wheel


@needs_toolchain
def test_the_builder_fails_a_stable_abi_wheel_naming_the_leaked_symbol(tmp_path: Path) -> None:
    clean = shared_object(tmp_path, "clean", CLEAN)
    leaky = shared_object(tmp_path, "leaky", LEAKY)
    wheel = wheel_with(tmp_path, {"flash_attn_2_cuda.abi3.so": clean, "flash_attn/sub/_ext.abi3.so": leaky})
    result: dict[str, Any] = {"stages": {}}
    with pytest.raises(BuildFailure) as info:
        check_stable_abi(spec(tmp_path, stable_abi=True), wheel, Reporter(None), result)
    assert info.value.code == EXIT_ABI and info.value.details["kind"] == "stable_abi"
    assert "_ext.abi3.so imports the torch C++ symbol 'c10::detail::torchCheckFail" in info.value.message
    assert info.value.details["stable_abi"]["checked"] == ["flash_attn_2_cuda.abi3.so", "_ext.abi3.so"]
    assert "abi_check" in result["stages"]
    # a per-torch build links torch's C++ API on purpose: not checked
    check_stable_abi(spec(tmp_path, stable_abi=False), wheel, Reporter(None), result)


@needs_toolchain
def test_the_builder_passes_a_stable_abi_wheel_of_c_shim_imports(tmp_path: Path) -> None:
    wheel = wheel_with(tmp_path, {"flash_attn_3/_C.abi3.so": shared_object(tmp_path, "clean", CLEAN)})
    result: dict[str, Any] = {"stages": {}}
    check_stable_abi(spec(tmp_path, stable_abi=True), wheel, Reporter(None), result)
    assert result["stable_abi_check"] == {"ok": True, "checked": ["_C.abi3.so"], "leaks": {}}


def test_a_stable_abi_wheel_without_an_extension_fails(tmp_path: Path) -> None:
    wheel = wheel_with(tmp_path, {})
    with pytest.raises(BuildFailure, match="no extension module") as info:
        check_stable_abi(spec(tmp_path, stable_abi=True), wheel, Reporter(None), {"stages": {}})
    assert info.value.code == EXIT_ABI
