"""attnforge as an installed tool: its own wheel in a fresh venv outside the checkout (conftest's
`installed_attnforge`), run in a folder that holds only a copy of matrix.yaml. `plan`, `build --dry-run` and the
builder image (`build --builder-image-only`) must work from the package data alone (the Dockerfiles ship in the
wheel). About 1-2 minutes: the wheel, the venv from the configured index, a builder image Docker mostly reuses.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from .conftest import InstalledAttnforge

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CELL = "flash-attn-2.8.3-cu130-torch2.14.1-cp311-abi1-sm90-fwd128-x86_64"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A team's own folder: matrix.yaml and nothing else of this repository."""
    folder = tmp_path / "team"
    folder.mkdir()
    shutil.copy2(ROOT / "matrix.yaml", folder / "matrix.yaml")
    return folder


def test_the_wheel_carries_every_resource(installed_attnforge: InstalledAttnforge) -> None:
    names = set(zipfile.ZipFile(installed_attnforge.wheel).namelist())
    for name in (
        "attnforge/docker/cuda-builder.Dockerfile",
        "attnforge/docker/bases.toml",
        "attnforge/docker/cuda-standin/assemble-cuda.sh",
        "attnforge/docker/ngc-standin/fake-flash-attn/flash_attn/__init__.py",
        "attnforge/docker/runtime.Dockerfile",
        "attnforge/builder/patches/torch-free-kernels.json",
        "attnforge/data/compat.toml",
        "attnforge/py.typed",
    ):
        assert name in names, name


def test_installed_attnforge_ships_its_guides(installed_attnforge: InstalledAttnforge, project: Path) -> None:
    """Every guide of docs/ is in the wheel, listed by `attnforge docs` and printed as written to a pipe."""
    inst = installed_attnforge
    names = set(zipfile.ZipFile(inst.wheel).namelist())
    guides = sorted((ROOT / "docs").glob("*.md"))
    assert guides and {f"attnforge/docs/{g.name}" for g in guides} <= names
    listed = inst.run("docs", cwd=project)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [g.stem for g in guides]
    shown = inst.run("docs", "records", cwd=project)
    assert shown.returncode == 0 and shown.stdout == (ROOT / "docs" / "records.md").read_text(
        encoding="utf-8"
    )
    where = inst.run("docs", "compat-data", "--path", cwd=project)
    path = Path(where.stdout.strip())
    assert path.is_file() and path.is_relative_to(inst.venv) and "site-packages" in path.parts
    missing = inst.run("docs", "no-such-topic", cwd=project)
    assert missing.returncode == 2 and "no guide named 'no-such-topic'" in missing.stderr


def test_installed_attnforge_plans_and_builds_the_builder_image(
    installed_attnforge: InstalledAttnforge, project: Path
) -> None:
    inst = installed_attnforge
    probe = inst.run("--help", cwd=project)
    assert probe.returncode == 0, probe.stderr
    where = subprocess.run(
        [str(inst.python), "-c", "import attnforge; print(attnforge.__file__)"],
        cwd=project,
        capture_output=True,
        text=True,
        env=inst.env(),
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(inst.venv), where
    assert not Path(where).is_relative_to(ROOT), where

    plan = inst.run("plan", "-t", "default", "--format", "json", cwd=project, timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert f'"id": "{CELL}"' in plan.stdout and '"valid": 1' in plan.stdout

    dry = inst.run("build", "-t", "default", "--dry-run", "--quiet", cwd=project, timeout=300)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    out = dry.stdout + dry.stderr
    assert f"{CELL} -> flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE.fwd128-cp311" in out and "(docker)" in out

    image = inst.run("build", "-t", "default", "--builder-image-only", "--quiet", cwd=project, timeout=1800)
    out = image.stdout + image.stderr
    assert image.returncode == 0, out[-3000:]
    assert "builder image cuda13.0: attnforge/cuda-builder:cu130-" in out, out[-2000:]
    assert "ATTNFORGE_DOCKER_DIR" not in out
    assert not list(project.rglob("*.whl"))  # nothing built but the image
