"""Push and pull against a real registry (Debian's docker-registry with bcrypt htpasswd auth, deletes on),
with tiny one-file images made by `docker import` (seconds, not minutes): the all-or-nothing push and its
rollback, refused credentials (exit 7, password never printed), and `attnforge pull` choosing between two
variants by their labels. The full build -> smoke -> push -> pull of real images is test_images_build.py."""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from attnforge.core.docker_cli import docker_executable
from attnforge.core.errors import PublishError
from attnforge.images.localregistry import LocalRegistry
from attnforge.images.push import push_set
from attnforge.images.record import BuiltImage, ImageSet, write_record
from attnforge.images.registry import Registry

pytestmark = pytest.mark.docker

DOCKER = docker_executable()  # ATTNFORGE_DOCKER, as attnforge itself
USER = "alice"
PASSWORD = "pw-" + secrets.token_hex(12)
LOCAL = "attnforge-test/images-fast"
RunCli = Callable[..., tuple[int, str, str]]
CREATED: list[str] = []  # image IDs made here, removed at the end (tags get reused across tests)


def labels_for(toolkit: str, arches: str, variant: str) -> dict[str, str]:
    return {
        "io.attnforge.kind": "runtime",
        "io.attnforge.toolkit": toolkit,
        "io.attnforge.arches": arches,
        "io.attnforge.variant": variant,
        "io.attnforge.torch": "2.13.0+cpu",
        "io.attnforge.flash-attn": "2.8.3",
        "io.attnforge.profile": "full",
        "io.attnforge.python": "3.11",
    }


def tiny_image(ref: str, content: str, labels: dict[str, str] | None = None) -> str:
    """A one-file image (a few hundred bytes) named ref; returns its ID."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = content.encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    cmd = [DOCKER, "import"]
    for k, v in (labels or {}).items():
        cmd += ["--change", f"LABEL {k}={v}"]
    proc = subprocess.run([*cmd, "-", ref], input=buf.getvalue(), capture_output=True, check=True)
    CREATED.append(proc.stdout.decode().strip())
    return CREATED[-1]


def image_set(images: dict[str, tuple[str, list[str]]]) -> ImageSet:
    """tag -> (content, aliases): local images tagged LOCAL:tag and LOCAL:alias, and their set."""
    out = ImageSet(LOCAL)
    for tag, (content, aliases) in images.items():
        iid = tiny_image(f"{LOCAL}:{tag}", content)
        for a in aliases:
            subprocess.run([DOCKER, "tag", f"{LOCAL}:{tag}", f"{LOCAL}:{a}"], check=True)
        out.images.append(BuiltImage(tag, "runtime", iid, {}, list(aliases), smoke={"ok": True}))
    return out


@pytest.fixture(scope="module")
def registry() -> Iterator[LocalRegistry]:
    with LocalRegistry({USER: PASSWORD}) as reg:
        yield reg
    refs = subprocess.run(
        [DOCKER, "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    mine = [r for r in refs if "attnforge-test/" in r]
    if mine or CREATED:
        subprocess.run([DOCKER, "rmi", "-f", *mine, *CREATED], capture_output=True, check=False)


def state(reg: Registry, repo: str) -> dict[str, str | None]:
    return {t: reg.digest(repo, t) for t in reg.tags(repo)}


def test_push_is_all_or_nothing(registry: LocalRegistry) -> None:
    """A set pushes every tag; a set that fails midway is rolled back: the moved alias gets its old
    manifest back, the new tags are deleted through the registry API, and the registry is as before."""
    api = Registry(registry.host, USER, PASSWORD)
    repo = "attnforge-test/all-or-nothing"
    first = image_set({"flash-attn2.8.3-cu130-torch2.13-py3.11": ("v1", ["cu130-torch2.13-latest"])})
    report = push_set(first, registry.host, username=USER, password=PASSWORD, repository=repo)
    assert report.ok and len(report.pushed) == 2
    before = state(api, repo)
    assert sorted(before) == ["cu130-torch2.13-latest", "flash-attn2.8.3-cu130-torch2.13-py3.11"]
    assert before["cu130-torch2.13-latest"] == before["flash-attn2.8.3-cu130-torch2.13-py3.11"]

    second = image_set(
        {
            "flash-attn2.8.4-cu130-torch2.13-py3.11": ("v2-cu130", ["cu130-torch2.13-latest"]),
            "flash-attn2.8.4-cu126-torch2.13-py3.11": ("v2-cu126", ["cu126-torch2.13-latest"]),
        }
    )
    seen: list[str] = []

    def fail_on_last_alias(tag: str) -> None:  # the push of the set's last tag breaks for real
        seen.append(tag)
        if tag == "cu126-torch2.13-latest":
            subprocess.run([DOCKER, "rmi", f"{LOCAL}:flash-attn2.8.4-cu126-torch2.13-py3.11"], check=True)

    with pytest.raises(PublishError) as err:
        push_set(
            second, registry.host, username=USER, password=PASSWORD, repository=repo, hook=fail_on_last_alias
        )
    text = str(err.value)
    assert seen[-1] == "cu126-torch2.13-latest" and len(seen) == 4  # three tags landed before the failure
    assert "restored cu130-torch2.13-latest" in text
    assert "removed  flash-attn2.8.4-cu130-torch2.13-py3.11" in text
    assert "removed  flash-attn2.8.4-cu126-torch2.13-py3.11" in text
    assert "rolled back" in text and PASSWORD not in text
    assert state(api, repo) == before


def test_wrong_credentials_refused_exit_7(
    registry: LocalRegistry, run_cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`images push` with a wrong password: exit 7, nothing pushed, the password in no output; the right
    one pushes, and no docker config keeps the credential afterwards."""
    one = image_set({"flash-attn2.8.3-cu130-torch2.13-py3.10": ("creds", ["cu130-torch2.13-py310-latest"])})
    record = tmp_path / "images.json"
    write_record(record, one)
    wrong = "wrong-" + secrets.token_hex(8)
    monkeypatch.setenv("BAD_PW", wrong)
    repo = "attnforge-test/creds"
    code, out, err = run_cli(
        "images",
        "push",
        "--registry",
        registry.host,
        "--repository",
        repo,
        "--record",
        str(record),
        "--username",
        USER,
        "--password-env",
        "BAD_PW",
    )
    assert code == 7, err
    assert "refused" in err and wrong not in out + err
    assert Registry(registry.host, USER, PASSWORD).tags(repo) == []
    monkeypatch.setenv("GOOD_PW", PASSWORD)
    code, out, err = run_cli(
        "images",
        "push",
        "--registry",
        registry.host,
        "--repository",
        repo,
        "--record",
        str(record),
        "--username",
        USER,
        "--password-env",
        "GOOD_PW",
    )
    assert code == 0, err
    assert "all 2 tags pushed" in out and PASSWORD not in out + err
    config = Path.home() / ".docker" / "config.json"
    if config.exists():
        assert registry.host not in config.read_text()


