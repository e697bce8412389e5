"""Hostile input, second pass: a parity pass signed for another wheel, a METADATA zip bomb, an edited index
marker, a FIFO named like a wheel, numbers no machine honours, and parity reports of the wrong shape.

Real parts: wheels written by attnforge's own wheel writer, real signing keys, a real static index, the real
CLI (in-process for quick refusals, a subprocess where memory or a hang is what is measured).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnforge.builder.parallelism import MAX_JOBS_PER_CORE, Machine, choose_parallelism
from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.matrix.file import parse_matrix
from attnforge.publish.index import MARKER, StaticIndex
from attnforge.publish.record_gate import parity_verdicts
from attnforge.publish.release import collect_bundles
from attnforge.publish.yank import set_yanked
from attnforge.wheels.parity_binding import load_report, mismatches
from attnforge.wheels.parity_binding import tested_from_report as bind_report
from attnforge.wheels.records import write_parity_record
from attnforge.wheels.signing_keys import generate_key, load_public
from tests.unit.test_wheels_index import make_bundle

Run = Callable[..., tuple[int, str, str]]
LOCAL = "cu130torch2.14cxx11abiTRUE.fwd128"
GOOD = """\
version: 1
kernels:
  flash-attn: {version: "2.8.3"}
targets:
  t:
    matrix: {toolkit: [cuda12.8], torch: ["2.8"], python: ["3.12"], arch: [sm_90]}
