"""The interpreter `which` and `doctor` inspect (--python > $VIRTUAL_ENV > $CONDA_PREFIX > python3 on PATH),
what their reports say about it, and what they tell the user to type next.

Real interpreters throughout: venvs made with `venv` (no pip, well under a second each), some holding a
stand-in `torch` package (the few attributes the probe reads), probed in their own process."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from attnforge.cli import main
from attnforge.client.doctor import diagnose, run_doctor
from attnforge.client.interpreter import Interpreter, choose_interpreter, probe_environment
from attnforge.client.which import resolve
from attnforge.core.errors import ConfigurationError
from attnforge.engine.environment import Env
from attnforge.publish.index import Bundle, StaticIndex
from attnforge.wheels.wheelio import Member, write_wheel

CP = f"cp{sys.version_info.major}{sys.version_info.minor}"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"

STAND_IN_TORCH = """\
__version__ = {version!r}
class version:
    cuda = {cuda!r}
    hip = None
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
class cuda:
    @staticmethod
    def is_available():
        return False
"""


def make_venv(path: Path, torch: str | None = None, cuda: str | None = None) -> Path:
    """A venv (no pip); with `torch`, a stand-in torch package of that version and CUDA. Its python."""
    venv.create(path, with_pip=False, symlinks=True)
    if torch:
        site = next((path / "lib").glob("python3*/site-packages"))
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text(STAND_IN_TORCH.format(version=torch, cuda=cuda))
    return path / "bin" / "python"


def bare_env(**extra: str) -> dict[str, str]:
    """An environment with none of the variables the choice reads, and a PATH without python3."""
    return {"PATH": "/nonexistent", **extra}


# ---------------------------------------------------------------- the choice


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("interp")
    out = {name: make_venv(root / name) for name in ("given", "venv", "conda", "onpath")}
    (root / "onpath" / "bin" / "python3").resolve()  # venv makes bin/python3 too
    return out


def test_python_beats_venv_beats_conda_beats_path(envs: dict[str, Path]) -> None:
    onpath_bin = str(envs["onpath"].parent)
    env = bare_env(
        VIRTUAL_ENV=str(envs["venv"].parent.parent),
        CONDA_PREFIX=str(envs["conda"].parent.parent),
        PATH=onpath_bin,
    )
    chosen = choose_interpreter(str(envs["given"]), env)
    assert (chosen.path, chosen.rule) == (str(envs["given"]), "--python")
    chosen = choose_interpreter(None, env)
    assert (chosen.path, chosen.rule) == (str(envs["venv"]), "VIRTUAL_ENV")
    del env["VIRTUAL_ENV"]
    chosen = choose_interpreter(None, env)
    assert (chosen.path, chosen.rule) == (str(envs["conda"]), "CONDA_PREFIX")
    del env["CONDA_PREFIX"]
    chosen = choose_interpreter(None, env)
    assert (chosen.path, chosen.rule) == (str(envs["onpath"].parent / "python3"), "PATH")
    assert chosen.chosen_by == "the first python3 on PATH"
    chosen = choose_interpreter(None, bare_env())
    assert (chosen.path, chosen.rule) == (sys.executable, "own")


def test_a_variable_naming_no_interpreter_is_passed_over_and_said(
    envs: dict[str, Path], tmp_path: Path
) -> None:
    env = bare_env(VIRTUAL_ENV=str(tmp_path / "deleted-venv"), CONDA_PREFIX=str(envs["conda"].parent.parent))
    chosen = choose_interpreter(None, env)
    assert chosen.rule == "CONDA_PREFIX"
    assert chosen.passed_over == (f"$VIRTUAL_ENV={tmp_path / 'deleted-venv'} holds no bin/python",)


def test_python_takes_a_venv_folder_or_a_command(envs: dict[str, Path], tmp_path: Path) -> None:
    folder = envs["given"].parent.parent
    assert choose_interpreter(str(folder), bare_env()).path == str(folder / "bin" / "python")
    on_path = bare_env(PATH=str(envs["onpath"].parent))
    assert choose_interpreter("python3", on_path).path == str(envs["onpath"].parent / "python3")
    with pytest.raises(ConfigurationError, match=r"--python python9\.9: no such interpreter"):
        choose_interpreter("python9.9", on_path)
    with pytest.raises(ConfigurationError, match="a folder without bin/python"):
        choose_interpreter(str(tmp_path), bare_env())
    script = tmp_path / "not-executable"
    script.write_text("")
    with pytest.raises(ConfigurationError, match="not executable"):
        choose_interpreter(str(script), bare_env())


def test_the_report_names_the_interpreter_python_and_torch(tmp_path: Path) -> None:
    with_torch = make_venv(tmp_path / "t", "2.13.0+cpu")
    interp = Interpreter(str(with_torch), "VIRTUAL_ENV")
    data, seen = probe_environment(interp)
    assert data["torch"]["installed"] and seen.torch == "2.13.0+cpu" and seen.accel is None
    text = seen.describe()
    assert text.startswith(f"{with_torch} (Python {PY}.")
    assert "chosen by $VIRTUAL_ENV (the active venv)), torch 2.13.0+cpu (CPU-only, cxx11abi TRUE)" in text
    assert seen.to_json()["torch"] == {"version": "2.13.0+cpu", "accelerator": "cpu", "cxx11_abi": True}
    _, bare = probe_environment(Interpreter(str(make_venv(tmp_path / "b")), "PATH"))
    assert bare.torch is None and bare.describe().endswith("), no torch")
    assert bare.to_json()["torch"] is None


# ---------------------------------------------------------------- which: the report and what to type next


def bundle(where: Path, local: str, cp: str = CP) -> Bundle:
    """A tiny flash-attn wheel for this CPython and its manifest, as the index tests make them."""
    version = f"2.8.3+{local}"
    dist_info = f"flash_attn-{version}.dist-info"
    name = f"flash_attn-{version}-{cp}-{cp}-linux_x86_64.whl"
    members = {
        "flash_attn/__init__.py": Member(b"x = 1\n"),
        f"{dist_info}/METADATA": Member(
            f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\n\n".encode()
        ),
        f"{dist_info}/WHEEL": Member(
            f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {cp}-{cp}-linux_x86_64\n".encode()
        ),
    }
    wheel = write_wheel(where, name, dist_info, members, 1700000000)
    data = wheel.read_bytes()
    family = local.split("torch")[1].split("cxx")[0]
    manifest = {
        "kernel_version": "2.8.3",
        "variant": f"cu130-torch{family}",
        "wheel": name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "inputs": {"toolkit": "cuda13.0", "torch": f"{family}.0", "python": PY, "cxx11_abi": True},
        "finalize": {},
    }
    return Bundle(wheel=wheel, manifest=manifest)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Full-profile wheels for torch 2.14 and 2.13, and one fwd128 wheel for torch 2.12 only."""
    root = tmp_path_factory.mktemp("index")
    locals_ = [
        "cu130torch2.14cxx11abiTRUE",
        "cu130torch2.13cxx11abiTRUE",
        "cu130torch2.12cxx11abiTRUE.fwd128",
    ]
    StaticIndex(root / "index").publish([bundle(root / "in", x) for x in locals_])
    return root / "index"


