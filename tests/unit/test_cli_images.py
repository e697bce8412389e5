"""`attnforge images build` from the command line: its options object, the dry run and the errors it
turns into exit codes (no Docker engine needed; the builds themselves: tests/integration/test_images_*)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from attnforge.cli.commands.images import ImageBuildOptions, build_cmd
from tests.unit.test_images_units import _manifest

Run = Callable[..., tuple[int, str, str]]
WHEEL = "flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"


def _wheels(tmp_path: Path) -> Path:
    """A wheels folder with one finished wheel and its manifest (bytes and digest agree)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel = folder / WHEEL
    wheel.write_bytes(b"not really a wheel")
    manifest = _manifest(WHEEL)
    manifest["sha256"] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    manifest["size"] = wheel.stat().st_size
    (folder / f"{WHEEL}.manifest.json").write_text(json.dumps(manifest))
    return folder


def test_options_object_has_one_field_per_option() -> None:
    names = [p.name for p in build_cmd.params]
    assert sorted(names) == sorted(f.name for f in dataclasses.fields(ImageBuildOptions))
    assert len(names) == 26


def test_dry_run_lists_the_image_and_builds_nothing(run_cli: Run, tmp_path: Path) -> None:
    wheels = _wheels(tmp_path)
    code, out, err = run_cli(
        "--matrix",
        str(tmp_path / "none.yaml"),
        "images",
        "build",
        "--wheels",
        str(wheels),
        "--runtime-base",
        "local/debian:bookworm",
        "--no-host-pip",
        "--no-ca-bundle",
        "--torch-index",
        "https://download.pytorch.org/whl/cu130",
        "--dry-run",
    )
    assert code == 0, err
    lines = out.splitlines()
    assert (
        lines[0].startswith("attnforge/flash-attn:") and "(runtime, base local/debian:bookworm)" in lines[0]
    )
    assert f"  wheel {wheels / WHEEL}; torch==2.14.1" in out
    assert "pip: index https://download.pytorch.org/whl/cu130" in out
    assert lines[-1] == "secrets: pip_conf"
    assert "note: no matrix data" in err


def test_nothing_to_build_is_exit_3(run_cli: Run, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli(
        "--matrix", str(tmp_path / "none.yaml"), "images", "build", "--wheels", str(empty), "--dry-run"
    )
    assert code == 3 and f"no image to build (wheels folder {empty}, kind runtime)" in err


def test_push_without_smoke_is_exit_2(run_cli: Run, tmp_path: Path) -> None:
    code, _, err = run_cli(
        "--matrix", str(tmp_path / "none.yaml"), "images", "build", "--push", "h:5000", "--no-smoke"
    )
    assert code == 2 and "--push needs the smoke test: drop --no-smoke" in err