"""


# ------------------------------------------------------------------------------ parity bound to the wheel


def report_for(wheel: str, sha: str, /, **change: str) -> dict[str, Any]:
    """A parity.json of a run of `wheel` (cp311, torch 2.14.1+cu130, profile fwd128), fields changed."""
    rep = {
        "device": "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)",
        "torch": "2.14.1+cu130",
        "wheel": wheel,
        "wheel_sha256": sha,
        "profile": "fwd128: head dims [128], dtypes ['bf16', 'fp16'], disabled backward (from manifest)",
        "python": "cp311",
        "passed": 12,
        "failed": 0,
        "skipped": 1,
        "cases": [],
    }
    return {**rep, **change}


@pytest.fixture(scope="module")
def fwd_bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    b = make_bundle(tmp_path_factory.mktemp("w"), LOCAL, variant="cu130-torch2.14")
    b.manifest["inputs"]["profile"] = "fwd128"
    return b


def test_a_report_of_this_wheel_binds_every_field(fwd_bundle: Any) -> None:
    tested = bind_report(
        report_for(fwd_bundle.filename, fwd_bundle.sha256),
        fwd_bundle.filename,
        fwd_bundle.sha256,
        fwd_bundle.manifest,
    )
    assert (
        tested["profile"] == "fwd128"
        and tested["python"] == "cp311"
        and tested["sha256"] == fwd_bundle.sha256
    )
    assert mismatches(tested, fwd_bundle.filename, fwd_bundle.sha256, fwd_bundle.manifest) == []


OTHER = "flash_attn-2.8.3+cu130torch2.11cxx11abiTRUE.hd64128-cp312-cp312-linux_x86_64.whl"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.sampled_from(["wheel", "wheel_sha256", "python", "torch", "profile"]),
    value=st.sampled_from([OTHER, "0" * 64, "cp312", "2.11.0+cu130", "hd64128: head dims [64, 128]", "cp39"]),
)
def test_a_report_made_for_another_wheel_is_refused_naming_the_field(
    fwd_bundle: Any, field: str, value: str
) -> None:
    rep = report_for(fwd_bundle.filename, fwd_bundle.sha256, **{field: value})
    name = {"wheel_sha256": "sha256"}.get(field, field)
    try:
        bind_report(rep, fwd_bundle.filename, fwd_bundle.sha256, fwd_bundle.manifest)
    except ConfigurationError as exc:
        assert f"was not made for {fwd_bundle.filename}: " in exc.message
        assert exc.message.split(f"{fwd_bundle.filename}: ", 1)[1].startswith(f"{name}: tested "), exc.message
        return
    # only a value that still describes this wheel may pass (cp311's wheel run by cp311 ...)
    assert rep.get(field) in (fwd_bundle.filename, fwd_bundle.sha256, "cp311"), (field, value, name)


def forged_record(bundle: Any, key: Any, tested: dict[str, str] | None) -> None:
    """A parity record signed by the trusted key whose `tested` names another wheel (or nothing: what
    `parity record` signed before the binding existed)."""
    pred: dict[str, Any] = {"passed": True, "gpu": "NVIDIA H100", "counts": {"passed": 12, "failed": 0}}
    if tested is not None:
        pred["tested"] = tested
    write_parity_record(bundle.wheel, bundle.sha256, pred, key)


def test_publish_refuses_a_parity_record_signed_for_another_wheel(tmp_path: Path, fwd_bundle: Any) -> None:
    key = generate_key(tmp_path / "keys" / "site.pem")
    trusted = [load_public(tmp_path / "keys" / "site.pub", "test")]
    other = {
        "wheel": OTHER,
        "sha256": fwd_bundle.sha256,
        "python": "cp312",
        "torch": "2.11.0+cu130",
        "profile": "hd64128",
        "gpu": "NVIDIA H100",
    }
    forged_record(fwd_bundle, key, other)
    with pytest.raises(PublishError) as err:
        parity_verdicts([fwd_bundle], trusted)
    assert "the signed run did not test this wheel: wheel: tested " + OTHER in err.value.message
    assert "python: tested cp312, the wheel is cp311" in err.value.message
    forged_record(fwd_bundle, key, {**other, "wheel": fwd_bundle.filename, "python": "cp311"})
    with pytest.raises(PublishError, match=r"torch: tested 2.11.0\+cu130, wheel needs torch 2.14"):
        parity_verdicts([fwd_bundle], trusted)
    forged_record(fwd_bundle, key, None)  # unbound: signed by attnforge before this check existed
    with pytest.raises(PublishError, match="binds no tested subject"):
        parity_verdicts([fwd_bundle], trusted)
    good = {
        **other,
        "wheel": fwd_bundle.filename,
        "python": "cp311",
        "torch": "2.14.1+cu130",
        "profile": "fwd128",
    }
    forged_record(fwd_bundle, key, good)
    assert parity_verdicts([fwd_bundle], trusted) == {fwd_bundle.filename: None}
    forged_record(fwd_bundle, key, {**good, "profile": "full"})
    with pytest.raises(PublishError, match="profile: tested full, the wheel's is fwd128"):
        parity_verdicts([fwd_bundle], trusted)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("not json {", "not a parity report (not JSON"),
        ('{"failed": "abc"}', "`failed` must be a count (0 or more), not 'abc'"),
        ("[1, 2]", "not a parity report (a JSON list, not an object)"),
        ('{"passed": true}', "`passed` must be a count"),
        ('{"passed": 1, "device": ["x"]}', "`device` must be a short string"),
        ('{"passed": 1, "cases": 3}', "`cases` must be a list"),
    ],
)
def test_parity_reports_of_the_wrong_shape_are_one_line(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "parity.json"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as err:
        load_report(path)
    assert err.value.message.startswith(f"{path}: ") and why in err.value.message


def test_parity_record_cli_refuses_bad_reports_and_other_wheels(
    tmp_path: Path, run_cli: Run, monkeypatch: pytest.MonkeyPatch, fwd_bundle: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix.yaml").write_text(GOOD + "signing: {key: keys/site.pem}\n")
    generate_key(tmp_path / "keys" / "site.pem")
    wheel = tmp_path / fwd_bundle.filename
    wheel.write_bytes(fwd_bundle.wheel.read_bytes())
    manifest = tmp_path / (wheel.name + ".manifest.json")
    manifest.write_text(json.dumps(fwd_bundle.manifest))
    before = manifest.read_text()
    report = tmp_path / "parity.json"
    for text in ("not json {", '{"failed": "abc"}', "[1, 2]"):
        report.write_text(text)
        code, _, err = run_cli("parity", "record", str(manifest), "--report", str(report))
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    report.write_text(json.dumps(report_for(OTHER, "1" * 64, torch="2.11.0+cu130", python="cp312")))
    code, _, err = run_cli("parity", "record", str(manifest), "--report", str(report))
    assert code == 2 and f"the parity report was not made for {wheel.name}: wheel: tested {OTHER}" in err
    assert manifest.read_text() == before and not (tmp_path / (wheel.name + ".parity.intoto.json")).exists()
    report.write_text(json.dumps(report_for(wheel.name, fwd_bundle.sha256)))
    code, _, err = run_cli("parity", "record", str(manifest), "--report", str(report))
    assert code == 0, err
    stmt = (tmp_path / (wheel.name + ".parity.intoto.json")).read_text()
    assert json.loads(manifest.read_text())["parity"]["passed"] is True and "payload" in stmt


# ------------------------------------------------------------------------------ the archive: bounded, after signatures


def zip_bomb(folder: Path, inflated: int, member: str = "/METADATA", block: bytes = b" " * (1 << 20)) -> Any:
    """A wheel whose `member` (METADATA by default) inflates to `inflated` bytes of its own text and then
    `block` repeated (spaces: deflate ~1/1000), with a hand-written manifest matching its bytes."""
    b = make_bundle(folder, "cu130torch2.14cxx11abiTRUE")
    bomb = b.wheel.with_suffix(".tmp")
    with zipfile.ZipFile(b.wheel) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.endswith(member):
                with dst.open(info.filename, "w", force_zip64=True) as fh:
                    fh.write(src.read(info).rstrip(b"\n") + b"\nDescription: ")
                    for _ in range(inflated // len(block)):
                        fh.write(block)
            else:
                dst.writestr(info.filename, src.read(info))
    bomb.replace(b.wheel)
    data = b.wheel.read_bytes()
    b.manifest.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    b.wheel.with_name(b.wheel.name + ".manifest.json").write_text(json.dumps(b.manifest))
    return b


# The command runs as a grandchild: one forked from this (large) pytest process would report pytest's memory
# as its own peak (Linux carries the pre-exec high-water mark into ru_maxrss).
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stdout.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd: list[str], cwd: Path, timeout: float = 60) -> tuple[int, str, float, float]:
    """(exit code, stderr, seconds, peak resident MB) of one real process, measured by wait4."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stderr, time.monotonic() - start, int(proc.stdout or 0) / 1024


