"""Real pip and real uv against a served index (tests/integration/tinyindex.py): PEP 592 yanks as pip sees them,
`doctor` warning about an installed yanked wheel (and, from the same index, checking it against its signed
records), and a uv project configured by `attnforge which --format uv`.

Nothing comes from the public index: the wheels' torch pin resolves against a stand-in torch (pure Python,
2.14.1+cu130 and 2.13.0+cu130) that the uv project takes from a folder index marked `default = true`, so uv
never asks PyPI; pip runs with no configuration and `--no-deps` where torch does not matter. uv itself is the
one of the dev environment (`uv` on PyPI).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytest.register_assert_rewrite("tests.integration.tinyindex")

from tests.integration.tinyindex import V213, V214, V214_FWD, YANK_REASON, TinyIndex  # noqa: E402
from tests.integration.wheelfactory import Served, attnforge_serve, cli, pip_install, run  # noqa: E402

pytest_plugins = ["tests.integration.tinyindex"]


@pytest.fixture(scope="module")
def server(tiny_index: TinyIndex, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with attnforge_serve(tiny_index.index, tmp_path_factory.mktemp("serve") / "serve.log") as served:
        yield served


def installed(python: Path, project: str = "flash-attn") -> str:
    code = f"import importlib.metadata as m; print(m.version({project!r}))"
    return run([python, "-c", code]).stdout.strip()


def empty_env(path: Path) -> Path:
    venv.create(path, with_pip=False, symlinks=True)
    return path / "bin" / "python"


# ---------------------------------------------------------------- pip and PEP 592


def test_pip_skips_a_yanked_wheel_unless_pinned_and_warns_when_pinned(server: Served, tmp_path: Path) -> None:
    variant = f"{server.url}/cu130-torch2.14/simple"
    # the variant holds the full wheel and the (higher) fwd128 one, which is yanked: unpinned, pip skips it
    py = empty_env(tmp_path / "unpinned")
    proc = pip_install(py, "--no-deps", "--index-url", variant, "flash-attn", check=True)
    assert Version(installed(py)) == Version(V214)
    assert "yanked" not in proc.stderr
    # pinned exactly, pip takes it, and warns with the reason
    py = empty_env(tmp_path / "pinned")
    proc = pip_install(py, "--no-deps", "--index-url", variant, f"flash-attn=={V214_FWD}", check=True)
    assert Version(installed(py)) == Version(V214_FWD)
    assert "The candidate selected for download or install is a yanked version" in proc.stderr, proc.stderr
    assert f"Reason for being yanked: {YANK_REASON}" in proc.stderr


def test_doctor_warns_that_the_installed_wheel_was_yanked(
    server: Served, tiny_index: TinyIndex, tmp_path: Path
) -> None:
    py = empty_env(tmp_path / "env")
    torch = ("--no-index", "--find-links", tiny_index.torch_index / "torch")
    pip_install(py, *torch, "torch==2.14.1+cu130", check=True)
    pip_install(
        py, "--no-deps", "--index-url", f"{server.url}/all/simple", f"flash-attn=={V214_FWD}", check=True
    )
    doctor = cli("doctor", "--python", py, "--index-url", server.url, check=False)
    lines = [line for line in doctor.stdout.splitlines() if line.startswith("warn yanked: ")]
    assert len(lines) == 1 and tiny_index.wheels[V214_FWD].name in lines[0], doctor.stdout
    assert f"was yanked from {server.url}: {YANK_REASON}" in lines[0]
    # `which` in the same environment names the yanked wheel and proposes the one that is not
    which = cli("which", "--index-url", server.url, "--python", py)
    assert f"yanked, never proposed: {tiny_index.wheels[V214_FWD].name} ({YANK_REASON})" in which.stderr
    assert which.stdout.split()[2] == f"flash-attn=={V214}"


def test_one_index_url_serves_the_yank_check_and_the_signed_records(
    server: Served, tiny_index: TinyIndex, tmp_path: Path
) -> None:
    """doctor --verify reads the same --index-url as the yank check: the yanked wheel's records are still
    served beside it; which --verify checks the wheel it proposes (its signed parity record too)."""
    py = empty_env(tmp_path / "env")
    pip_install(
        py, "--no-index", "--find-links", tiny_index.torch_index / "torch", "torch==2.14.1+cu130", check=True
    )
    pip_install(
        py, "--no-deps", "--index-url", f"{server.url}/all/simple", f"flash-attn=={V214_FWD}", check=True
    )
    trusted = ("--trusted-key", tiny_index.project / "keys" / "site.pub")
    doctor = cli("doctor", "--python", py, "--index-url", server.url, "--verify", *trusted, check=False)
    out = doctor.stdout
    assert f"warn yanked: {tiny_index.wheels[V214_FWD].name} was yanked from {server.url}" in out, out
    assert "ok   records: provenance: signed by " in out, out
    assert "ok   records: sbom: " in out and "warn records: parity: no signed parity record" in out, out
    assert f"ok   records: installed files: all 4 files of {tiny_index.wheels[V214_FWD].name}" in out, out
    which = cli("which", "--index-url", server.url, "--python", py, "--verify", *trusted)
    assert which.stdout.split()[2] == f"flash-attn=={V214}"
    assert "ok   provenance: signed by " in which.stderr, which.stderr
    assert "ok   parity: signed run on NVIDIA H100 80GB HBM3 (sm_90, 79 GiB): passed" in which.stderr


# ---------------------------------------------------------------- uv


def uv_env(tmp_path: Path) -> dict[str, str]:
    """uv with no user or system configuration, its own cache, this interpreter, no downloads of Pythons."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    env.update(
        XDG_CONFIG_HOME=str(tmp_path / "config"),  # no ~/.config/uv/uv.toml
        UV_CACHE_DIR=str(tmp_path / "uv-cache"),
        UV_PYTHON=sys.executable,
        UV_PYTHON_DOWNLOADS="never",
        UV_NO_PROGRESS="1",
    )
    return env