def test_pull_chooses_the_variant_that_fits(
    registry: LocalRegistry, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two variants under different tags (labels say CUDA 13.0/sm_90 and CUDA 12.6/sm_80,sm_86):
    `attnforge pull` picks by driver and GPU arch, explains a refusal, and pulls the choice."""
    repo = "attnforge-test/pull"
    cu130 = "flash-attn2.8.3-cu130-torch2.13-py3.11"
    cu126 = "flash-attn2.8.3-cu126-torch2.13-py3.11"
    tiny_image(f"{LOCAL}:{cu130}", "cu130", labels_for("cuda13.0", "sm_90", "cu130-torch2.13"))
    tiny_image(f"{LOCAL}:{cu126}", "cu126", labels_for("cuda12.6", "sm_80,sm_86", "cu126-torch2.13"))
    pair = ImageSet(
        LOCAL,
        [
            BuiltImage(cu130, "runtime", "", {}, ["cu130-torch2.13-latest"]),
            BuiltImage(cu126, "runtime", "", {}),
        ],
    )
    subprocess.run([DOCKER, "tag", f"{LOCAL}:{cu130}", f"{LOCAL}:cu130-torch2.13-latest"], check=True)
    push_set(pair, registry.host, username=USER, password=PASSWORD, repository=repo)
    monkeypatch.setenv("ATTNFORGE_REGISTRY_PASSWORD", PASSWORD)
    base = ["pull", "--registry", registry.host, "--repository", repo, "--username", USER]

    code, out, err = run_cli(*base, "--gpu", "sm_90", "--driver", "580.65.06", "--dry-run")
    assert code == 0, err
    assert f"choice: {registry.host}/{repo}:{cu130}" in out and "exact arch match" in out

    code, out, err = run_cli(*base, "--gpu", "sm_86", "--driver", "535.104.05", "--dry-run")
    assert code == 0, err
    assert f"choice: {registry.host}/{repo}:{cu126}" in out
    assert "needs driver >= 580.65.06" in out  # why cu130 lost

    code, out, err = run_cli(*base, "--gpu", "sm_90", "--driver", "535.104.05", "--dry-run")
    assert code == 3
    assert "no kernel for sm_90" in out and "needs driver" in out and "no image" in err

    code, out, err = run_cli(*base, "--dry-run")  # this machine: no nvidia-smi, no GPU
    assert code == 3 and "no GPU" in out + err

    code, out, err = run_cli(*base, "--gpu", "sm_86", "--driver", "535.104.05")
    assert code == 0, err
    ref = f"{registry.host}/{repo}:{cu126}"
    assert f"pulled {ref}" in out and PASSWORD not in out + err
    inspect = subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True, text=True, check=True)
    assert json.loads(inspect.stdout)[0]["Config"]["Labels"]["io.attnforge.toolkit"] == "cuda12.6"
    subprocess.run([DOCKER, "rmi", ref], capture_output=True, check=False)