def test_a_metadata_zip_bomb_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    bomb = zip_bomb(tmp_path / "in", 300 << 20)
    assert bomb.wheel.stat().st_size < 2 << 20
    (tmp_path / "matrix.yaml").write_text(GOOD)
    cmd = [sys.executable, "-m", "attnforge.cli", "publish", "--to", str(tmp_path / "index"), str(bomb.wheel)]
    code, err, took, peak_mb = run_measured(cmd, tmp_path)
    assert code == 7 and "no signed build provenance" in err and "Traceback" not in err, err
    code, err, took, peak_mb = run_measured([*cmd, "--allow-unsigned"], tmp_path)
    assert code == 7 and "Traceback" not in err, err
    assert "METADATA inflates to " in err and "(at most 4,294,967,296 bytes, 200x above" in err, err
    assert took < 5 and peak_mb < 200, (took, peak_mb)
    assert not (tmp_path / "index").exists()


def test_every_member_is_bounded_by_the_directory_and_the_read(tmp_path: Path) -> None:
    from attnforge.wheels import wheel_claims
    from attnforge.wheels.zip_limits import read_member

    bomb = zip_bomb(tmp_path / "a", 64 << 20, member="__init__.py")  # another member: 64 MiB of spaces
    with pytest.raises(PublishError, match=r"flash_attn/__init__.py inflates to 67,108,\d+ bytes from"):
        wheel_claims.check(bomb.wheel, bomb.manifest)
    # a METADATA that compresses like text (no bomb by ratio), over the cap a member may hold
    text = zip_bomb(tmp_path / "b", 17 << 20, block=os.urandom(1 << 19).hex().encode())
    with zipfile.ZipFile(text.wheel) as zf, pytest.raises(PublishError, match="over the 16,777,216 a member"):
        read_member(text.wheel, zf, next(n for n in zf.namelist() if n.endswith("/METADATA")))


