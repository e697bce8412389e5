"""The builder's host-compiler check (builder/compiler.py), with real g++ compiles through torch.

On the H100 machine, CC/CXX named a gcc wrapper whose objects turned every C++ exception thrown through torch
into a SIGSEGV (reports/gpu/toolchain_probe.json). That wrapper can't exist here; the stand-in for a bad
compiler is a wrapper script that fails to compile, which takes the same fallback path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from attnforge.builder import compiler as ic
from attnforge.builder.exits import EXIT_ENV, BuildFailure

pytest.importorskip("torch")


class Lines:
    """A Reporter stand-in that keeps the lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)


@pytest.fixture(scope="module")
def broken_cxx(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cxx") / "g++"
    path.write_text(
        '#!/bin/sh\nfor a in "$@"; do [ "$a" = --version ] && { echo "broken-g++ 1.0"; exit 0; }; done\n'
        'echo "broken-g++: cannot compile" >&2\nexit 1\n'
    )
    path.chmod(0o755)
    return str(path)


def test_a_failing_compiler_is_replaced_and_the_verdict_cached(tmp_path: Path, broken_cxx: str) -> None:
    """The broken one is rejected, the system g++ really builds the probe and lets torch's error through."""
    env = dict(os.environ, CXX=broken_cxx)
    rep = Lines()
    got = ic.choose_host_compiler(sys.executable, tmp_path, env, rep)  # type: ignore[arg-type]
    assert got["cxx"] == "/usr/bin/g++" and got["cc"] == "/usr/bin/gcc" and got["switched"]
    assert "cannot compile" in got["rejected"][broken_cxx]
    assert any("warning" in ln and "building with /usr/bin/g++ instead" in ln for ln in rep.lines)
    again = Lines()
    assert ic.choose_host_compiler(sys.executable, tmp_path, env, again)["cxx"] == "/usr/bin/g++"  # type: ignore[arg-type]
    assert not any(ln.startswith("attnforge: checking") for ln in again.lines), (
        "second call must use the cache"
    )


def test_no_usable_compiler_is_an_environment_error(tmp_path: Path, broken_cxx: str) -> None:
    with pytest.raises(BuildFailure) as err:
        ic.choose_host_compiler(
            sys.executable, tmp_path, dict(os.environ, CXX=broken_cxx), Lines(), fallbacks=()
        )  # type: ignore[arg-type]
    assert err.value.code == EXIT_ENV
    assert broken_cxx in err.value.message and "set CXX/CC" in err.value.message


def test_c_compiler_beside_the_cxx_one() -> None:
    assert ic.c_compiler_for("/usr/bin/g++") == "/usr/bin/gcc"
    assert ic.c_compiler_for("/nonexistent/bin/g++") is None
