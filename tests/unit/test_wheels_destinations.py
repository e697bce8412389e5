"""Destinations, credentials (named, never shown) and the parity gate."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.matrix.destinations import Destination, ad_hoc, redact, resolve_credentials
from attnforge.publish.index import Bundle
from attnforge.publish.release import apply_parity_gate
from attnforge.wheels.records import write_parity_record
from attnforge.wheels.signing_keys import SiteKey, generate_key, load_public

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
    # a records folder is for an index server, which keeps packages only; a static index serves them itself
    assert Destination(kind="pypiserver", url="http://h/", records="records").records == "records"
    with pytest.raises(
        ValidationError, match="'records' is for a 'pypiserver' destination: a 'static' one serves"
    ):
        Destination(kind="static", path="x", records="records")


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


def bundle(
    tmp_path: Path, name: str, key: SiteKey | None, passed: bool | None, manifest_says: bool
) -> Bundle:
    """A wheel file with a manifest whose `parity.passed` says `manifest_says` and, when `passed` is not
    None, a parity record about its bytes signed by `key`."""
    wheel = tmp_path / name
    wheel.write_bytes(name.encode())
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if passed is not None and key is not None:
        tested = {"wheel": name, "sha256": sha, "python": "cp311", "torch": "2.14.1", "profile": "full"}
        write_parity_record(
            wheel,
            sha,
            {
                "passed": passed,
                "gpu": "H100",
                "counts": {"failed": 0 if passed else 3},
                "tested": {**tested, "gpu": "H100"},
            },
            key,
        )
    return Bundle(wheel=wheel, manifest={"sha256": sha, "parity": {"passed": manifest_says}})


def test_parity_gate_reads_signed_records_not_the_manifest(tmp_path: Path) -> None:
    site = generate_key(tmp_path / "keys" / "site.pem")
    other = generate_key(tmp_path / "keys" / "other.pem")
    trusted = [load_public(tmp_path / "keys" / "site.pub", "test")]
    gated = Destination(kind="pypiserver", url="http://h/", require_parity=True)
    good = bundle(tmp_path, "a.whl", site, True, manifest_says=False)
    bad = bundle(tmp_path, "b.whl", site, False, manifest_says=True)
    forged = bundle(tmp_path, "c.whl", None, None, manifest_says=True)  # the boolean alone
    lines: list[str] = []
    apply_parity_gate([good], gated, "internal", False, lines.append, trusted=trusted)
    assert good.gate == "passed" and lines == []
    with pytest.raises(PublishError) as err:
        apply_parity_gate([good, bad, forged], gated, "internal", False, lines.append, trusted=trusted)
    assert "b.whl: the signed parity run on H100 did not pass (3 failed" in str(err.value)
    assert "c.whl: no signed parity record (c.whl.parity.intoto.json)" in str(err.value)
    apply_parity_gate([good, bad, forged], gated, "internal", True, lines.append, trusted=trusted)
    assert [b.gate for b in (good, bad, forged)] == ["passed", "skipped", "skipped"]
    assert any("WITHOUT a passed GPU parity run: b.whl, c.whl" in line for line in lines)
    open_dest = Destination(kind="static", path="x")
    apply_parity_gate([forged], open_dest, "local", False, lines.append, trusted=trusted)
    assert forged.gate == "not-required"
    # a record signed by a key publish does not trust is not a missing run: the whole publish is refused
    strange = bundle(tmp_path, "d.whl", other, True, manifest_says=True)
    with pytest.raises(PublishError, match=r"d.whl.parity.intoto.json: signed by .*, not a trusted key"):
        apply_parity_gate([strange], open_dest, "local", True, lines.append, trusted=trusted)