def probe_data(torch: str | None, cuda: str | None = "13.0") -> dict[str, Any]:
    return {
        "executable": "/home/u/proj/.venv/bin/python",
        "python": f"{PY}.1",
        "machine": "x86_64",
        "glibc": "2.36",
        "driver": None,
        "torch": {
            "installed": True,
            "version": torch,
            "cuda": cuda,
            "hip": None,
            "cxx11_abi": True,
            "gpus": [],
        }
        if torch
        else {"installed": False, "error": "ModuleNotFoundError: No module named 'torch'"},
    }


def test_no_torch_says_how_to_install_it_into_that_interpreter(index: Path) -> None:
    from attnforge.client.interpreter import Inspected

    data = probe_data(None)
    seen = Inspected.from_probe(Interpreter("/home/u/proj/.venv/bin/python", "VIRTUAL_ENV"), data)
    res = resolve(Env.from_probe(data), str(index), inspected=seen)
    text = "\n".join(res.explanation)
    assert res.explanation[0] == f"interpreter: {seen.describe()}" and "no torch" in res.explanation[0]
    assert res.explanation[1] == f"environment: Python {PY} (x86_64), no torch, no GPU"  # was "[CPU-only]"
    assert "install torch first: /home/u/proj/.venv/bin/python -m pip install torch" in text
    assert "--torch 2.14+cu130" in text  # the nearest wheel's torch, for a torch still to be installed
    assert res.next_step == "/home/u/proj/.venv/bin/python -m pip install torch, then ask again"
    # no accelerator verdict without a torch (it read "wheel is cu130, torch  is a CPU-only build")
    assert "torch  is" not in text and "accelerator" not in text
    assert res.to_json()["interpreter"]["torch"] is None


