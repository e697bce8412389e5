"""`attnforge parity`: GPU kernel parity of a flash-attn wheel (and FlexAttention/SDPA on the same torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from attnforge.builder.files import sha256_file
from attnforge.core.errors import EnvironmentProblem, TestFailure
from attnforge.matrix.project import Project
from attnforge.wheels.manifest import MANIFEST_SUFFIX, record_from_report
from attnforge.wheels.signing_keys import project_signing, short, signing_key


@click.group("parity")
def command() -> None:
    """GPU parity: flash-attn, FlexAttention, SDPA and transformers against an fp32 reference.

    Tolerance is upstream flash-attn's: kernel error <= 2x (forward) / 3x (gradients) PyTorch's own
    low-precision error + eps. Reports: parity.json, parity.md, parity.junit.xml (`attnforge docs gpu-parity`).
    """


@command.command("run")
@click.option(
    "--wheel",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="flash-attn wheel to test; installed into a fresh venv over this Python's torch.",
)
@click.option(
    "--manifest",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The wheel's manifest (default: <wheel>.manifest.json when present).",
)
@click.option("--out", type=click.Path(path_type=Path), default=Path("reports/gpu"), show_default=True)
@click.option(
    "--stem",
    default="parity",
    show_default=True,
    help="Report names in --out: STEM.json, STEM.md, STEM.junit.xml (e.g. fa3_parity).",
)
@click.option("--suites", default="flash,flex,sdpa,hf", show_default=True)
@click.option("--quick", is_flag=True, help="One head dim per dtype; bf16-only Flex.")
@click.option(
    "--record/--no-record",
    default=True,
    show_default=True,
    help="Write the outcome into the manifest's `parity` (publishing gates on it).",
)
@click.option(
    "--venv", "venv_dir", type=click.Path(path_type=Path), help="Where to make the venv (default: temp)."
)
@click.option(
    "--with",
    "extra",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Another wheel to install into the venv beside the one under test (offline, no deps; e.g. "
    "pytest and einops for upstream's tests). Repeatable.",
)
@click.option(
    "--upstream-tests",
    type=click.Path(exists=True, path_type=Path),
    help="Upstream's tests to sample: FA3 the source archive (or hopper/ folder); FA2 a checkout or archive of "
    "the release's tag, its tests/ folder, or tests/test_flash_attn.py itself (the sdist does not ship it).",
)
@click.option(
    "--upstream-sample",
    type=click.IntRange(1),
    default=120,
    show_default=True,
    help="How many of upstream's tests to run (a fixed-seed sample; FA2: spread over every test function).",
)
@click.option(
    "--upstream-budget",
    type=click.FloatRange(10),
    default=300.0,
    show_default=True,
    help="Seconds the upstream sample may take (the rest counts as not run).",
)
@click.pass_obj
def run(
    project: Project,
    wheel: Path | None,
    manifest: Path | None,
    out: Path,
    stem: str,
    suites: str,
    quick: bool,
    record: bool,
    venv_dir: Path | None,
    extra: tuple[Path, ...],
    upstream_tests: Path | None,
    upstream_sample: int,
    upstream_budget: float,
) -> None:
    """Run the parity suites on this machine's GPU; GPU-less machines get an all-skipped report (exit 5).

    The wheel's manifest names its kernel: a flash-attn-3 wheel runs FA3's cases (flash_attn_interface). With
    --upstream-tests, a sample of upstream's own test_flash_attn.py runs too (FA3: hopper/, FA2: tests/)."""
    from attnforge.parity.venv import install, make_venv  # start-up cost

    if manifest is None and wheel is not None:
        cand = wheel.with_name(wheel.name + ".manifest.json")
        manifest = cand if cand.is_file() else None
    python = sys.executable
    tmp = None
    if wheel is not None:
        if venv_dir is None:
            tmp = tempfile.TemporaryDirectory(prefix="attnforge-parity-")
            venv_dir = Path(tmp.name) / "venv"
        vpy = make_venv(venv_dir)
        install(vpy, [wheel, *extra])
        python = str(vpy)
    src = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    cmd = [
        python,
        "-m",
        "attnforge.parity.parity_run",
        "--out",
        str(out),
        "--stem",
        stem,
        "--suites",
        suites,
        "--matrix",
        str(project.matrix_path),
    ]
    if wheel is not None:
        cmd += ["--wheel", wheel.name, "--wheel-sha256", sha256_file(wheel)]
    if manifest is not None:
        cmd += ["--manifest", str(manifest)] + (["--record"] if record else [])
    results = out / f"{stem}.results.json"
    cmd += ["--save-results", str(results)]
    if quick:
        cmd.append("--quick")
    if upstream_tests is not None:
        cmd += [
            "--upstream-tests",
            str(upstream_tests.resolve()),
            "--upstream-sample",
            str(upstream_sample),
            "--upstream-budget-s",
            str(upstream_budget),
        ]
    try:
        code = subprocess.call(cmd, env=env)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if wheel is not None and record and code in (0, 6) and (out / f"{stem}.json").is_file():
        _sign(project, wheel, out / f"{stem}.json", results)
    if code == 5:
        raise EnvironmentProblem(
            "no CUDA GPU visible: every parity case was skipped", hint=f"see {out}/{stem}.md"
        )
    if code != 0:
        raise TestFailure(f"parity failed (runner exit {code})", hint=f"see {out}/{stem}.md")


