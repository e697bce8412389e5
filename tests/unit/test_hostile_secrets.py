"""Secrets: redaction replaces whole values and refuses secrets too short to redact; index credentials never
sit in a build's URL, command line or spec (they reach pip as a netrc file).

Real parts: `pip config list` reads a real pip.conf (PIP_CONFIG_FILE), the docker backend makes its real
`docker run` line for a real cell of the shipped matrix, the publish path talks to a closed port through
requests. tests/integration/test_pip_secrets.py runs pip in the builder image against an authenticated
pypiserver.
"""

from __future__ import annotations

import base64
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from attnforge.builder.spec import Source
from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.core.secrets import MIN_SECRET_LENGTH, check_secret, redact
from attnforge.engine.backends.docker import DockerBackend
from attnforge.engine.backends.pip_config import pip_options
from attnforge.engine.backends.pip_credentials import CONTAINER_NETRC, NetrcFile
from attnforge.engine.progress import PlainProgressView
from attnforge.engine.run import Engine
from attnforge.matrix.destinations import Destination, resolve_credentials
from attnforge.matrix.file import parse_matrix
from attnforge.matrix.project import Project
from attnforge.matrix.schema import PipSpec
from attnforge.publish.release import publish
from tests.unit.test_wheels_index import make_bundle

