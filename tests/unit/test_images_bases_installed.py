"""`attnforge images bases --update` from an installed attnforge refuses to rewrite the package's own pins."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnforge.cli import main as cli_main
from attnforge.core import package_files


def _installed_copy(tmp_path: Path) -> Path:
    """attnforge's docker/ folder as an installed package has it: under site-packages."""
    docker = tmp_path / "lib" / "python3.11" / "site-packages" / "attnforge" / "docker"
    shutil.copytree(package_files.packaged_docker_dir(), docker)
    return docker


def test_update_refuses_the_installed_packages_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    docker = _installed_copy(tmp_path)
    before = (docker / "bases.toml").read_bytes()
    monkeypatch.delenv(package_files.DOCKER_DIR_ENV, raising=False)
    monkeypatch.setattr(package_files, "packaged_docker_dir", lambda: docker)
    code = cli_main(["images", "bases", "--update", "local/debian:bookworm"])
    err = capsys.readouterr().err
    assert code != 0
    assert "belongs to the installed attnforge package" in err and package_files.DOCKER_DIR_ENV in err, err
    assert (docker / "bases.toml").read_bytes() == before


def test_the_same_folder_named_by_the_override_is_the_users_own(tmp_path: Path) -> None:
    docker = _installed_copy(tmp_path)
    assert package_files.inside_installed_package(docker)
    checkout = tmp_path / "repo" / "attnforge-docker"
    shutil.copytree(docker, checkout)
    assert not package_files.inside_installed_package(checkout)
