"""The image path end to end, small enough for every CI run: one runtime image (a real mini flash_attn
wheel compiled in the NGC stand-in, torch 2.13.0+cpu from a local index) and one NGC-style image (flash-attn
compiled by attnforge's builder on the stand-in against its own torch, with the patches its cell gets),
built with `attnforge images build --kind all`, smoke-tested, pushed with auth to a real local registry,
removed, chosen and pulled back by `attnforge pull --smoke`, smoke-tested again.

test_images_build.py (slow, not in CI) covers the rest: two CUDA variants, secrets in layers, a refused
password, the keep policy. Packages come through the test's own pip (imagekit.download_packages)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from attnforge.engine.backends.localindex import Sources
from attnforge.engine.backends.pipplan import PipPlan
from attnforge.images.localregistry import LocalRegistry
from attnforge.images.record import ImageSet, read_record
from attnforge.images.standin import ensure_standin

from .imagekit import (
    CA,
    MINI,
    RELEASE,
    STANDIN_TORCH,
    docker,
    mini_wheels,
    package_index,
    remove_repository,
    write_compat,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = "attnforge-test/ci-images"
INDEX_USER = "ci-index"
INDEX_PW = "idx-" + secrets.token_hex(16)
REG_USER = "ci-pusher"
REG_PW = "reg-" + secrets.token_hex(16)
RUNTIME_TAG = "flash-attn2.8.3-cu130-torch2.13-py3.11"
NGC_TAG = f"flash-attn2.8.3-ngc{RELEASE}-py3.11"
RunCli = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("images-fast")


@pytest.fixture(scope="module")
def index(work: Path) -> Iterator[tuple[str, Path]]:
    """(url, netrc) of an authenticated local index of what pip downloaded for the images."""
    with package_index(work, INDEX_USER, INDEX_PW) as served:
        yield served


@pytest.fixture(scope="module")
def built(work: Path, index: tuple[str, Path]) -> Iterator[tuple[ImageSet, Path]]:
    """The stand-in (made once per machine), one mini wheel compiled in it, and the two images."""
    from attnforge.cli import main

    url, netrc = index
    standin = ensure_standin(RELEASE, plan=PipPlan(url, [], Sources()), ca_bundle=CA, netrc=netrc, log=print)
    wheels = mini_wheels(
        work / "wheels", standin.tag, {"cu130torch2.13cxx11abiTRUE": ("cuda13.0", ["sm_90"])}
    )
    code = main(
        [
            "--compat",
            str(write_compat(work / "compat.toml")),
            "images",
            "build",
            "--wheels",
            str(wheels),
            "--kind",
            "all",
            "--repository",
            REPO,
            "--ngc-standin",
            "--source",
            str(MINI),
            "--torch-index",
            url,
            "--netrc",
            str(netrc),
            "--ca-bundle",
            str(CA),
        ]
    )
    assert code == 0
    yield read_record(wheels / "images.json"), wheels
    remove_repository(REPO)


def test_runtime_and_ngc_images_built_and_smoked(built: tuple[ImageSet, Path]) -> None:
    """Both images pass their smoke test; the NGC one holds the builder's wheel for the stand-in's torch,
    compiled with the torch-free-kernels patch its cell gets (as every flash-attn 2.8.3 CUDA cell)."""
    images, wheels = built
    tags = {i.tag: i for i in images.images}
    assert sorted(tags) == [RUNTIME_TAG, NGC_TAG]
    assert tags[RUNTIME_TAG].aliases == ["cu130-torch2.13-latest"]
    assert tags[NGC_TAG].aliases == [f"ngc{RELEASE}-latest"]
    for img in images.images:
        assert img.smoke["ok"] is True, img.smoke
        assert img.smoke["extension"].endswith(".so") and img.smoke["gpu"] == "no GPU"
    assert tags[RUNTIME_TAG].smoke["torch"] == "2.13.0+cpu" and tags[NGC_TAG].smoke["torch"] == STANDIN_TORCH
    manifest = json.loads(Path(f"{tags[NGC_TAG].wheel}.manifest.json").read_text())
    assert Path(tags[NGC_TAG].wheel).parent == wheels / "ngc"
    assert manifest["build"]["backend"] == "env" and manifest["build"]["torch_build"] == STANDIN_TORCH
    assert "torch-free-kernels" in manifest["inputs"]["patches"]  # applied, or the build had failed


def test_push_pull_back_and_smoke(
    built: tuple[ImageSet, Path], run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Push the set with auth, remove it locally, and let `attnforge pull` choose, pull and smoke-test each
    image again for a described GPU."""
    images, wheels = built
    monkeypatch.setenv("ATTNFORGE_REGISTRY_PASSWORD", REG_PW)
    with LocalRegistry({REG_USER: REG_PW}) as reg:
        code, out, err = run_cli(
            "images",
            "push",
            "--registry",
            reg.host,
            "--record",
            str(wheels / "images.json"),
            "--username",
            REG_USER,
        )
        assert code == 0, err
        assert "all 4 tags pushed" in out and REG_PW not in out + err
        for img in images.images:
            docker("rmi", *[f"{REPO}:{t}" for t in [img.tag, *img.aliases]])
        base = [
            "pull",
            "--registry",
            reg.host,
            "--repository",
            REPO,
            "--username",
            REG_USER,
            "--smoke",
            "--gpu",
            "sm_90",
            "--driver",
            "580.65.06",
        ]
        for kind, tag in (("runtime", RUNTIME_TAG), ("ngc", NGC_TAG)):
            code, out, err = run_cli(*base, "--kind", kind)
            ref = f"{reg.host}/{REPO}:{tag}"
            assert code == 0, out + err
            assert f"choice: {ref}" in out and f"{ref}: smoke ok" in out
            docker("rmi", ref, check=False)
