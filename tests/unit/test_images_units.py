"""Unit tests of attnforge.images: tags and labels, runtime requests, the pull chooser, pip plans,
credentials, bases.toml, the local index server, the push rollback (against an in-memory registry) and
the docker login's use of stdin (NGC requests: test_images_ngc.py). No Docker engine needed."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from attnforge.client.pull import Candidate, Host, arch_fit, evaluate
from attnforge.core.docker_cli import Docker, pushed_digest, redact
from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.core.package_files import packaged_docker_dir
from attnforge.engine.backends.localindex import LocalIndexServer, Sources, project_of
from attnforge.engine.backends.pip_config import PipOptions
from attnforge.engine.backends.pipplan import plan_pip
from attnforge.engine.base_images import BaseRecord, load_bases, write_bases
from attnforge.images import push as push_mod
from attnforge.images.credentials import resolve_credentials
from attnforge.images.record import BuiltImage, ImageSet
from attnforge.images.registry import Manifest, is_loopback
from attnforge.images.requests import (
    ImageRequest,
    flex_wheels_for,
    runtime_request,
    torch_requirement,
)
from attnforge.images.tags import ImageSpec, aliases, is_alias, parse_tag, resolve_tags
from attnforge.names import profile_tag_of

FLOORS = {12: "525.60.13", 13: "580.65.06"}


def spec(**kw: object) -> ImageSpec:
    base: dict[str, object] = dict(
        kind="runtime",
        kernel="flash-attn",
        kernel_version="2.8.3",
        dist_version="2.8.3+cu130torch2.14cxx11abiTRUE",
        variant="cu130-torch2.14",
        python="3.11",
        toolkit="cuda13.0",
        torch="2.14.1+cu130",
        arches=("sm_90",),
    )
    base.update(kw)
    return ImageSpec(**base)  # type: ignore[arg-type]


# ---- names and labels


def test_tag_alias_and_labels() -> None:
    s = spec()
    assert s.tag == "flash-attn2.8.3-cu130-torch2.14-py3.11"
    assert s.alias == "cu130-torch2.14-latest"
    assert parse_tag(s.tag) == {
        "kernel": "flash-attn",
        "version": "2.8.3",
        "family": "cu130-torch2.14",
        "py": "3.11",
    }
    assert is_alias(s.alias) and parse_tag(s.alias) is None
    labels = s.labels(created="2026-11-23T00:00:00Z")
    for key in ("torch", "toolkit", "arches", "profile", "flash-attn", "parity"):
        assert f"io.attnforge.{key}" in labels
    assert labels["org.opencontainers.image.version"] == s.dist_version
    assert labels["io.attnforge.parity"] == "not run"


def test_profile_tag_in_tag_and_arch_suffix_on_collision() -> None:
    lean = spec(profile="fwd128", profile_tag="fwd128")
    assert lean.tag == "flash-attn2.8.3-cu130-torch2.14-fwd128-py3.11"
    narrow = spec(arches=("sm_80", "sm_90"))
    wide = spec(arches=("sm_80", "sm_90", "sm_100", "sm_120"))
    out = resolve_tags([narrow, wide])
    assert out[1].tag == "flash-attn2.8.3-cu130-torch2.14-py3.11"  # the widest keeps the plain tag
    assert out[0].tag == "flash-attn2.8.3-cu130-torch2.14-sm80-sm90-py3.11"


def test_alias_goes_to_newest_python() -> None:
    specs = [spec(python="3.10"), spec(python="3.12"), spec(python="3.11")]
    assert aliases(specs) == {"cu130-torch2.14-latest": "flash-attn2.8.3-cu130-torch2.14-py3.12"}


def test_profile_tag_of_and_torch_requirement() -> None:
    assert profile_tag_of("cu130torch2.14cxx11abiTRUE") is None
    assert profile_tag_of("cu130torch2.14cxx11abiTRUE.fwd128") == "fwd128"
    assert profile_tag_of("cu129torch2.8cxx11abiTRUE.pt280a05228986c39.hd128") == "hd128"
    assert profile_tag_of("cu129torch2.8cxx11abiTRUE.pt280a05228986c39") is None
    assert torch_requirement("2.14.1+cu130", "cu130", "cu130") == "torch==2.14.1"
    assert torch_requirement("2.8.0+cu126", "cu126", "cu128") == "torch==2.8.0+cu126"
    assert torch_requirement("2.13.0+cpu", "cpu", None) == "torch==2.13.0+cpu"


def _manifest(wheel: str, **inputs: object) -> dict[str, object]:
    base = {
        "toolkit": "cuda13.0",
        "torch": "2.14.1",
        "torch_variant": "cu130",
        "python": "3.11",
        "cxx11_abi": True,
        "arches": ["sm_90"],
        "profile": "full",
    }
    base.update(inputs)
    return {
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "variant": "cu130-torch2.14",
        "wheel": wheel,
        "inputs": base,
        "toolchain": {"torch": "2.14.1+cu130"},
        "parity": {"passed": True, "device": "H100"},
    }


def test_runtime_request_from_manifest(tmp_path: Path) -> None:
    wheel = tmp_path / "flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE.fwd128-cp311-cp311-linux_x86_64.whl"
    req = runtime_request(
        wheel, _manifest(wheel.name, profile="fwd128"), base="local/debian:bookworm", pypi_variant="cu130"
    )
    assert req.spec.profile_tag == "fwd128"
    assert req.torch_requirement == "torch==2.14.1"
    assert req.expect == {
        "torch": "2.14.1+cu130",
        "flash_attn": "2.8.3+cu130torch2.14cxx11abiTRUE.fwd128",
        "kind": "runtime",
        "dist": "flash_attn",
        "extension": "flash_attn_2_cuda",
        "api": "flash_attn",
    }
    assert req.spec.parity == "passed (H100)"


def test_flex_wheels_matched_by_torch_and_toolkit(tmp_path: Path) -> None:
    for name in (
        "attnforge_flex_kernels-0.1.0+torch2.14.cu130.sm90-py3-none-any.whl",
        "attnforge_flex_kernels-0.1.0+torch2.11.cu130.sm90-py3-none-any.whl",
    ):
        (tmp_path / name).write_bytes(b"")
    req = ImageRequest(spec=spec())
    assert [w.name for w in flex_wheels_for(req, tmp_path)] == [
        "attnforge_flex_kernels-0.1.0+torch2.14.cu130.sm90-py3-none-any.whl"
    ]


# ---- pull chooser


def cand(tag: str, toolkit: str, arches: str, **extra: str) -> Candidate:
    labels = {
        "io.attnforge.toolkit": toolkit,
        "io.attnforge.arches": arches,
        "io.attnforge.kind": "runtime",
        "io.attnforge.torch": "2.13.0",
        "io.attnforge.flash-attn": "2.8.3",
        "io.attnforge.profile": "full",
        "io.attnforge.python": "3.11",
        "io.attnforge.variant": tag,
    }
    labels.update({f"io.attnforge.{k}": v for k, v in extra.items()})
    return Candidate(tag, labels)


def test_arch_fit_rules() -> None:
    assert arch_fit("sm_90", ["sm_80", "sm_90"]) == "exact"
    assert arch_fit("sm_86", ["sm_80"]) == "compatible"
    assert arch_fit("sm_80", ["sm_86"]) is None
    assert arch_fit("sm_100", ["sm_90"]) is None
    assert arch_fit("sm_90", ["sm_90a"]) is None


def test_evaluate_driver_arch_and_no_gpu() -> None:
    old_driver = Host(gpus=[("A100", "sm_80")], driver="535.104.05", source="test")
    c13 = evaluate(cand("a", "cuda13.0", "sm_80,sm_90"), old_driver, floors=FLOORS)
    assert not c13.fits and "needs driver >= 580.65.06" in c13.reasons[0]
    c12 = evaluate(cand("b", "cuda12.6", "sm_80"), old_driver, floors=FLOORS)
    assert c12.fits and c12.exact
    h100 = Host(gpus=[("H100", "sm_90")], driver="580.65.06", source="test")
    assert (
        "no kernel for sm_90"
        in evaluate(cand("c", "cuda12.6", "sm_80,sm_86"), h100, floors=FLOORS).reasons[0]
    )
    none = evaluate(cand("d", "cuda13.0", "sm_90"), Host(source="nvidia-smi not found"), floors=FLOORS)
    assert not none.fits and "needs an NVIDIA GPU" in none.reasons[0]


# ---- pip plans and credentials


def test_plan_pip_serves_local_paths_and_refuses_credentials(tmp_path: Path) -> None:
    simple = tmp_path / "mirror" / "simple"
    simple.mkdir(parents=True)
    opts = PipOptions()
    opts.add("--extra-index-url", f"file://{simple}")
    opts.add("--find-links", str(tmp_path))
    opts.add("--constraint", "/etc/xdg/pip/constraints.txt")
    plan = plan_pip(torch_index=None, options=opts)
    assert plan.index_url == "https://pypi.org/simple"
    assert plan.local.simple_roots == [simple] and plan.local.find_links == [tmp_path]
    assert any("constraint" in n for n in plan.notes)
    with pytest.raises(ConfigurationError, match="netrc"):
        plan_pip(torch_index="https://user:pw@index.example/simple", options=None)


def test_credentials_from_env_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_PW", "s3cret-pw")
    c = resolve_credentials("alice", "MY_PW", None)
    assert (c.username, c.password) == ("alice", "s3cret-pw")
    assert "s3cret" not in repr(c)
    f = tmp_path / "pw"
    f.write_text("from-file\n")
    assert resolve_credentials("bob", None, f).password == "from-file"
    monkeypatch.delenv("ATTNFORGE_REGISTRY_PASSWORD", raising=False)
    with pytest.raises(ConfigurationError, match="no password"):
        resolve_credentials("carol", None, None)
    assert resolve_credentials(None, None, None).username is None


def test_redact_and_digest_parsing() -> None:
    assert redact("login with hunter22 ok", ["hunter22"]) == "login with *** ok"
    out = "latest: digest: sha256:" + "a" * 64 + " size: 528"
    assert pushed_digest(out) == "sha256:" + "a" * 64
    assert is_loopback("127.0.0.1:5000") and is_loopback("localhost:1") and not is_loopback("ghcr.io")


def test_docker_login_password_only_on_stdin(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncat > {tmp_path}/stdin\necho Login Succeeded\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with Docker(str(fake), private_config=True) as dk:
        cfg = dk._config_dir
        assert cfg is not None and cfg.is_dir()
        res = dk.login("127.0.0.1:5000", "alice", "pw-on-stdin-only")
        assert res.ok
    assert "pw-on-stdin-only" not in (tmp_path / "argv").read_text()
    assert (tmp_path / "stdin").read_text().strip() == "pw-on-stdin-only"
    assert "--password-stdin" in (tmp_path / "argv").read_text()
    assert not cfg.exists()  # the private config (with the auth entry) is gone


# ---- bases.toml


def test_bases_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "bases.toml"
    write_bases(
        path,
        {
            "local/debian:bookworm": BaseRecord(
                "local/debian:bookworm", "local", "sha256:" + "1" * 64, "runtime"
            ),
            "nvidia/cuda:13.0.0-runtime-ubuntu22.04": BaseRecord(
                "nvidia/cuda:13.0.0-runtime-ubuntu22.04", "registry"
            ),
        },
    )
    back = load_bases(path)
    assert back["local/debian:bookworm"].pin == "sha256:" + "1" * 64
    assert back["nvidia/cuda:13.0.0-runtime-ubuntu22.04"].pin == ""


def test_repo_bases_file_parses() -> None:
    bases = load_bases(packaged_docker_dir() / "bases.toml")
    assert "local/debian:bookworm" in bases
    assert all(b.kind in ("local", "registry") for b in bases.values())


# ---- local index server


def test_local_index_merges_sources_and_requires_auth(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "demo_pkg-1.0-py3-none-any.whl").write_bytes(b"wheel-bytes")
    root = tmp_path / "mirror"
    (root / "simple" / "other").mkdir(parents=True)
    (root / "files").mkdir()
    (root / "files" / "other-2.0.tar.gz").write_bytes(b"sdist")
    (root / "simple" / "other" / "index.html").write_text(
        '<a href="../../files/other-2.0.tar.gz#sha256=abc">other-2.0.tar.gz</a>'
    )
    assert project_of("demo_pkg-1.0-py3-none-any.whl") == "demo-pkg"
    with LocalIndexServer(Sources([flat], [root / "simple"]), username="u", password="p") as srv:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(srv.url)
        assert err.value.code == 401

        def get(url: str) -> bytes:
            req = urllib.request.Request(url)
            req.add_header("Authorization", "Basic " + base64.b64encode(b"u:p").decode())
            with urllib.request.urlopen(req) as resp:
                data: bytes = resp.read()
                return data

        assert b"demo-pkg" in get(srv.url) and b"other" in get(srv.url)
        page = get(srv.url + "other/").decode()
        assert "#sha256=abc" in page
        href = page.split('href="')[1].split("#")[0]
        assert get(f"http://{srv.host}{href}") == b"sdist"
        flat_href = get(srv.url + "demo-pkg/").decode().split('href="')[1].split('"')[0]
        assert get(f"http://{srv.host}{flat_href}") == b"wheel-bytes"


# ---- push rollback against an in-memory registry


class FakeRegistry:
    """Tags -> manifest bytes, with the API calls rollback() uses."""

    def __init__(self) -> None:
        self.tags_: dict[str, Manifest] = {}
        self.deleted: list[str] = []

    @staticmethod
    def manifest(text: str) -> Manifest:
        body = json.dumps({"m": text}).encode()
        return Manifest(
            body,
            "application/vnd.docker.distribution.manifest.v2+json",
            "sha256:" + hashlib.sha256(body).hexdigest(),
        )

    def tags(self, repo: str) -> list[str]:
        return sorted(self.tags_)

    def get_manifest(self, repo: str, ref: str) -> Manifest | None:
        return self.tags_.get(ref)

    def put_manifest(self, repo: str, ref: str, m: Manifest) -> None:
        self.tags_[ref] = m

    def delete_manifest(self, repo: str, digest: str) -> None:
        self.deleted.append(digest)
        self.tags_ = {t: m for t, m in self.tags_.items() if m.digest != digest}


def test_rollback_restores_old_alias_and_removes_new_tags() -> None:
    reg = FakeRegistry()
    old, new_a, new_b = reg.manifest("old"), reg.manifest("a"), reg.manifest("b")
    reg.tags_ = {"v1": old, "latest": old}
    before = {"v2a": None, "v2b": None, "latest": old}
    # the push got as far as: v2a, v2b and the alias moved to v2a
    reg.tags_.update({"v2a": new_a, "v2b": new_b, "latest": new_a})
    report = push_mod.PushReport(
        "r",
        "repo",
        pushed=[("v2a", new_a.digest), ("v2b", new_b.digest), ("latest", new_a.digest)],
        failed="other",
    )
    push_mod.rollback(reg, "repo", report, before, lambda _: None)  # type: ignore[arg-type]
    assert reg.tags_ == {"v1": old, "latest": old}
    assert sorted(t for t, _ in report.deleted) == ["v2a", "v2b"]
    assert report.restored == [("latest", old.digest)] and not report.rollback_problems
    assert "rolled back" in "\n".join(report.lines())


def test_rollback_keeps_a_foreign_tag_sharing_the_digest() -> None:
    reg = FakeRegistry()
    same = reg.manifest("same")
    reg.tags_ = {"someone-elses": same, "v2": same}
    report = push_mod.PushReport("r", "repo", pushed=[("v2", same.digest)], failed="x")
    push_mod.rollback(reg, "repo", report, {"v2": None}, lambda _: None)  # type: ignore[arg-type]
    assert reg.tags_ == {"someone-elses": same}


def test_push_refuses_an_empty_set() -> None:
    with pytest.raises(PublishError, match="empty"):
        push_mod.push_set(ImageSet("r"), "127.0.0.1:1", username=None, password=None)


def test_image_set_orders_immutable_tags_before_aliases() -> None:
    s = ImageSet(
        "repo", [BuiltImage("t1", "runtime", "id1", {}, ["a1"]), BuiltImage("t2", "runtime", "id2", {})]
    )
    assert [t for t, _ in s.tags()] == ["t1", "t2", "a1"]
    assert ImageSet.from_json(json.loads(json.dumps(s.to_json()))).images[0].aliases == ["a1"]


def test_fa3_image_names_and_smoke_imports() -> None:
    from attnforge.core.kernels import modules
    from attnforge.images.smoke_script import arch_fits
    from attnforge.images.tags import ImageSpec

    spec = ImageSpec(
        kind="runtime",
        kernel="flash-attn-3",
        kernel_version="3.0.0",
        dist_version="3.0.0+cu130sm90atorch2.9abi3.fa3hd64128",
        variant="cu130-sm90a-torch2.9abi3",
        python="3.12",
        toolkit="cuda13.0",
        torch="2.11.0+cu130",
        arches=("sm_90a",),
        profile="fa3hd64128",
        profile_tag="fa3hd64128",
    )
    assert spec.tag == "flash-attn-3-3.0.0-cu130-sm90a-torch2.9abi3-fa3hd64128-py3.12"
    assert modules("flash-attn-3") == {
        "dist": "flash_attn_3",
        "extension": "flash_attn_3._C",
        "api": "flash_attn_interface",
    }
    assert (
        arch_fits("sm_90", ["sm_90a"])
        and not arch_fits("sm_100", ["sm_90a"])
        and not arch_fits("sm_89", ["sm_90a"])
    )
