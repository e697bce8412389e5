"""Signed records on a real publish round trip (docs/records.md): the real CLI finalizes, signs, publishes,
serves; pip installs into a fresh venv; `doctor --verify` checks the installed files against the signed wheel.

The wheel is a small pure-Python flash_attn (a ROCm Triton cell's shape: `py3-none-any`, so finalize needs no
compiler or auditwheel run) written by attnforge's own wheel writer. Refused with exit 7 and the reason: a forged
parity record (the manifest's boolean alone, or an altered signed one), an edited manifest (variant, inputs), a
wheel whose bytes changed after signing, a statement signed by another key, and an unsigned wheel.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.wheelfactory import VENV_BIN, attnforge_serve, pip_install
from tests.unit.test_wheels_pure import manifest as pure_manifest
from tests.unit.test_wheels_pure import raw_wheel

WHEEL = "flash_attn-2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton-py3-none-any.whl"
VARIANT = "rocm6.4-torch2.9"
RECORDS = (".provenance.intoto.json", ".cdx.json", ".parity.intoto.json")
REPORT = {
    "device": "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)",
    "torch": "2.9.1+rocm6.4",
    "wheel": WHEEL,
    "profile": "triton",
    "python": "cp311",
    "passed": 12,
    "failed": 0,
    "skipped": 1,
    "cases": [{"kernel": "flash_attn_func", "dtype": "bf16", "shape": "b2 s128 h4 d64", "ok": True}],
}


def attnforge(
    *args: str | Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `attnforge` CLI (exit code kept; no check). Keys come from the project's matrix.yaml only:
    a signing or trusted key named in this process's environment (another module's) is left out."""
    cmd = [str(VENV_BIN / "attnforge"), *map(str, args)]
    env = env if env is not None else clean_env()
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=300)


def clean_env(**extra: str) -> dict[str, str]:
    keep = {
        k: v for k, v in os.environ.items() if k not in ("ATTNFORGE_SIGNING_KEY", "ATTNFORGE_TRUSTED_KEYS")
    }
    return {**keep, **extra}


def raw_manifest(wheel: str) -> dict[str, Any]:
    """What the build engine hands finalize for a ROCm Triton cell (`test_wheels_pure.manifest`), with the
    source, patches and the build's own facts that the provenance records."""
    data = pure_manifest(wheel, source="pypi-sdist", source_sha256="9" * 64, patches=["setup-hooks"])
    return {
        **data,
        "toolchain": {"python": "3.12.3", "torch": "2.9.1+cpu"},
        "build": {"backend": "local", "wall_s": 1.0},
        "platform_tag": None,
        "parity": None,
    }


