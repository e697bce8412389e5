"""Signed records in-process (docs/records.md): keys, DSSE statements, the provenance's hold on the manifest,
the wheel's own claims against its manifest, and the SBOM. A real finalized (pure-Python) wheel throughout."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from attnforge.core.errors import ConfigurationError, PublishError, RecordRefused
from attnforge.wheels import provenance, wheel_claims
from attnforge.wheels.finalize import finalize
from attnforge.wheels.manifest import manifest_path_for, read_manifest
from attnforge.wheels.records import (
    PROVENANCE_SUFFIX,
    SBOM_SUFFIX,
    record_path,
    verify_build,
    write_build_records,
)
from attnforge.wheels.sbom import cutlass_commit, make_sbom
from attnforge.wheels.signing_keys import (
    CONFIG_DIR_ENV,
    KEY_ENV,
    TRUSTED_ENV,
    SigningConfig,
    generate_key,
    load_public,
    signing_key,
    trusted_keys,
)
from attnforge.wheels.statements import sign, statement, verify
from attnforge.wheels.wheelio import Member, read_wheel, write_wheel
from tests.unit.test_wheels_pure import raw_wheel

SHA = "ab" * 32


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for var in (KEY_ENV, TRUSTED_ENV, CONFIG_DIR_ENV):
        monkeypatch.delenv(var, raising=False)
    generate_key(tmp_path / "keys" / "site.pem")
    generate_key(tmp_path / "keys" / "other.pem")
    return tmp_path / "keys"


@pytest.fixture
def finalized(tmp_path: Path, keys: Path) -> Path:
    wheel = finalize(raw_wheel(tmp_path / "raw"), out_dir=tmp_path / "out").wheel
    key = signing_key(SigningConfig(keys / "site.pem"))
    assert key is not None
    write_build_records(wheel, read_manifest(manifest_path_for(wheel)), key)
    return wheel


def test_keys_come_from_env_then_config_then_a_local_key(
    keys: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    said: list[str] = []
    local = signing_key(SigningConfig(), log=said.append)
    assert local is not None and local.path == tmp_path / "config" / "attnforge" / "signing-key.pem"
    assert (local.path.stat().st_mode & 0o777) == 0o600 and "created this machine's local key" in said[0]
    assert f"at {local.path} (public half {local.path.with_suffix('.pub')}" in said[0]  # says where
    assert signing_key(SigningConfig(), log=said.append).keyid == local.keyid and len(said) == 1  # made once
    # $ATTNFORGE_CONFIG_DIR (what the test suite sets for itself) wins over $XDG_CONFIG_HOME
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path / "own"))
    own = signing_key(SigningConfig(), log=said.append)
    assert own is not None and own.path == tmp_path / "own" / "signing-key.pem" and own.keyid != local.keyid
    assert str(tmp_path / "own" / "signing-key.pem") in said[1]
    monkeypatch.delenv(CONFIG_DIR_ENV)
    configured = signing_key(SigningConfig(keys / "site.pem"))
    assert configured is not None and configured.origin == "matrix.yaml signing.key"
    monkeypatch.setenv(KEY_ENV, str(keys / "other.pem"))
    from_env = signing_key(SigningConfig(keys / "site.pem"))
    assert from_env is not None and from_env.origin == f"${KEY_ENV}" and from_env.keyid != configured.keyid
    # trusted: the signing key's public half, unless configured or given
    assert [k.keyid for k in trusted_keys(SigningConfig(keys / "site.pem"))] == [from_env.keyid]
    monkeypatch.delenv(KEY_ENV)
    assert [k.keyid for k in trusted_keys(SigningConfig(keys / "site.pem"))] == [configured.keyid]
    assert [k.keyid for k in trusted_keys(SigningConfig(trusted_keys=(keys / "other.pub",)))] == [
        from_env.keyid
    ]


def test_bad_keys_are_configuration_errors(keys: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"missing.pem \(matrix.yaml signing.key\): No such file"):
        signing_key(SigningConfig(tmp_path / "missing.pem"))
    ecdsa = tmp_path / "ec.pem"
    ecdsa.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
    )
    with pytest.raises(ConfigurationError, match="is not an ed25519 key"):
        signing_key(SigningConfig(ecdsa))
    (tmp_path / "junk.pem").write_text("not a key\n")
    with pytest.raises(ConfigurationError, match="not an unencrypted PEM private key"):
        signing_key(SigningConfig(tmp_path / "junk.pem"))
    with pytest.raises(ConfigurationError, match="exists: refusing to replace"):
        generate_key(keys / "site.pem")


def _check(envelope: dict[str, Any], keys: Path, **kw: Any) -> Any:
    args = {
        "what": "x.whl.provenance.intoto.json",
        "subject_name": "x.whl",
        "sha256": SHA,
        "predicate_type": "urn:t",
    }
    return verify(json.dumps(envelope).encode(), [load_public(keys / "site.pub", "test")], **{**args, **kw})


def test_statements_verify_only_when_signed_by_a_trusted_key_about_these_bytes(keys: Path) -> None:
    site = signing_key(SigningConfig(keys / "site.pem"))
    other = signing_key(SigningConfig(keys / "other.pem"))
    assert site is not None and other is not None
    envelope = sign(statement("x.whl", SHA, "urn:t", {"passed": True}), site)
    ok = _check(envelope, keys)
    assert ok.keyid == site.keyid and ok.predicate == {"passed": True}
    with pytest.raises(
        RecordRefused, match=r"signed by [0-9a-f]{16}, not a trusted key \(trusted: [0-9a-f]{16}"
    ):
        _check(sign(statement("x.whl", SHA, "urn:t", {}), other), keys)
    altered = dict(envelope)
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    stmt["predicate"]["passed"] = "very"
    altered["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    with pytest.raises(RecordRefused, match="does not verify: the statement or its signature was altered"):
        _check(altered, keys)
    with pytest.raises(
        RecordRefused, match=r"is about x.whl sha256 abababababababab\.\.\.; the wheel x.whl is sha256 cdcd"
    ):
        _check(envelope, keys, sha256="cd" * 32)
    with pytest.raises(RecordRefused, match="names 'x.whl', not 'y.whl'"):
        _check(envelope, keys, subject_name="y.whl")
    with pytest.raises(RecordRefused, match="predicateType 'urn:t', expected 'urn:other'"):
        _check(envelope, keys, predicate_type="urn:other")
    with pytest.raises(RecordRefused, match="not a DSSE envelope"):
        _check({"payload": "x"}, keys)
    with pytest.raises(RecordRefused, match="no trusted key"):
        verify(
            json.dumps(envelope).encode(),
            [],
            what="w",
            subject_name="x.whl",
            sha256=SHA,
            predicate_type="urn:t",
        )


def test_the_provenance_holds_the_manifest_and_the_sbom(finalized: Path, keys: Path) -> None:
    manifest = read_manifest(manifest_path_for(finalized))
    trusted = [load_public(keys / "site.pub", "test")]
    envelope = record_path(finalized, PROVENANCE_SUFFIX).read_bytes()
    sbom = record_path(finalized, SBOM_SUFFIX).read_bytes()
    checked = verify_build(finalized.name, manifest["sha256"], envelope, sbom, trusted, manifest)
    assert (
        checked.provenance.predicate["buildDefinition"]["externalParameters"]["variant"] == "rocm6.4-torch2.9"
    )
    edited = json.loads(json.dumps(manifest))
    edited["inputs"]["torch"] = "2.9.0"
    edited["toolchain"] = {"torch": "2.9.0+rocm6.4"}
    assert provenance.manifest_drift(edited, checked.provenance.predicate) == [
        "inputs.torch: manifest '2.9.0', signed '2.9.1'",
        "toolchain.torch: manifest '2.9.0+rocm6.4', signed None",
    ]
    with pytest.raises(RecordRefused, match="its manifest differs from the signed provenance: inputs.torch"):
        verify_build(finalized.name, manifest["sha256"], envelope, sbom, trusted, edited)
    # keys the provenance leaves out (parity, timings) may change
    assert (
        provenance.manifest_drift({**manifest, "parity": {"passed": True}}, checked.provenance.predicate)
        == []
    )
    with pytest.raises(
        RecordRefused, match=r"cdx.json: sha256 [0-9a-f]{16}\.\.\., the signed provenance names"
    ):
        verify_build(finalized.name, manifest["sha256"], envelope, sbom + b" ", trusted, manifest)
    with pytest.raises(RecordRefused, match="no SBOM"):
        verify_build(finalized.name, manifest["sha256"], envelope, None, trusted, manifest)


def test_the_wheel_is_believed_over_its_manifest(finalized: Path, tmp_path: Path) -> None:
    manifest = read_manifest(manifest_path_for(finalized))
    claims = wheel_claims.check(finalized, manifest)
    assert (claims.variant, claims.python_tag, claims.abi_tag, claims.platforms) == (
        "rocm6.4-torch2.9",
        "py3",
        "none",
        ("any",),
    )
    assert claims.torch_requirements == ("torch==2.9.*",)
    with pytest.raises(
        PublishError, match="variant: the wheel says rocm6.4-torch2.9, the manifest says cu128-torch2.8"
    ):
        wheel_claims.check(finalized, {**manifest, "variant": "cu128-torch2.8"})
    moved = json.loads(json.dumps(manifest))
    moved.update(variant="rocm6.4-torch2.8", local_version="rocm6.4torch2.8cxx11abiTRUE.triton")
    moved["inputs"]["torch"] = "2.8.0"
    problems = wheel_claims.mismatches(claims, moved)
    assert "variant: the wheel says rocm6.4-torch2.9, the manifest says rocm6.4-torch2.8" in problems
    assert (
        "local version: the wheel says rocm6.4torch2.9cxx11abiTRUE.triton, the manifest says "
        "rocm6.4torch2.8cxx11abiTRUE.triton (from its inputs)" in problems
    )
    assert (
        "torch requirement: the wheel says torch==2.9.*, the manifest says torch==2.8.* (from its inputs)"
        in problems
    )
    # a wheel whose METADATA pin was loosened after finalize (same file name)
    contents = read_wheel(finalized)
    meta = f"{contents.dist_info}/METADATA"
    members = dict(contents.members)
    members[meta] = Member(
        members[meta].data.replace(b"Requires-Dist: torch==2.9.*", b"Requires-Dist: torch")
    )
    loose = write_wheel(tmp_path / "loose", finalized.name, contents.dist_info, members, 1700000000)
    assert wheel_claims.mismatches(wheel_claims.read_claims(loose), manifest) == [
        "torch requirement: the wheel says torch, the manifest says torch==2.9.* (from its inputs)"
    ]


def test_the_sbom_lists_what_the_wheel_bundles_and_pins(finalized: Path) -> None:
    manifest = read_manifest(manifest_path_for(finalized))
    raw = make_sbom(finalized, manifest)
    assert raw == make_sbom(finalized, manifest)  # same wheel, same bytes
    bom = json.loads(raw)
    assert bom["metadata"]["component"]["hashes"] == [{"alg": "SHA-256", "content": manifest["sha256"]}]
    epoch = manifest["finalize"]["source_date_epoch"]  # the timestamp is finalize's SOURCE_DATE_EPOCH
    assert bom["metadata"]["timestamp"] == dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat()
    by_name = {c["name"]: c for c in bom["components"]}
    assert by_name["torch"]["version"] == "2.9.1" and by_name["torch"]["scope"] == "required"
    assert {"name": "attnforge:requirement", "value": "torch==2.9.*"} in by_name["torch"]["properties"]
    assert by_name["rocm-runtime"]["version"] == "6.4"
    # no reading of the tree in this manifest and no commit in the compat data for FA2 2.8.3: said so
    props = {p["name"]: p["value"] for p in by_name["cutlass"]["properties"]}
    assert by_name["cutlass"]["version"] == "unknown" and props["attnforge:commit"] == "unknown"
    assert props["attnforge:commit_from"] == "unknown: not recorded in the compat data for this release"
    (deps,) = [d for d in bom["dependencies"] if d["ref"] == finalized.name]
    assert set(deps["dependsOn"]) == {"flash-attn-2.8.3-source", "cutlass", "accelerator-runtime", "torch"}
    assert cutlass_commit("flash-attn-3", "3.0.0") == "7127592069c2fe01b041e174ba4345ef9b279671"


def test_the_sbom_names_cutlass_as_the_build_read_it(finalized: Path) -> None:
    """The builder's reading of the vendored tree (manifest `vendored`) gives the version, the tree hash and,
    where the tree knew it, the commit; an sdist without git metadata says the commit is unknown and why."""
    manifest = read_manifest(manifest_path_for(finalized))
    seen = {"path": "csrc/cutlass", "version": "3.9.2", "tree_sha256": "c" * 64, "files": 1234}
    bom = json.loads(make_sbom(finalized, {**manifest, "vendored": {"cutlass": {**seen, "commit": None}}}))
    cutlass = next(c for c in bom["components"] if c["name"] == "cutlass")
    props = {p["name"]: p["value"] for p in cutlass["properties"]}
    assert cutlass["version"] == "3.9.2" and "purl" not in cutlass
    assert props["attnforge:tree_sha256"] == "c" * 64 and props["attnforge:tree_files"] == "1234"
    assert props["attnforge:commit_from"] == "unknown: the source vendors csrc/cutlass without git metadata"
    commit = "7127592069c2fe01b041e174ba4345ef9b279671"
    pinned = {**seen, "commit": commit, "commit_from": "git source record"}
    bom = json.loads(make_sbom(finalized, {**manifest, "vendored": {"cutlass": pinned}}))
    cutlass = next(c for c in bom["components"] if c["name"] == "cutlass")
    props = {p["name"]: p["value"] for p in cutlass["properties"]}
    assert cutlass["purl"] == f"pkg:github/nvidia/cutlass@{commit}" and props["attnforge:commit"] == commit
    assert props["attnforge:commit_from"] == "the source tree (git source record)"