def _sign(project: Project, wheel: Path, report: Path, results: Path | None, ref: str | None = None) -> None:
    """Sign the run's outcome about the wheel's bytes (`<wheel>.parity.intoto.json`, `attnforge docs records`)."""
    from attnforge.parity.parity_statement import sign_run  # start-up cost

    key = signing_key(project_signing(project), log=lambda m: click.echo(m, err=True))
    assert key is not None
    path, pred = sign_run(wheel, report, key, results, ref)
    verdict = "passed" if pred["passed"] else "FAILED"
    click.echo(f"parity: {verdict}, signed by {short(key.keyid)} in {path}", err=True)


@command.command("record")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--report",
    "report",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="The parity.json of the run.",
)
@click.option("--report-ref", help="Path recorded in the manifest (default: the --report path as given).")
@click.option(
    "--results",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The run's per-case results (`parity run` writes STEM.results.json): suites and the wheel's verdict.",
)
@click.pass_obj
def record(
    project: Project, manifest: Path, report: Path, report_ref: str | None, results: Path | None
) -> None:
    """Record a parity.json's outcome in a wheel's manifest (`parity: {passed, device, report, date}`) and
    sign it about the wheel beside the manifest (`<wheel>.parity.intoto.json`)."""
    wheel = manifest.with_name(manifest.name.removesuffix(MANIFEST_SUFFIX))
    if results is None and report.with_name(report.stem + ".results.json").is_file():
        results = report.with_name(report.stem + ".results.json")
    _sign(project, wheel, report, results, report_ref)  # refuses a report about another wheel first
    data = record_from_report(manifest, report, report_ref)
    p = data["parity"]
    click.echo(
        f"{manifest.name}: parity {'passed' if p['passed'] else 'FAILED'} on {p['device']} ({p['date']})"
    )


@command.command("trace")
@click.argument("wheel", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--python",
    "python",
    required=True,
    help="An interpreter with the torch to check and this wheel installed (a venv's bin/python).",
)
def trace(wheel: Path, python: str) -> None:
    """CPU import/trace check of a stable-ABI wheel under another torch, no GPU: import it, find its ops
    registered, trace forward and backward on meta tensors; recorded beside the wheel
    (`<wheel>.torch-checks.json`, published with it: the coverage page lists that torch for the file).
    Exit 6 when the check fails (recorded as failed)."""
    import hashlib

    from attnforge.parity.import_trace import import_trace  # start-up cost
    from attnforge.wheels.torch_checks import add_check  # start-up cost

    check = import_trace(python)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    path = add_check(wheel, sha, check)
    verdict = "passed" if check.passed else "FAILED"
    click.echo(
        f"{wheel.name}: cpu-import-trace under torch {check.torch} (Python {check.python}) {verdict}: {path.name}"
    )
    if not check.passed:
        raise TestFailure(
            f"{wheel.name} under torch {check.torch}: {check.detail.get('error', check.detail)}"
        )
