"""Destinations, credentials (named, never shown) and the parity gate."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.matrix.destinations import Destination, ad_hoc, redact, resolve_credentials
from attnforge.publish.index import Bundle
from attnforge.publish.release import apply_parity_gate

SECRET = "hunter2-but-longer"


def test_destination_validation() -> None:
    assert Destination(kind="static", path="wheels/index").require_parity is False
    with pytest.raises(ValidationError, match="needs 'path'"):
        Destination(kind="static")
    with pytest.raises(ValidationError, match="needs 'url'"):
        Destination(kind="pypiserver")
    with pytest.raises(ValidationError, match="not in the url"):
        Destination(kind="pypiserver", url=f"http://me:{SECRET}@host/")
    with pytest.raises(ValidationError, match="not both"):
        Destination(kind="pypiserver", url="http://h/", password_env="A", password_file="f")
    with pytest.raises(ValidationError, match="extra"):
        Destination.model_validate({"kind": "static", "path": "x", "password": SECRET})


def test_ad_hoc_targets_never_echo_a_password() -> None:
    assert ad_hoc("wheels/index") == Destination(kind="static", path="wheels/index")
    assert ad_hoc("internal") is None
    with pytest.raises(ConfigurationError) as err:
        ad_hoc(f"https://me:{SECRET}@pypi.example/")
    assert SECRET not in str(err.value)


def test_credentials_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = Destination(kind="pypiserver", url="http://h/", username_env="U", password_env="P")
    monkeypatch.setenv("U", "forge")
    monkeypatch.delenv("P", raising=False)
    with pytest.raises(PublishError, match=r"\$P is not set"):
        resolve_credentials(dest, tmp_path)
    monkeypatch.setenv("P", SECRET)
    creds = resolve_credentials(dest, tmp_path)
    assert (creds.username, creds.password) == ("forge", SECRET) and SECRET not in repr(creds)
    (tmp_path / "pw").write_text(SECRET + "\n")
    from_file = Destination(kind="pypiserver", url="http://h/", username_env="U", password_file="pw")
    assert resolve_credentials(from_file, tmp_path).password == SECRET
    missing = Destination(kind="pypiserver", url="http://h/", username_env="U", password_file="nope")
    with pytest.raises(PublishError, match="password_file"):
        resolve_credentials(missing, tmp_path)
    assert redact(f"401 for {SECRET}!", [SECRET]) == "401 for ***!"


def bundle(tmp_path: Path, name: str, parity: object) -> Bundle:
    return Bundle(wheel=tmp_path / name, manifest={"parity": parity})


def test_parity_gate(tmp_path: Path) -> None:
    gated = Destination(kind="pypiserver", url="http://h/", require_parity=True)
    good = bundle(tmp_path, "a.whl", {"passed": True})
    bad = bundle(tmp_path, "b.whl", {"passed": False})
    none = bundle(tmp_path, "c.whl", None)
    lines: list[str] = []
    apply_parity_gate([good], gated, "internal", False, lines.append)
    assert good.gate == "passed" and lines == []
    with pytest.raises(PublishError, match=r"requires a passed GPU parity run; without one: b.whl, c.whl"):
        apply_parity_gate([good, bad, none], gated, "internal", False, lines.append)
    apply_parity_gate([good, bad, none], gated, "internal", True, lines.append)
    assert [b.gate for b in (good, bad, none)] == ["passed", "skipped", "skipped"]
    assert any("WITHOUT a passed GPU parity run: b.whl, c.whl" in line for line in lines)
    open_dest = Destination(kind="static", path="x")
    apply_parity_gate([none], open_dest, "local", False, lines.append)
    assert none.gate == "not-required"