Run = Callable[..., tuple[int, str, str]]
SECRET = "Sekr1t-for-the-index"
GOOD = """\
version: 1
kernels:
  flash-attn: {version: "2.8.3"}
targets:
  t:
    matrix: {toolkit: [cuda12.8], torch: ["2.8"], python: ["3.12"], arch: [sm_90]}
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------ redaction


def test_redaction_replaces_whole_values_in_every_spelling() -> None:
    text = (
        f"pw={SECRET} url=http://forge:{SECRET.replace('-', '%2D')}@h/ quoted={'a/b' + SECRET} "
        f"auth=Basic {base64.b64encode(f'forge:{SECRET}'.encode()).decode()} Max retries exceeded"
    )
    out = redact(text.replace("%2D", "-"), [SECRET], "forge")
    assert SECRET not in out and "Max retries exceeded" in out and "auth=Basic ***" in out
    encoded = redact(
        f"http://u:{'p@ss/word-123'.replace('@', '%40').replace('/', '%2F')}@h", ["p@ss/word-123"]
    )
    assert encoded == "http://u:***@h"


def test_short_secrets_are_refused_not_garbled() -> None:
    with pytest.raises(ConfigurationError, match=r"\$ATTNFORGE_INDEX_PASSWORD holds a secret of 1 character"):
        check_secret("x", "$ATTNFORGE_INDEX_PASSWORD")
    with pytest.raises(ValueError):
        redact("index exceeded", ["x"])
    assert check_secret("x" * MIN_SECRET_LENGTH, "v") == "x" * MIN_SECRET_LENGTH


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=MIN_SECRET_LENGTH, max_size=30).filter(lambda s: "***" not in s),
    st.text(max_size=40),
    st.text(max_size=40),
)
def test_a_redacted_text_holds_no_secret(secret: str, before: str, after: str) -> None:
    out = redact(before + secret + after + secret, [secret])
    assert secret not in out


def test_publish_with_a_one_letter_password_is_refused_readably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNFORGE_INDEX_USER", "forge")
    monkeypatch.setenv("ATTNFORGE_INDEX_PASSWORD", "x")
    dest = Destination(
        kind="pypiserver",
        url=f"http://127.0.0.1:{closed_port()}",
        username_env="ATTNFORGE_INDEX_USER",
        password_env="ATTNFORGE_INDEX_PASSWORD",
    )
    bundle = make_bundle(tmp_path, "cu130torch2.14cxx11abiTRUE")
    with pytest.raises(ConfigurationError) as info:
        # an unsigned stand-in wheel: what is tried here is the password, not the records
        publish([bundle], dest, "internal", tmp_path, log=lambda _: None, allow_unsigned=True)
    assert info.value.exit_code == 2
    assert str(info.value).startswith("$ATTNFORGE_INDEX_PASSWORD holds a secret of 1 character")
    (tmp_path / "pw").write_text("abc\n")
    short_file = Destination(
        kind="pypiserver", url="http://h/", username_env="ATTNFORGE_INDEX_USER", password_file="pw"
    )
    with pytest.raises(ConfigurationError, match="password_file .*pw holds a secret of 3 characters"):
        resolve_credentials(short_file, tmp_path)


def test_publish_failure_message_is_intact_and_holds_no_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNFORGE_INDEX_USER", "forge")
    monkeypatch.setenv("ATTNFORGE_INDEX_PASSWORD", SECRET)
    port = closed_port()
    dest = Destination(
        kind="pypiserver",
        url=f"http://127.0.0.1:{port}",
        username_env="ATTNFORGE_INDEX_USER",
        password_env="ATTNFORGE_INDEX_PASSWORD",
    )
    bundle = make_bundle(tmp_path, "cu130torch2.14cxx11abiTRUE")
    with pytest.raises(PublishError) as info:
        # an unsigned stand-in wheel: what is tried here is the password, not the records
        publish([bundle], dest, "internal", tmp_path, log=lambda _: None, allow_unsigned=True)
    msg = str(info.value)
    assert SECRET not in msg and f"127.0.0.1:{port}" in msg and "***" not in msg.replace(SECRET, "")


# ------------------------------------------------------------------------------------------ build.pip in matrix.yaml


@pytest.mark.parametrize(
    "pip",
    [
        f"index_url: http://forge:{SECRET}@10.0.0.1/simple",
        f"extra_index_urls: [http://10.0.0.2/simple, 'https://forge:{SECRET}@10.0.0.1/simple']",
        f"find_links: ['http://forge:{SECRET}@10.0.0.1/links']",
        "index_url: https://token@10.0.0.1/simple",
    ],
)
def test_credentialed_index_in_the_matrix_is_refused_with_the_way(
    pip: str, tmp_path: Path, run_cli: Run
) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(GOOD + f"build:\n  pip:\n    {pip}\n")
    code, out, err = run_cli("--matrix", str(path), "validate")
    assert code == 2 and f"{path}:9:5: build.pip." in err
    assert "netrc" in err and "build.pip.netrc" in err
    assert SECRET not in out + err and "token" not in out + err


def test_a_plain_index_and_a_netrc_are_accepted(tmp_path: Path) -> None:
    m = parse_matrix(
        GOOD + "build:\n  pip:\n    index_url: http://10.0.0.1/simple\n    netrc: secrets/netrc\n"
    )
    assert m.build.pip.netrc == "secrets/netrc"


def test_a_bad_netrc_is_named_without_its_text(tmp_path: Path) -> None:
    bad = tmp_path / "netrc"
    bad.write_text(f"machine h login u password {SECRET}\nmacine oops {SECRET}\n")
    with pytest.raises(ConfigurationError) as info:
        pip_options(PipSpec(netrc="netrc"), inherit={}, base=tmp_path)
    assert (
        "build.pip.netrc" in str(info.value) and "line 2" in str(info.value) and SECRET not in str(info.value)
    )
    with pytest.raises(ConfigurationError, match="is not a file"):
        pip_options(PipSpec(netrc="missing"), inherit={}, base=tmp_path)


# ------------------------------------------------------------------------------------------ this machine's pip.conf


def host_pip_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, password: str = SECRET) -> Path:
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\n"
        f"index-url = http://forge:{password}@127.0.0.1:9/simple/\n"
        "extra-index-url = http://127.0.0.1:8/simple/\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    return conf


def test_inherited_pip_conf_credentials_are_scrubbed_into_a_private_netrc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_pip_conf(tmp_path, monkeypatch)
    opts = pip_options(PipSpec())  # real `pip config list` reads the file
    assert "--index-url" in opts.args and "http://127.0.0.1:9/simple/" in opts.args
    assert SECRET not in " ".join(opts.args) + repr(opts) + " ".join(opts.notes)
    assert opts.notes == [
        "this machine's pip config (index-url): the credentials for 127.0.0.1 reach pip through a netrc file, "
        "not the URL"
    ]
    netrc = opts.netrc()
    path = netrc.path()
    assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == f"machine 127.0.0.1 login forge password {SECRET}\n"
    netrc.close()
    assert not path.exists() and not path.parent.exists()


def test_a_short_password_in_pip_conf_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host_pip_conf(tmp_path, monkeypatch, password="pw")
    with pytest.raises(
        ConfigurationError, match=r"this machine's pip config \(index-url\) holds a secret of 2"
    ):
        pip_options(PipSpec())


def test_user_netrc_and_scrubbed_entries_are_merged(tmp_path: Path) -> None:
    mine = tmp_path / "netrc"
    mine.write_text("machine files.example login me password my-own-secret\n")
    opts = pip_options(
        PipSpec(netrc=str(mine)),
        inherit={"extra-index-url": f"http://a:{SECRET}@10.1.1.1/simple"},
        base=tmp_path,
    )
    merged = opts.netrc().path()
    assert merged is not None and merged != mine
    assert merged.read_text().splitlines() == [
        f"machine 10.1.1.1 login a password {SECRET}",
        "machine files.example login me password my-own-secret",
    ]
    assert NetrcFile([], mine).path() == mine  # nothing scrubbed: the user's file as it is


# ------------------------------------------------------------------------------------------ the docker run line


def test_docker_run_line_and_spec_hold_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    host_pip_conf(tmp_path, monkeypatch)
    mine = tmp_path / "netrc"
    mine.write_text("machine files.example login me password my-own-secret\n")
    data = yaml.safe_load((root / "matrix.yaml").read_text())
    data["build"] |= {"cache_dir": str(tmp_path / "cache"), "output_dir": str(tmp_path / "wheels")}
    data["build"]["pip"] = {"inherit_host_config": True, "netrc": "netrc"}
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    project = Project(tmp_path / "matrix.yaml")
    backend = DockerBackend(project, docker="/bin/false")
    cell = project.plan("default").valid[0]
    archive = tmp_path / "src.tar.gz"
    archive.write_bytes(b"x")
    with PlainProgressView() as view:
        job = Engine(project, backend, view).job_for(cell, Source(str(archive), "0" * 64), 1, "digest")
        argv = backend.run_command(job)
    line = " ".join(argv)
    assert SECRET not in line and "my-own-secret" not in line
    netrc = backend.netrc.path()
    assert netrc is not None and f"{netrc}:{CONTAINER_NETRC}:ro" in argv
    assert f"NETRC={CONTAINER_NETRC}" in argv and "PIP_CONFIG_FILE=/dev/null" in argv
    spec = job.spec.dumps()
    assert SECRET not in spec and "http://127.0.0.1:9/simple/" in spec
    assert SECRET in netrc.read_text() and "my-own-secret" in netrc.read_text()
    assert os.stat(netrc).st_mode & 0o077 == 0
