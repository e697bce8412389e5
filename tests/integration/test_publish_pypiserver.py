"""Publish real wheels to a real pypiserver (htpasswd auth, twine upload) and install them with pip."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("tests.integration.wheelfactory")

from tests.integration.wheelfactory import (  # noqa: E402
    Served,
    TorchEnv,
    cli,
    copy_wheel,
    fresh_env,
    pip_install,
    pypiserver,
    run,
    write_matrix,
)

pytest_plugins = ["tests.integration.wheelfactory"]

USER = "forge"
PASSWORD = "Tr0ub4dor-and-3-for-attnforge"
WRONG = "n0t-the-Passw0rd-but-secret-too"
V214 = "2.8.3+cu130torch2.14cxx11abiTRUE"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Served]:
    with pypiserver(tmp_path / "pypi", USER, PASSWORD) as served:
        yield served


def uploaded(server: Served) -> dict[str, str]:
    packages = Path(server.proc.args[-1])
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in packages.glob("*.whl")}


def project(tmp_path: Path, server: Served, **overrides: Any) -> Path:
    root = tmp_path / "proj"
    root.mkdir(exist_ok=True)
    dest = {
        "kind": "pypiserver",
        "url": server.url,
        "username_env": "ATTNFORGE_INDEX_USER",
        "password_env": "ATTNFORGE_INDEX_PASSWORD",
        "require_parity": True,
        **overrides,
    }
    if "password_file" in overrides:
        dest.pop("password_env")
    write_matrix(root, internal=dest)
    return root


def creds(password: str) -> dict[str, str]:
    return dict(os.environ, ATTNFORGE_INDEX_USER=USER, ATTNFORGE_INDEX_PASSWORD=password)


def with_parity(wheel: Path, dest: Path, passed: bool = True) -> Path:
    """A copy with a GPU parity outcome (`record_parity`)."""
    copy = copy_wheel(wheel, dest)
    record_parity(copy, passed)
    return copy


def record_parity(wheel: Path, passed: bool = True) -> None:
    """Record and sign a parity outcome as `attnforge parity record` does it (the wheel factory's key:
    docs/records.md); the report is written here, the cases ran on a GPU elsewhere."""
    report = wheel.parent / "parity.json"
    counts = {"passed": 12, "failed": 0} if passed else {"passed": 9, "failed": 3}
    inputs = json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text())["inputs"]
    report.write_text(
        json.dumps(
            {
                "device": "NVIDIA H100",
                "torch": inputs["torch"],  # the run's torch is the wheel's: the record binds it
                "wheel": wheel.name,
                "python": "cp311",
                "profile": "full",
                "skipped": 0,
                "cases": [],
                **counts,
            }
        )
    )
    cli(
        "parity",
        "record",
        wheel.with_name(wheel.name + ".manifest.json"),
        "--report",
        report,
        cwd=wheel.parent,
    )


def no_secret(*procs: Any) -> None:
    for proc in procs:
        for text in (proc.stdout, proc.stderr):
            assert PASSWORD not in text and WRONG not in text


def test_upload_with_parity_then_pip_installs(
    server: Served, wheel214: Path, torch214: TorchEnv, tmp_path: Path
) -> None:
    secret = tmp_path / "index-password"
    secret.write_text(PASSWORD + "\n")
    proj = project(tmp_path, server, password_file=str(secret))
    wheel = with_parity(wheel214, tmp_path / "ready")
    env = dict(os.environ, ATTNFORGE_INDEX_USER=USER)
    first = cli("publish", "--to", "internal", wheel.parent, cwd=proj, env=env)
    assert f"added      {wheel.name}" in first.stderr
    assert uploaded(server) == {wheel.name: hashlib.sha256(wheel.read_bytes()).hexdigest()}
    again = cli("publish", "--to", "internal", wheel.parent, cwd=proj, env=env)
    assert f"unchanged  {wheel.name}" in again.stderr and "nothing new" in again.stderr
    no_secret(first, again)
    py = fresh_env(tmp_path / "env", torch214)
    proc = pip_install(py, "--index-url", f"{server.url}/simple/", f"flash-attn=={V214}")
    assert proc.returncode == 0, proc.stderr
    out = run([py, "-c", "import torch, flash_attn_2_cuda; print(flash_attn_2_cuda.add_one(torch.ones(1)))"])
    assert "tensor([2.])" in out.stdout


def test_parity_gate_refuses_then_skip_is_loud(server: Served, wheel213: Path, tmp_path: Path) -> None:
    proj = project(tmp_path, server)
    wheel = copy_wheel(wheel213, tmp_path / "untested")  # parity: null
    refused = cli("publish", "--to", "internal", wheel.parent, cwd=proj, env=creds(PASSWORD), check=False)
    assert refused.returncode == 7
    assert "requires a passed GPU parity run" in refused.stderr and wheel.name in refused.stderr
    failed = with_parity(wheel213, tmp_path / "failed", passed=False)
    assert (
        cli(
            "publish", "--to", "internal", failed.parent, cwd=proj, env=creds(PASSWORD), check=False
        ).returncode
        == 7
    )
    assert uploaded(server) == {}
    skipped = cli(
        "publish", "--to", "internal", "--skip-parity-gate", wheel.parent, cwd=proj, env=creds(PASSWORD)
    )
    assert (
        "WARNING: --skip-parity-gate: publishing 1 wheel(s) to 'internal' WITHOUT a passed" in skipped.stderr
    )
    assert "(parity gate SKIPPED)" in skipped.stderr
    assert list(uploaded(server)) == [wheel.name]
    no_secret(refused, skipped)


def test_wrong_password_is_refused_and_never_printed(server: Served, wheel214: Path, tmp_path: Path) -> None:
    proj = project(tmp_path, server)
    wheel = with_parity(wheel214, tmp_path / "ready")
    proc = cli("publish", "--to", "internal", wheel.parent, cwd=proj, env=creds(WRONG), check=False)
    assert proc.returncode == 7, proc
    assert "credentials were refused" in proc.stderr and "nothing was published" in proc.stderr
    no_secret(proc)
    assert uploaded(server) == {}
    # an unset variable is named, not guessed
    env = {k: v for k, v in creds(PASSWORD).items() if k != "ATTNFORGE_INDEX_PASSWORD"}
    unset = cli("publish", "--to", "internal", wheel.parent, cwd=proj, env=env, check=False)
    assert unset.returncode == 7 and "$ATTNFORGE_INDEX_PASSWORD is not set" in unset.stderr


def test_conflict_refuses_the_whole_publish_before_uploading(
    server: Served, wheel214: Path, wheel213: Path, tmp_path: Path
) -> None:
    proj = project(tmp_path, server)
    wheel = with_parity(wheel214, tmp_path / "v1")
    cli("publish", "--to", "internal", wheel.parent, cwd=proj, env=creds(PASSWORD))
    # the same file name with other bytes, published together with a new wheel
    other = with_parity(wheel214, tmp_path / "v2")
    cli("wheels", "finalize", other, env=dict(os.environ, SOURCE_DATE_EPOCH="1700000200"))
    record_parity(other)  # new bytes: the parity record of the old ones no longer counts
    with_parity(wheel213, tmp_path / "v2")
    proc = cli("publish", "--to", "internal", other.parent, cwd=proj, env=creds(PASSWORD), check=False)
    assert proc.returncode == 7
    assert "already published with other bytes" in proc.stderr and "nothing was published" in proc.stderr
    assert list(uploaded(server)) == [wheel.name]  # the new 2.13 wheel did not go up either
    no_secret(proc)
