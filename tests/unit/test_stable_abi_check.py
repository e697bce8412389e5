"""The stable-ABI check (builder/importcheck.py) on real shared objects: g++ builds one that calls a c10::
function (a torch C++ import) and one that calls only a C shim function; the check fails the first naming
the symbol and passes the second."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from attnforge.builder.exits import EXIT_IMPORT, BuildFailure
from attnforge.builder.importcheck import require_stable_abi, stable_abi_check, torch_cxx_imports
from attnforge.builder.report import Reporter

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
        assert exc.code == EXIT_IMPORT and exc.details["stable_abi"]["leaks"]


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
