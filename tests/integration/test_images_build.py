"""Real images end to end, kept small with the CPU torch (torch 2.13.0+cpu, 190 MB) instead of the 5 GB
CUDA torch: the NGC stand-in base (attnforge-standin/ngc-pytorch, NOT NGC: its CPU torch relabelled as a
custom build, `2.13.0a0+standin`), a real small wheel (tests/integration/data/mini_flash_attn, a torch C++
extension named flash_attn / flash_attn_2_cuda, compiled inside the stand-in against its torch), two runtime
images labelled as two CUDA variants and one NGC-style image whose flash-attn attnforge's builder compiles
on the stand-in against its own torch (the fixture carries upstream's lines that the cell's patches edit),
finalized on the host; each smoke-tested, checked for leaked secrets (`docker history --no-trunc`,
`docker inspect`, the bytes of `docker save`), pushed with auth to a real registry, removed locally, chosen
and pulled back by `attnforge pull` and smoke-tested again. Real NGC images (nvcr.io) only at real sites.
The small end-to-end run CI makes on every change is test_images_fast.py.

torch and its dependencies are downloaded by the test's own pip (its configuration and cache) and served from
an authenticated local index (basic auth, credentials only in a netrc given as a BuildKit secret); the host
CA bundle goes in as a secret too."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import zipfile
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
    DOCKER,
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

REPO = "attnforge-test/images"
INDEX_USER = "indexuser"
INDEX_PW = "idx-" + secrets.token_hex(16)
REG_USER = "pusher"
REG_PW = "reg-" + secrets.token_hex(16)
RunCli = Callable[..., tuple[int, str, str]]

VARIANTS = {  # local version -> (toolkit, arches) the manifest claims (the wheel is a CPU build)
    "cu130torch2.13cxx11abiTRUE": ("cuda13.0", ["sm_90"]),
    "cu126torch2.13cxx11abiTRUE": ("cuda12.6", ["sm_80", "sm_86"]),
}


def stream_contains(ref: str, needles: list[bytes]) -> list[bytes]:
    """The needles found in `docker save REF` (streamed; layers are uncompressed tars)."""
    found: set[bytes] = set()
    keep = max(len(n) for n in needles)
    tail = b""
    with subprocess.Popen([DOCKER, "save", ref], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        while chunk := proc.stdout.read(1 << 22):
            window = tail + chunk
            found.update(n for n in needles if n in window)
            tail = window[-keep:]
    assert proc.returncode == 0
    return sorted(found)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="module")
def index(work: Path) -> Iterator[tuple[str, Path]]:
    """An authenticated PEP 503 index of the packages pip downloaded for the images; (url, netrc file)."""
    with package_index(work, INDEX_USER, INDEX_PW) as served:
        yield served


@pytest.fixture(scope="module")
def standin(index: tuple[str, Path]) -> str:
    url, netrc = index
    res = ensure_standin(RELEASE, plan=PipPlan(url, [], Sources()), ca_bundle=CA, netrc=netrc, log=print)
    return res.tag


@pytest.fixture(scope="module")
def wheels(work: Path, standin: str) -> Path:
    """Two real wheels of the mini flash_attn, compiled once inside the stand-in (the second reuses the
    objects), with manifests naming two CUDA variants."""
    return mini_wheels(work / "wheels", standin, VARIANTS)


@pytest.fixture(scope="module")
def built(work: Path, wheels: Path, index: tuple[str, Path], standin: str) -> Iterator[ImageSet]:
    """`attnforge images build --kind all`: two runtime images + one NGC (stand-in) image, smoke-tested; the
    NGC image's flash-attn compiled by the builder on the stand-in from --source (a folder, packed)."""
    from attnforge.cli import main

    url, netrc = index
    compat = write_compat(work / "compat.toml")
    code = main(
        [
            "--compat",
            str(compat),
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
    yield read_record(wheels / "images.json")
    remove_repository(REPO)


def test_images_built_smoked_and_labelled(built: ImageSet) -> None:
    """Tags, aliases, OCI + attnforge labels, and a passed smoke test for each image."""
    tags = {i.tag: i for i in built.images}
    assert sorted(tags) == [
        "flash-attn2.8.3-cu126-torch2.13-py3.11",
        "flash-attn2.8.3-cu130-torch2.13-py3.11",
        "flash-attn2.8.3-ngc99.09-py3.11",
    ]
    assert tags["flash-attn2.8.3-cu130-torch2.13-py3.11"].aliases == ["cu130-torch2.13-latest"]
    for img in built.images:
        assert img.smoke["ok"] is True, img.smoke
        torch = STANDIN_TORCH if img.kind == "ngc" else "2.13.0+cpu"
        assert img.smoke["torch"] == torch and img.smoke["gpu"] == "no GPU"
        assert img.smoke["extension"].endswith(".so")
        labels = docker("image", "inspect", "--format", "{{json .Config.Labels}}", f"{REPO}:{img.tag}").stdout
        lab = json.loads(labels)
        for key in ("torch", "toolkit", "arches", "profile", "flash-attn", "parity"):
            assert lab[f"io.attnforge.{key}"], key
        assert lab["org.opencontainers.image.version"].startswith("2.8.3+")
        assert lab["org.opencontainers.image.base.digest"].startswith("sha256:")
    ngc = json.loads(
        docker(
            "image",
            "inspect",
            "--format",
            "{{json .Config.Labels}}",
            f"{REPO}:flash-attn2.8.3-ngc99.09-py3.11",
        ).stdout
    )
    assert ngc["io.attnforge.ngc.flash-attn-policy"] == "replace"
    assert ngc["io.attnforge.ngc.bundled-flash-attn"] == "2.7.4+standin"
    assert ngc["io.attnforge.standin"].startswith("true")
    assert ngc["io.attnforge.torch"] == STANDIN_TORCH
    assert ngc["io.attnforge.flash-attn"] == NGC_VERSION
    assert tags["flash-attn2.8.3-ngc99.09-py3.11"].smoke["constraint_pins"] == [f"flash-attn=={NGC_VERSION}"]


NGC_VERSION = "2.8.3+cu130torch2.13cxx11abiTRUE.pt2130a0standin"


def test_ngc_wheel_is_the_builders_and_finalized(built: ImageSet, wheels: Path) -> None:
    """The NGC image's flash-attn: compiled by attnforge's builder against the stand-in's own torch (no nvcc,
    a CPU torch), finalized (manifest `build.backend: "env"`, the exact torch build recorded and pinned,
    manylinux tag) and kept under <wheels>/ngc/; the image holds that wheel's install, no source, no builder."""
    img = next(i for i in built.images if i.kind == "ngc")
    wheel = Path(img.wheel)
    assert wheel.parent == wheels / "ngc" and wheel.is_file()
    assert wheel.name.startswith(f"flash_attn-{NGC_VERSION}-cp311-cp311-manylinux_")
    manifest = json.loads(Path(f"{wheel}.manifest.json").read_text())
    assert manifest["build"]["backend"] == "env" and manifest["build"]["torch_build"] == STANDIN_TORCH
    assert manifest["inputs"]["torch_build"] == STANDIN_TORCH and manifest["inputs"]["torch_variant"] == "cpu"
    assert manifest["variant"] == "cu130-torch2.13-pt2130a0standin"
    assert manifest["toolchain"]["nvcc"] is None and manifest["toolchain"]["torch"] == STANDIN_TORCH
    assert manifest["finalize"]["torch_requirement"] == f"torch=={STANDIN_TORCH}"
    assert manifest["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"flash_attn-{NGC_VERSION}.dist-info/METADATA").decode()
        record = json.loads(zf.read(f"flash_attn-{NGC_VERSION}.dist-info/attnforge_build.json"))
    assert f"Requires-Dist: torch=={STANDIN_TORCH}" in meta.splitlines()
    assert record["local_version"] == NGC_VERSION.split("+")[1] and record["inputs"]["arches"] == ["sm_90"]
    probe = docker(
        "run",
        "--rm",
        "--network",
        "none",
        f"{REPO}:{img.tag}",
        "sh",
        "-c",
        "python -c 'from importlib.metadata import version; print(version(\"flash_attn\"))'; find / -xdev \\( -name add_one_kernel.cu "
        "-o -name spec.json -o -name rusage_wrap.py -o -name 'flash_attn-*.whl' -o -name 'attnforge-build' \\) -print",
    )
    assert probe.stdout.split() == [NGC_VERSION], probe.stdout


def test_no_secret_compiler_or_source_in_images(built: ImageSet) -> None:
    """The index password, user and address and the CA bundle are in no history, no config, no layer byte;
    the runtime images carry no compiler, wheel file or source."""
    ca_tail = CA.read_bytes().strip().splitlines()[-3]  # a base64 line of the bundle's last certificate
    needles = [INDEX_PW.encode(), f"login {INDEX_USER}".encode(), ca_tail]
    for img in built.images:
        ref = f"{REPO}:{img.tag}"
        meta = docker("history", "--no-trunc", ref).stdout + docker("image", "inspect", ref).stdout
        assert INDEX_PW not in meta and INDEX_USER not in meta
        assert "127.0.0.1" not in meta  # the index address is in the pip.conf secret, not a build arg
        assert stream_contains(ref, needles) == []
        if img.kind == "runtime":
            probe = docker(
                "run",
                "--rm",
                "--network",
                "none",
                ref,
                "sh",
                "-c",
                "command -v gcc g++ cc c++ nvcc; find / -xdev \\( -name '*.whl' -o -name 'flash_api.cpp' "
                "-o -name 'add_one_kernel.cu' -o -name .netrc -o -name pip.conf \\) -print",
                check=False,
            )
            assert probe.stdout.strip() == "", probe.stdout


def test_push_remove_pull_back_and_smoke(
    built: ImageSet, wheels: Path, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Push with auth (a wrong password is refused with exit 7), remove the local images, and let
    `attnforge pull` choose each one back for a described GPU, pull it and smoke-test it."""
    with LocalRegistry({REG_USER: REG_PW}) as reg:
        monkeypatch.setenv("WRONG_PW", "nope-" + secrets.token_hex(6))
        code, out, err = run_cli(
            "images",
            "push",
            "--registry",
            reg.host,
            "--record",
            str(wheels / "images.json"),
            "--username",
            REG_USER,
            "--password-env",
            "WRONG_PW",
        )
        assert code == 7 and "nope-" not in out + err
        monkeypatch.setenv("ATTNFORGE_REGISTRY_PASSWORD", REG_PW)
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
        assert "all 6 tags pushed" in out and REG_PW not in out + err
        for img in built.images:
            docker("rmi", *[f"{REPO}:{t}" for t in [img.tag, *img.aliases]])
            assert docker("image", "inspect", f"{REPO}:{img.tag}", check=False).returncode != 0
        base = ["pull", "--registry", reg.host, "--repository", REPO, "--username", REG_USER, "--smoke"]
        cases = [
            (
                ["--kind", "runtime", "--gpu", "sm_90", "--driver", "580.65.06"],
                "flash-attn2.8.3-cu130-torch2.13-py3.11",
            ),
            (
                ["--kind", "runtime", "--gpu", "sm_86", "--driver", "535.104.05"],
                "flash-attn2.8.3-cu126-torch2.13-py3.11",
            ),
            (["--kind", "ngc", "--gpu", "sm_90", "--driver", "580.65.06"], "flash-attn2.8.3-ngc99.09-py3.11"),
        ]
        for args, tag in cases:
            code, out, err = run_cli(*base, *args)
            assert code == 0, out + err
            ref = f"{reg.host}/{REPO}:{tag}"
            assert f"choice: {ref}" in out and f"{ref}: smoke ok" in out
            assert REG_PW not in out + err
            docker("rmi", ref, check=False)


def test_ngc_keep_policy_tests_the_bundled_flash_attn(
    built: ImageSet, wheels: Path, work: Path, run_cli: RunCli
) -> None:
    """--ngc-policy keep: the stand-in's bundled (fake) flash-attn and constraint file stay, no compile,
    tag ...-ngc99.09-bundled-..., labelled as kept; the smoke test tests the bundled one."""
    other = work / "wheels-keep"
    other.mkdir()
    for f in wheels.glob("flash_attn-*"):
        (other / f.name).write_bytes(f.read_bytes())
    code, _, err = run_cli(
        "--compat",
        str(work / "compat.toml"),
        "images",
        "build",
        "--wheels",
        str(other),
        "--kind",
        "ngc",
        "--repository",
        REPO,
        "--ngc-standin",
        "--ngc-policy",
        "keep",
    )
    assert code == 0, err
    record = read_record(other / "images.json")
    assert [i.tag for i in record.images] == ["flash-attn2.7.4-ngc99.09-bundled-py3.11"]
    img = record.images[0]
    assert img.labels["io.attnforge.ngc.flash-attn-policy"] == "keep"
    assert img.smoke["ok"] and img.smoke["flash_attn"] == "2.7.4+standin"
    assert img.smoke["constraint_pins"] == ["flash_attn==2.7.4+standin"]
    assert not img.smoke["extension"].endswith(".so")  # the stand-in's stub, kept as NGC's would be