def test_a_cpu_torch_is_named_and_the_cuda_build_suggested(index: Path) -> None:
    res = resolve(Env.from_probe(probe_data("2.13.0+cpu", cuda=None)), str(index))
    text = "\n".join(res.explanation)
    assert "accelerator: wheel is cu130, torch 2.13.0+cpu is a CPU-only build" in text
    assert "install a CUDA or ROCm build of torch into python" in text and "--torch 2.13.0+cu130" in text
    assert res.next_step == "a CUDA build of torch in python (ask for its wheel with --torch 2.13.0+cu130)"


def test_a_profile_mismatch_names_the_profiles_that_fit(index: Path) -> None:
    res = resolve(Env.from_probe(probe_data("2.12.1+cu130")), str(index))
    assert res.choice is None and res.next_step == "--profile fwd128"
    text = "\n".join(res.explanation)
    assert "profile: wheel is profile fwd128, asked for full (`--profile fwd128` accepts it)" in text
    assert "in profile fwd128: add --profile fwd128" in text
    assert resolve(Env.from_probe(probe_data("2.12.1+cu130")), str(index), "fwd128").choice is not None
    # the other way round: a lean profile asked for, only the full wheel there
    res = resolve(Env.from_probe(probe_data("2.14.1+cu130")), str(index), "infer")
    assert res.next_step == "--profile full"
    # no wheel is only a profile away: no --profile advice
    res = resolve(Env.from_probe(probe_data("2.11.0+cu130")), str(index))
    assert res.next_step is None and "--profile" not in "\n".join(res.explanation[-3:])