def write_raw(folder: Path) -> Path:
    """The pure wheel of `test_wheels_pure.raw_wheel` with `raw_manifest` beside it."""
    wheel = raw_wheel(folder)
    wheel.with_name(wheel.name + ".manifest.json").write_text(json.dumps(raw_manifest(wheel.name)))
    return wheel


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """matrix.yaml with the site key (`signing.key`), a gated static destination and an ungated one; the wheel
    finalized and signed by `wheels finalize`, its parity signed by `parity record`."""
    root = tmp_path_factory.mktemp("records") / "proj"
    (root / "keys").mkdir(parents=True)
    matrix = {
        "version": 1,
        "kernels": {"flash-attn": {"version": "2.8.3"}},
        "targets": {
            "default": {"matrix": {"toolkit": ["cuda13.0"], "torch": ["2.14.1"], "python": ["3.11"]}}
        },
        "destinations": {
            "gated": {"kind": "static", "path": "index", "require_parity": True},
            "open": {"kind": "static", "path": "open-index"},
        },
        "signing": {"key": "keys/site.pem"},
    }
    (root / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
    for name in ("site", "other"):
        assert attnforge("keys", "generate", f"keys/{name}.pem", cwd=root).returncode == 0
    raw = write_raw(root / "raw")
    proc = attnforge("wheels", "finalize", raw, "--out-dir", "wheels", cwd=root)
    assert proc.returncode == 0, proc.stderr
    wheel = root / "wheels" / WHEEL
    assert Path(proc.stdout.strip()) == wheel and "signed by " in proc.stderr
    report = root / "parity.json"
    report.write_text(json.dumps(REPORT))
    proc = attnforge("parity", "record", f"wheels/{wheel.name}.manifest.json", "--report", report, cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert "parity: passed, signed by" in proc.stderr
    yield root


def copy_set(project: Path, dest: Path) -> Path:
    """The wheel, its manifest and its records, copied into `dest` (one trial's own set)."""
    dest.mkdir(parents=True)
    for f in (project / "wheels").glob(WHEEL + "*"):
        shutil.copy2(f, dest / f.name)
    return dest / WHEEL


def manifest_of(wheel: Path) -> dict[str, Any]:
    return dict(json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text()))


def save_manifest(wheel: Path, data: dict[str, Any]) -> None:
    wheel.with_name(wheel.name + ".manifest.json").write_text(json.dumps(data, indent=2))


def refused(project: Path, wheel: Path, *extra: str, to: str = "gated") -> str:
    """Publish must exit 7 and leave the index untouched; returns the error line."""
    index = project / ("index" if to == "gated" else "open-index")
    before = sorted(p.name for p in index.resolve().rglob("*")) if index.exists() else []
    proc = attnforge("publish", "--to", to, wheel, *extra, cwd=project)
    assert proc.returncode == 7, (proc.returncode, proc.stderr)
    after = sorted(p.name for p in index.resolve().rglob("*")) if index.exists() else []
    assert after == before
    return proc.stderr


# ---------------------------------------------------------------- refused


def test_the_signed_records_are_what_finalize_and_parity_wrote(project: Path) -> None:
    wheel = project / "wheels" / WHEEL
    for suffix in RECORDS:
        assert wheel.with_name(wheel.name + suffix).is_file(), suffix
    env = json.loads(wheel.with_name(wheel.name + ".provenance.intoto.json").read_text())
    assert env["payloadType"] == "application/vnd.in-toto+json" and len(env["signatures"]) == 1
    stmt = json.loads(base64.b64decode(env["payload"]))
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == "https://slsa.dev/provenance/v1"
    assert stmt["subject"] == [
        {"name": WHEEL, "digest": {"sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}}
    ]
    definition = stmt["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["inputs"]["arches"] == ["gfx90a", "gfx942"]
    assert definition["internalParameters"]["torch_requirement"] == "torch==2.9.*"
    deps = {d["name"]: d for d in definition["resolvedDependencies"]}
    assert deps["flash-attn-2.8.3 source"]["digest"] == {"sha256": "9" * 64}
    assert len(deps["patch setup-hooks"]["digest"]["sha256"]) == 64
    assert deps["torch"]["uri"] == "pkg:pypi/torch@2.9.1" and deps["rocm"]["uri"] == "pkg:generic/rocm@6.4"
    sbom_bytes = wheel.with_name(wheel.name + ".cdx.json").read_bytes()
    (byproduct,) = stmt["predicate"]["runDetails"]["byproducts"]
    assert byproduct["digest"]["sha256"] == hashlib.sha256(sbom_bytes).hexdigest()
    sbom = json.loads(sbom_bytes)
    assert sbom["bomFormat"] == "CycloneDX" and sbom["specVersion"] == "1.6"
    names = {c["name"]: c for c in sbom["components"]}
    assert {"flash-attn-source", "cutlass", "rocm-runtime", "torch"} <= set(names)
    assert names["torch"]["version"] == "2.9.1"
    parity = json.loads(
        base64.b64decode(
            json.loads(wheel.with_name(wheel.name + ".parity.intoto.json").read_text())["payload"]
        )
    )
    assert parity["predicateType"] == "urn:attnforge:parity:v1"
    assert parity["predicate"]["passed"] is True and parity["predicate"]["counts"]["passed"] == 12
    assert (
        parity["predicate"]["report"]["digest"]["sha256"]
        == hashlib.sha256((project / "parity.json").read_bytes()).hexdigest()
    )


def test_a_forged_parity_record_is_refused(project: Path, tmp_path: Path) -> None:
    # the manifest's boolean alone: what passed the gate before records were signed
    wheel = copy_set(project, tmp_path / "bool")
    wheel.with_name(wheel.name + ".parity.intoto.json").unlink()
    data = manifest_of(wheel)
    data["parity"] = {"passed": True, "device": "H100", "report": "parity.json", "date": "2026-01-01"}
    save_manifest(wheel, data)
    err = refused(project, wheel)
    assert "no signed parity record" in err and "parity.passed is not evidence" in err
    # a signed record whose verdict was edited after signing
    wheel = copy_set(project, tmp_path / "edited")
    path = wheel.with_name(wheel.name + ".parity.intoto.json")
    env = json.loads(path.read_text())
    stmt = json.loads(base64.b64decode(env["payload"]))
    stmt["predicate"]["counts"]["failed"] = 0
    stmt["predicate"]["gpu"] = "NVIDIA B200"
    env["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    path.write_text(json.dumps(env))
    err = refused(project, wheel)
    assert "parity.intoto.json: the signature by" in err and "does not verify" in err


def test_an_edited_manifest_is_refused(project: Path, tmp_path: Path) -> None:
    # the variant (where the index puts the wheel): the wheel's own name says otherwise
    wheel = copy_set(project, tmp_path / "variant")
    save_manifest(wheel, {**manifest_of(wheel), "variant": "cu128-torch2.8"})
    err = refused(project, wheel)
    # the signed provenance is checked first (before the archive is opened): it names the edit
    assert "its manifest differs from the signed provenance" in err
    assert "variant: manifest 'cu128-torch2.8', signed 'rocm6.4-torch2.9'" in err
    # an input the file name does not show: the signed provenance does
    wheel = copy_set(project, tmp_path / "arches")
    data = manifest_of(wheel)
    data["inputs"]["arches"] = ["gfx90a", "gfx942", "gfx1100"]
    save_manifest(wheel, data)
    err = refused(project, wheel)
    assert "its manifest differs from the signed provenance" in err
    assert "inputs.arches: manifest ['gfx90a', 'gfx942', 'gfx1100'], signed ['gfx90a', 'gfx942']" in err


def test_a_wheel_changed_after_signing_is_refused(project: Path, tmp_path: Path) -> None:
    wheel = copy_set(project, tmp_path / "bytes")
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("flash_attn/extra.py", "print('not what was signed')\n")
    # the manifest alone would already refuse it; made consistent, the signed statement still does
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    save_manifest(wheel, {**manifest_of(wheel), "sha256": digest, "size": wheel.stat().st_size})
    err = refused(project, wheel)
    assert f"the wheel {WHEEL} is sha256 {digest[:16]}" in err and "changed after it was signed" in err


def test_a_statement_signed_by_another_key_is_refused(project: Path, tmp_path: Path) -> None:
    wheel = copy_set(project, tmp_path / "other")
    env = clean_env(ATTNFORGE_SIGNING_KEY=str(project / "keys" / "other.pem"))
    proc = attnforge("wheels", "sign", wheel, cwd=project, env=env)
    assert proc.returncode == 0, proc.stderr
    show = attnforge("keys", "show", cwd=project).stdout
    site = show.split("signing key: ")[1][:16]
    err = refused(project, wheel)
    assert "provenance.intoto.json: signed by " in err and f"not a trusted key (trusted: {site}" in err
    # trusting the other key for this publish only: the provenance holds, the parity record (site key) does not
    err = refused(project, wheel, "--trusted-key", str(project / "keys" / "other.pub"))
    assert "parity.intoto.json: signed by " in err and "not a trusted key" in err


def test_an_unsigned_wheel_needs_allow_unsigned(project: Path, tmp_path: Path) -> None:
    wheel = copy_set(project, tmp_path / "unsigned")
    for suffix in RECORDS:
        wheel.with_name(wheel.name + suffix).unlink()
    err = refused(project, wheel, to="open")
    assert "no signed build provenance" in err and "--allow-unsigned" in err
    proc = attnforge("publish", "--to", "open", wheel, "--allow-unsigned", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: --allow-unsigned: publishing 1 wheel(s) WITHOUT signed provenance" in proc.stderr


# ---------------------------------------------------------------- genuine


@pytest.fixture(scope="module")
def published(project: Path) -> Path:
    proc = attnforge("publish", "--to", "gated", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert f"added      {WHEEL}" in proc.stderr
    return project / "index"


def test_a_genuine_wheel_is_published_with_its_records(published: Path, project: Path) -> None:
    for variant in (VARIANT, "all"):
        home = published / variant / "simple" / "flash-attn"
        for suffix in ("", ".manifest.json", *RECORDS):
            served = home / (WHEEL + suffix)
            assert served.read_bytes() == (project / "wheels" / (WHEEL + suffix)).read_bytes(), served
    marker = json.loads((published / "attnforge-index.json").read_text())
    assert marker["files"][WHEEL]["parity"] == "passed"


def test_doctor_verifies_the_installed_wheel(published: Path, project: Path, tmp_path: Path) -> None:
    venv.create(tmp_path / "env", with_pip=False, symlinks=True)
    py = tmp_path / "env" / "bin" / "python"
    with attnforge_serve(published, tmp_path / "serve.log") as served:
        install = pip_install(
            py,
            "--no-deps",
            "--index-url",
            f"{served.url}/{VARIANT}/simple",
            "flash-attn==2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton",
        )
        assert install.returncode == 0, install.stderr
        proc = attnforge(
            "doctor", "--verify", "--json", "--python", py, "--index-url", served.url, cwd=project
        )
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
        for name in (
            "records: provenance",
            "records: sbom",
            "records: manifest",
            "records: parity",
            "records: installed files",
        ):
            assert checks[name]["status"] == "ok", checks[name]
        assert "all 6 files of" in checks["records: installed files"]["detail"]
        assert "NVIDIA H100" in checks["records: parity"]["detail"]
        # an installed file changed after the install: the signed wheel says otherwise
        site = Path(
            subprocess.run(
                [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        (site / "flash_attn" / "__init__.py").write_text("__version__ = 'patched'\n")
        proc = attnforge(
            "doctor", "--verify", "--json", "--python", py, "--index-url", served.url, cwd=project
        )
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
        assert checks["records: installed files"]["status"] == "fail"
        assert "flash_attn/__init__.py differs" in checks["records: installed files"]["detail"]
        assert proc.returncode == 5
        # a key the records were not signed with
        proc = attnforge(
            "doctor",
            "--verify",
            "--json",
            "--python",
            py,
            "--index-url",
            served.url,
            "--trusted-key",
            project / "keys" / "other.pub",
            cwd=project,
        )
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
        assert checks["records"]["status"] == "fail" and "not a trusted key" in checks["records"]["detail"]
    assert sys.executable  # the dev venv's pip installed into the fresh venv (pip_install)


def test_a_parity_record_signed_for_another_wheel_is_refused_everywhere(
    project: Path, tmp_path: Path
) -> None:
    """The trusted key's signature over a pass that names another wheel (torch 2.11, hd64128, cp312; what
    `parity record` signed from a foreign report before the binding): publish, `which --verify` and
    `doctor --verify` each refuse it, naming the field."""
    from attnforge.wheels.records import write_parity_record
    from attnforge.wheels.signing_keys import load_signer

    other = "flash_attn-2.8.3+cu130torch2.11cxx11abiTRUE.hd64128-cp312-cp312-linux_x86_64.whl"
    report = {**REPORT, "wheel": other, "torch": "2.11.0+cu130", "profile": "hd64128", "python": "cp312"}
    (tmp_path / "other.json").write_text(json.dumps(report))
    wheel = copy_set(project, tmp_path / "set")
    proc = attnforge(
        "parity", "record", f"{wheel}.manifest.json", "--report", tmp_path / "other.json", cwd=project
    )
    assert (
        proc.returncode == 2
        and f"the parity report was not made for {WHEEL}: wheel: tested {other}" in proc.stderr
    )
    key = load_signer(project / "keys" / "site.pem", "test")
    sha = manifest_of(wheel)["sha256"]
    forged = {"passed": True, "gpu": REPORT["device"], "counts": {"passed": 12, "failed": 0}}
    tested = {"wheel": other, "sha256": sha, "python": "cp312", "torch": "2.11.0+cu130", "profile": "hd64128"}
    write_parity_record(wheel, sha, {**forged, "tested": {**tested, "gpu": "NVIDIA H100"}}, key)
    err = refused(project, wheel)
    assert "the signed run did not test this wheel: wheel: tested " + other in err
    # the index an attacker can write to: a genuine publish, then the served record replaced by the forged one
    proc = attnforge(
        "publish", "--to", tmp_path / "site", copy_set(project, tmp_path / "genuine"), cwd=project
    )
    assert proc.returncode == 0, proc.stderr
    for variant in (VARIANT, "all"):
        served = tmp_path / "site" / variant / "simple" / "flash-attn" / (WHEEL + ".parity.intoto.json")
        served.write_bytes(wheel.with_name(WHEEL + ".parity.intoto.json").read_bytes())
    venv.create(tmp_path / "env", with_pip=False, symlinks=True)
    py = tmp_path / "env" / "bin" / "python"
    with attnforge_serve(tmp_path / "site", tmp_path / "serve.log") as served_index:
        url = served_index.url
        proc = attnforge(
            "which",
            "--verify",
            "--index-url",
            url,
            "--torch",
            "2.9.1+rocm6.4",
            "--profile",
            "triton",
            cwd=project,
        )
        assert proc.returncode == 7, (proc.returncode, proc.stderr)
        assert "the signed run did not test this wheel: wheel: tested " + other in proc.stderr
        install = pip_install(py, "--no-deps", "--index-url", f"{url}/{VARIANT}/simple", "flash-attn")
        assert install.returncode == 0, install.stderr
        proc = attnforge("doctor", "--verify", "--json", "--python", py, "--index-url", url, cwd=project)
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
        assert proc.returncode == 5 and checks["records"]["status"] == "fail"
        assert "the signed run did not test this wheel: wheel: tested " + other in checks["records"]["detail"]