def test_a_fifo_named_like_a_wheel_is_refused_not_waited_on(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    os.mkfifo(tmp_path / "wheels" / "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl")
    (tmp_path / "wheels" / "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl.manifest.json").write_text("{}")
    with pytest.raises(PublishError, match="not a regular file"):
        collect_bundles([tmp_path / "wheels"])


# ------------------------------------------------------------------------------ the index's own metadata


@pytest.fixture
def index(tmp_path: Path) -> StaticIndex:
    idx = StaticIndex(tmp_path / "site" / "index")
    idx.publish([make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")])
    return idx


def edit_marker(index: StaticIndex, change: Callable[[dict[str, Any]], None]) -> None:
    path = index.root / MARKER
    data = json.loads(path.read_text())
    (rec,) = data["files"].values()
    change(rec)
    data["files"] = {rec["filename"]: rec}
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda r: r.update(variant="../../X"), "variant '../../X' is not a plain folder name"),
        (lambda r: r.update(variant=".."), "is not a plain folder name"),
        (lambda r: r.update(variant="a/b"), "is not a plain folder name"),
        (lambda r: r.update(filename="not-a-wheel.whl"), "'not-a-wheel.whl' is not a wheel file name"),
        (lambda r: r.update(filename="../../x-1.0-py3-none-any.whl"), "is not its key"),
        (lambda r: r.update(project="../x"), "project '../x' is not the wheel's"),
        (lambda r: r.update(sha256="zz"), "`sha256` is not a sha256 hex digest"),
        (lambda r: r.update(size="12"), "`size` must be a byte count"),
        (lambda r: r.update(version="2.8.3+evil"), "is not the file name's"),
    ],
)
def test_an_edited_index_marker_is_refused_and_nothing_escapes(
    index: StaticIndex, tmp_path: Path, edit: Callable[[dict[str, Any]], None], why: str
) -> None:
    edit_marker(index, edit)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(PublishError) as err:
        index.publish([make_bundle(tmp_path / "in2", "cu130torch2.13cxx11abiTRUE")])
    assert why in err.value.message and MARKER in err.value.message
    after = sorted(str(p) for p in tmp_path.rglob("*") if "in2" not in p.parts)
    assert not (tmp_path / "X").exists() and not (tmp_path / "site" / "X").exists()
    assert [p for p in after if p not in before and ".attnforge-gen" not in p and ".lock" not in p] == []


def test_a_yank_reason_of_100_kb_is_refused(index: StaticIndex) -> None:
    name = next(iter(index.records()))
    with pytest.raises(ConfigurationError, match=r"--reason is 102,400 characters: one line of at most 500"):
        set_yanked(index, name, "x" * 102_400)
    with pytest.raises(ConfigurationError, match="over several lines"):
        set_yanked(index, name, "broken\nsee https://example.org")
    assert set_yanked(index, name, "miscompiled for sm_90").reason == "miscompiled for sm_90"


# ------------------------------------------------------------------------------ numbers no machine honours


@settings(max_examples=25, deadline=None)
@given(
    digits=st.integers(min_value=101, max_value=6000),
    where=st.sampled_from(["version: {n}\n", "version: 1\nbuild: {{resources: {{max_jobs: {n}}}}}\n"]),
)
def test_huge_numbers_in_matrix_yaml_are_one_line_with_their_position(digits: int, where: str) -> None:
    text = where.format(n="9" * digits) + GOOD.split("\n", 1)[1]
    with pytest.raises(ConfigurationError) as err:
        parse_matrix(text, "matrix.yaml")
    assert f"a number of {digits:,} characters (at most 100)" in err.value.message
    assert err.value.message.startswith("matrix.yaml:")


def test_max_jobs_beyond_any_machine_is_refused_and_beyond_this_one_capped() -> None:
    with pytest.raises(ConfigurationError, match="more than any build machine runs at once"):
        parse_matrix(GOOD + "build: {resources: {max_jobs: 1000000000}}\n", "matrix.yaml")
    parse_matrix(GOOD + "build: {resources: {max_jobs: 1024}}\n", "matrix.yaml")
    machine = Machine(cores=2, memory_available_gb=20.0, memory_limit_source="test")
    par = choose_parallelism(machine, 1, 1.0, max_jobs=1000)
    assert par.max_jobs == 2 * MAX_JOBS_PER_CORE
    assert "MAX_JOBS 1,000 given, capped at 4 per core" in par.reason
    assert choose_parallelism(machine, 1, 1.0, max_jobs=3).max_jobs == 3