def test_torch_without_a_build_needs_one_where_no_torch_is_installed() -> None:
    from attnforge.client.which import with_torch

    bare = Env.from_probe(probe_data(None))
    with pytest.raises(
        ConfigurationError, match=r"--torch 2\.14: no torch is installed here .* --torch 2\.14\+cu130"
    ):
        with_torch(bare, "2.14")  # it answered as for a CPU-only "torch 2.14"
    assert with_torch(bare, "2.14+cu130").accel == "cu130"
    assert with_torch(Env.from_probe(probe_data("2.13.0+cu128", "12.8")), "2.14").accel == "cu128"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_which_reports_the_interpreter_in_every_format(
    index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    user = make_venv(tmp_path / "user", "2.14.1+cu130", "13.0")
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "user"))
    monkeypatch.delenv("ATTNFORGE_INDEX_URL", raising=False)
    code, out, err = run_cli(capsys, "which", "--index-url", str(index))
    assert code == 0 and out.startswith("pip install flash-attn==2.8.3+cu130torch2.14cxx11abiTRUE ")
    assert f"interpreter: {user} (Python {PY}." in err and "chosen by $VIRTUAL_ENV" in err
    assert "torch 2.14.1+cu130 (cu130, cxx11abi TRUE)" in err
    code, out, err = run_cli(capsys, "which", "--index-url", str(index), "--format", "uv")
    assert code == 0 and "[tool.uv.sources]" in out and f"interpreter: {user} " in err
    code, out, _ = run_cli(capsys, "which", "--index-url", str(index), "--json")
    seen = json.loads(out)["interpreter"]
    assert seen["path"] == str(user) and seen["chosen_by"] == "VIRTUAL_ENV"
    assert seen["torch"] == {"version": "2.14.1+cu130", "accelerator": "cu130", "cxx11_abi": True}
    # the error line says what to type: --profile
    code, _, err = run_cli(
        capsys, "which", "--index-url", str(index), "--profile", "fwd128", "--torch", "2.12"
    )
    assert code == 0  # a fwd128 wheel exists for 2.12
    code, _, err = run_cli(capsys, "which", "--index-url", str(index), "--torch", "2.12")
    assert code == 3
    assert f"error: no wheel in the index fits the environment of {user}; next: --profile fwd128" in err


def test_no_index_configured_says_how_to_name_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from attnforge.cli.commands import which

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(which, "DEFAULT_INDEX", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("ATTNFORGE_INDEX_URL", raising=False)
    code, out, err = run_cli(
        capsys, "which", "--python", str(make_venv(tmp_path / "u", "2.14.1+cu130", "13.0"))
    )
    assert code == 5 and out == ""
    assert "connection refused" in err
    assert "(hint: no index given: name yours with --index-url URL or set ATTNFORGE_INDEX_URL" in err
    # an index named and refused: no such hint (the user chose that URL)
    code, _, err = run_cli(
        capsys, "which", "--python", str(tmp_path / "u"), "--index-url", f"http://127.0.0.1:{port}"
    )
    assert code == 5 and "no index given" not in err


# ---------------------------------------------------------------- doctor


def test_doctor_names_the_interpreter_and_says_how_to_install_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = make_venv(tmp_path / "user")
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "user"))
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    data, checks = run_doctor(None)
    assert checks[0].name == "interpreter" and checks[0].detail.startswith(f"{user} (Python {PY}.")
    assert "chosen by $VIRTUAL_ENV" in checks[0].detail and checks[0].detail.endswith("no torch")
    assert data["interpreter"]["path"] == str(user)
    assert checks[1].detail == (
        f"not installed in {user}: `attnforge which --python {user} --index-url URL` names its wheel"
    )
    # flash-attn there but no torch: the torch check says how to install it into that interpreter
    site = next((tmp_path / "user" / "lib").glob("python3*/site-packages"))
    dist = site / "flash_attn-2.8.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.8.3\n")
    _, checks = run_doctor(str(user))
    torch = next(c for c in checks if c.name == "torch")
    assert torch.status == "fail" and torch.detail.endswith(
        f"install it into this environment: {user} -m pip install torch"
    )
    assert "ModuleNotFoundError" in torch.detail
    assert diagnose({**data, "interpreter": None, "flash_attn": {"installed": False}})[0].detail.startswith(
        f"not installed in {data['executable']}"
    )


def test_doctor_json_names_the_interpreter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    user = make_venv(tmp_path / "user", "2.13.0+cpu")
    code, out, _ = run_cli(capsys, "doctor", "--python", str(tmp_path / "user"), "--json")
    report = json.loads(out)
    assert code == 5  # flash-attn is not installed there
    assert report["probe"]["interpreter"]["path"] == str(user)
    assert report["probe"]["interpreter"]["chosen_by"] == "--python"
    assert (
        report["checks"][0]["name"] == "interpreter"
        and "torch 2.13.0+cpu (CPU-only" in report["checks"][0]["detail"]
    )
    assert os.path.basename(report["probe"]["executable"]).startswith("python")
