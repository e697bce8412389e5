"""The Triton wheel's checks on small synthetic wheels and sdists (the real build: tests/integration)."""

from __future__ import annotations

import io
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from attnforge.cell import Cell, Toolkit
from attnforge.errors import BuildError, ConfigurationError, EnvironmentProblem
from attnforge.rocm.triton_wheel import (
    REQUIRED_MEMBERS,
    TritonWheelInputs,
    _extract,
    build_triton_wheel,
    python_facts,
    verify_triton_wheel,
)
from attnforge.schema import ProfileSpec

INPUTS = TritonWheelInputs(
    kernel_version="2.8.3", local_version="rocm6.4torch2.9cxx11abiTRUE.triton", torch="2.9.1",
    target_arches=("gfx90a", "gfx942"),
)  # fmt: skip
LOWER = "2.8.3+rocm6.4torch2.9cxx11abitrue.triton"


def make_wheel(tmp: Path, *, tag: str = "py3-none-any", purelib: str = "true", extra: tuple[str, ...] = (),
               drop: tuple[str, ...] = (), version: str = LOWER) -> Path:  # fmt: skip
    path = tmp / f"flash_attn-{version}-{tag}.whl"
    di = f"flash_attn-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        for m in (*REQUIRED_MEMBERS, *extra):
            if m not in drop:
                zf.writestr(m, "")
        zf.writestr(f"{di}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n")
        zf.writestr(f"{di}/METADATA", f"Metadata-Version: 2.4\nName: flash_attn\nVersion: {version}\n"
                    "Requires-Dist: torch\nRequires-Dist: einops\n")  # fmt: skip
    return path


def test_names() -> None:
    assert INPUTS.wheel_name == "flash_attn-2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton-py3-none-any.whl"
    assert INPUTS.version == "2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton"


def test_a_good_wheel(tmp_path: Path) -> None:
    check = verify_triton_wheel(make_wheel(tmp_path), INPUTS)
    assert check.tag == "py3-none-any" and check.root_is_purelib
    assert check.requires_dist == ("torch", "einops")
    assert check.top_level == ("flash_attn",)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"extra": ("flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so",)}, "compiled files"),
        ({"tag": "cp312-cp312-linux_x86_64"}, "is not py3-none-any"),
        ({"purelib": "false"}, "Root-Is-Purelib"),
        ({"drop": ("flash_attn/flash_attn_triton_amd/interface_fa.py",)}, "missing"),
        ({"version": "2.8.3+rocm6.4torch2.9cxx11abitrue.ck"}, "is not 2.8.3+"),
    ],
)
def test_what_a_triton_wheel_must_not_be(tmp_path: Path, kw: dict[str, object], needle: str) -> None:
    with pytest.raises(BuildError, match=needle):
        verify_triton_wheel(make_wheel(tmp_path, **kw), INPUTS)  # type: ignore[arg-type]


def test_only_triton_cells() -> None:
    ck = Cell("flash-attn", "2.8.3", Toolkit.parse("rocm6.4"), "2.8.0", "3.12", True, ("gfx942",), "ck",
              profile_spec=ProfileSpec(rocm_backend="ck"))  # fmt: skip
    with pytest.raises(ConfigurationError, match="not a Triton-profile cell"):
        TritonWheelInputs.from_cell(ck)


def sdist_with(tmp: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    path = tmp / "x.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("pkg-1/setup.py")
        tar.addfile(ok, io.BytesIO(b""))
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return path


def test_extract_refuses_escapes(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(BuildError, match="unsafe member"):
        _extract(sdist_with(tmp_path, tarfile.TarInfo("../evil")), tmp_path / "out")
    link = tarfile.TarInfo("pkg-1/link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    (tmp_path / "out2").mkdir()
    with pytest.raises(BuildError, match="unsafe member"):
        _extract(sdist_with(tmp_path, link), tmp_path / "out2")
    (tmp_path / "out3").mkdir()
    top = _extract(sdist_with(tmp_path, tarfile.TarInfo("pkg-1/a.py"), b"x = 1\n"), tmp_path / "out3")
    assert top.name == "pkg-1" and (top / "a.py").read_text() == "x = 1\n"


def test_a_python_without_torch_is_an_environment_problem(tmp_path: Path) -> None:
    py = sys.executable  # attnforge's own venv has no torch
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - a dev venv with torch
        pytest.skip("this interpreter has torch")
    with pytest.raises(EnvironmentProblem, match="needs torch"):
        python_facts(py)


def test_sha256_pin_is_checked_first(tmp_path: Path) -> None:
    sdist = sdist_with(tmp_path, tarfile.TarInfo("pkg-1/a.py"))
    pinned = TritonWheelInputs("2.8.3", "x", "2.9.1", source_sha256="0" * 64)
    with pytest.raises(BuildError, match="does not match the pin"):
        build_triton_wheel(sdist, pinned, tmp_path / "out")