def uv(
    project: Path, env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    from uv import find_uv_bin

    return run([find_uv_bin(), *args], cwd=project, env=env, check=check)


def uv_add_line(config: str) -> list[str]:
    """The `uv add ...` that `which --format uv` says to run after merging its entries."""
    (line,) = [x for x in config.splitlines() if x.startswith("#   uv add ")]
    return shlex.split(line.removeprefix("#   "))


def locked_flash_attn(project: Path) -> dict[str, object]:
    lock = tomllib.loads((project / "uv.lock").read_text())
    (pkg,) = [p for p in lock["package"] if p["name"] == "flash-attn"]
    return pkg


def test_uv_sync_installs_the_variant_which_configures_and_the_next_after_a_torch_change(
    server: Served, tiny_index: TinyIndex, tmp_path: Path
) -> None:
    pytest.importorskip("uv")
    env = uv_env(tmp_path)
    project = tmp_path / "scratch"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        "[project]\n"
        'name = "scratch"\n'
        'version = "0.1.0"\n'
        'requires-python = ">=3.11"\n'
        'dependencies = ["torch==2.14.*"]\n'
        "\n"
        "# the stand-in torch; `default = true` replaces PyPI, so nothing is fetched from the public index\n"
        "[[tool.uv.index]]\n"
        'name = "torch-stand-in"\n'
        f'url = "{tiny_index.torch_index.as_uri()}"\n'
        "default = true\n"
    )
    uv(project, env, "sync")
    python = project / ".venv" / "bin" / "python"
    assert installed(python, "torch") == "2.14.1+cu130"

    # the printed entries, merged as they are, and the `uv add` they name: the variant for torch 2.14
    config = cli("which", "--index-url", server.url, "--python", python, "--format", "uv").stdout
    assert tomllib.loads(config) == {
        "tool": {
            "uv": {
                "index": [
                    {"name": "attnforge-flash-attn", "url": f"{server.url}/all/simple", "explicit": True}
                ],
                "sources": {"flash-attn": {"index": "attnforge-flash-attn"}},
            }
        }
    }
    with (project / "pyproject.toml").open("a") as fh:
        fh.write("\n" + config)
    add = uv_add_line(config)
    assert add == [
        "uv",
        "add",
        f"flash-attn=={V214}; sys_platform == 'linux' and platform_machine == 'x86_64'",
    ]
    uv(project, env, *add[1:])
    uv(project, env, "sync", "--locked")
    assert Version(installed(python)) == Version(V214)
    assert "torch 2.14.1 full" in run([python, "-c", "import flash_attn; print(flash_attn.BUILT_FOR)"]).stdout
    pkg = locked_flash_attn(project)
    assert Version(str(pkg["version"])) == Version(V214)
    (wheel,) = pkg["wheels"]  # type: ignore[misc]
    assert wheel["hash"] == f"sha256:{tiny_index.sha256(V214)}"
    assert (
        wheel["url"]
        == f"{server.url}/all/simple/flash-attn/{tiny_index.wheels[V214].name.replace('+', '%2B')}"
    )

    # the project moves to torch 2.13: the wheel's torch pin makes the old variant impossible, loudly
    pyproject = (project / "pyproject.toml").read_text()
    (project / "pyproject.toml").write_text(pyproject.replace('"torch==2.14.*"', '"torch==2.13.*"'))
    refused = uv(project, env, "lock", check=False)
    assert refused.returncode != 0 and "torch==2.14.*" in refused.stderr, refused.stderr
    (project / "pyproject.toml").write_text(pyproject)
    # which, asked for the torch the project is about to use, names the next variant; one `uv add` moves both
    config13 = cli(
        "which", "--index-url", server.url, "--python", python, "--torch", "2.13", "--format", "uv"
    ).stdout
    assert config13.split("\n\n", 1)[1] == config.split("\n\n", 1)[1]  # the same index and source entries
    add13 = uv_add_line(config13)
    uv(project, env, "add", "torch==2.13.*", *add13[2:])
    uv(project, env, "sync", "--locked")
    assert installed(python, "torch") == "2.13.0+cu130"
    assert Version(installed(python)) == Version(V213)
    pkg = locked_flash_attn(project)
    assert Version(str(pkg["version"])) == Version(V213)
    assert [w["hash"] for w in pkg["wheels"]] == [f"sha256:{tiny_index.sha256(V213)}"]  # type: ignore[attr-defined]

    # a PEP 751 lock file from it pins the same file and hash
    uv(project, env, "export", "--format", "pylock.toml", "-o", "pylock.toml", "--no-header")
    pylock = tomllib.loads((project / "pylock.toml").read_text())
    (entry,) = [p for p in pylock["packages"] if p["name"] == "flash-attn"]
    assert [w["hashes"]["sha256"] for w in entry["wheels"]] == [tiny_index.sha256(V213)]
    assert entry["marker"] == "platform_machine == 'x86_64' and sys_platform == 'linux'"


def test_pip_lock_pins_the_variant_wheel_and_its_hash(
    server: Served, tiny_index: TinyIndex, tmp_path: Path
) -> None:
    """docs/wheels.md's PEP 751 route with pip alone: `pip lock` against the variant's tree."""
    out = tmp_path / "pylock.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "lock",
            "--disable-pip-version-check",
            f"flash-attn=={V214}",
            "--index-url",
            f"{server.url}/cu130-torch2.14/simple",
            "--find-links",
            tiny_index.torch_index / "torch",
            "-o",
            out,
        ],
        env=env,
    )
    packages = {p["name"]: p for p in tomllib.loads(out.read_text())["packages"]}
    (wheel,) = packages["flash-attn"]["wheels"]
    assert wheel["hashes"] == {"sha256": tiny_index.sha256(V214)}
    assert wheel["url"].startswith(f"{server.url}/cu130-torch2.14/simple/flash-attn/")
    assert packages["torch"]["version"] == "2.14.1+cu130"
