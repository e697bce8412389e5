"""Run the GPU parity suites and write the reports: ``python -m attnforge.parity.parity_run --out DIR``.

Standard library + torch only, so it runs in the fresh venv that holds the wheel under test (the suites import
the kernel and the client they test; ``--record`` writes the manifest, which needs pydantic). Exit codes: 0 all
ran cases passed, 6 a case failed, 5 no GPU (reports are still written, every case skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from attnforge.engine.env_probe import nvidia_driver
from attnforge.parity import cases as C
from attnforge.parity import fa3cases
from attnforge.parity import profile as P
from attnforge.parity.parity_report import FAILED, SKIPPED, Report, Result
from attnforge.parity.upstream import run as run_upstream

SUITES = ("flash", "flex", "sdpa", "hf")  # "flash": the wheel's kernel (FA2 cases, or FA3's for flash-attn-3)
WHEEL_SUITES = (
    "flash_attn",
    "hf",
    "flash_attn_3",
    "fa3_upstream",
    "fa2_upstream",
)  # what decides the wheel's verdict


def device_name() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu (no CUDA device)"
    p = torch.cuda.get_device_properties(0)
    return f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)"


def installed_flash_attn() -> tuple[Any, str | None, str]:
    """(module or None, version, why-not)."""
    try:
        import flash_attn

        return flash_attn, str(getattr(flash_attn, "__version__", "?")), ""
    except Exception as exc:
        return None, None, f"flash_attn does not import: {type(exc).__name__}: {exc}"


def installed_fa3() -> tuple[Any, str | None, str]:
    """(flash_attn_interface or None, flash_attn_3's version, why-not)."""
    try:
        import flash_attn_interface

        return flash_attn_interface, _dist_version("flash_attn_3"), ""
    except Exception as exc:
        return None, None, f"flash_attn_interface does not import: {type(exc).__name__}: {exc}"


def _dist_version(dist: str = "flash_attn") -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def _kernel_of(manifest: Path | None, wanted: str | None) -> str:
    """The wheel's kernel: --kernel, else its manifest's, else flash-attn."""
    if wanted:
        return wanted
    if manifest is not None and manifest.is_file():
        return str(json.loads(manifest.read_text(encoding="utf-8")).get("kernel") or "flash-attn")
    return "flash-attn"


def run(args: argparse.Namespace) -> tuple[Report, int]:
    import torch

    cuda = torch.cuda.is_available()
    manifest = Path(args.manifest) if args.manifest else None
    kernel = _kernel_of(manifest, args.kernel)
    if kernel == "flash-attn-3":
        fa, fa_version, fa_why = installed_fa3()
        full_version = fa_version
    else:
        fa, fa_version, fa_why = installed_flash_attn()
        full_version = _dist_version() or fa_version
    prof = P.resolve(manifest, full_version, Path(args.matrix) if args.matrix else None, kernel)
    dist = "flash_attn_3" if kernel == "flash-attn-3" else "flash_attn"
    report = Report(
        device=device_name(),
        torch=torch.__version__,
        wheel=args.wheel or (f"{dist} {full_version}" if full_version else None),
        profile=prof.describe() if fa is not None or manifest else None,
        wheel_sha256=args.wheel_sha256,
    )
    suites = [s for s in args.suites.split(",") if s]
    log = _logger(args)
    for path in args.load_results or []:
        for d in json.loads(Path(path).read_text(encoding="utf-8")):
            report.add(Result(**d))
    if not cuda:
        for s in suites:
            report.add(Result(s, s, "-", "-", SKIPPED, reason="no CUDA GPU visible"))
        return report, 5
    if "flash" in suites and kernel == "flash-attn-3":
        _run_fa3(args, fa, full_version, fa_why, prof, report, log)
    elif "flash" in suites:
        if fa is None:
            report.add(Result("flash_attn", "flash_attn", "-", "-", SKIPPED, reason=fa_why))
        else:
            from attnforge.parity.flash import run_case  # optional: torch
            from attnforge.parity.flash_child import run_case_isolated  # optional: torch

            todo = C.flash_cases(prof, quick=args.quick)
            log(f"flash_attn {full_version}: {len(todo)} cases; profile {prof.describe()}")
            for i, c in enumerate(todo):
                # expected-error cases run in a child: a wheel that crashes there fails the case, not the run
                results = run_case_isolated(c, seed=i) if c.expect_error else run_case(fa, c, seed=i)
                for r in results:
                    report.add(r)
                    _progress(log, r)
            _run_upstream(args, prof, report, log)
    if "sdpa" in suites:
        from attnforge.parity.sdpa import run_all  # optional: torch

        for r in run_all():
            report.add(r)
            _progress(log, r)
    if "flex" in suites:
        from attnforge.parity.flexcases import parity_variants, run_variant  # optional: torch

        for v in parity_variants(dtypes=("bf16",) if args.quick else ("bf16", "fp16")):
            for r in run_variant(v, "cuda"):
                report.add(r)
                _progress(log, r)
    if "hf" in suites and kernel == "flash-attn-3":
        report.add(
            Result(
                "hf",
                "transformers[flash_attention_3]",
                "-",
                "-",
                SKIPPED,
                reason="the transformers client check runs FA2 wheels only",
            )
        )
    elif "hf" in suites:
        if fa is None:
            report.add(Result("hf", "transformers[flash_attention_2]", "-", "-", SKIPPED, reason=fa_why))
        else:
            from attnforge.parity.hf import run as run_hf  # optional: torch

            for r in run_hf(prof):
                report.add(r)
                _progress(log, r)
    return report, 6 if report.count(FAILED) else 0


def _run_fa3(
    args: argparse.Namespace,
    fa3: Any,
    version: str | None,
    why: str,
    prof: P.WheelProfile,
    report: Report,
    log: Any,
) -> None:
    """FA3's own cases (``fa3cases``), then a sample of upstream's tests when --upstream-tests is given."""
    if fa3 is None:
        report.add(Result("flash_attn_3", "flash_attn_interface", "-", "-", SKIPPED, reason=why))
        return
    from attnforge.parity.fa3 import run_case  # optional: torch
    from attnforge.parity.flash_child import run_case_isolated  # optional: torch

    todo = fa3cases.fa3_cases(prof, quick=args.quick)
    log(f"flash_attn_3 {version}: {len(todo)} cases; profile {prof.describe()}")
    for i, c in enumerate(todo):
        for r in run_case_isolated(c, seed=i) if c.expect_error else run_case(fa3, c, seed=i):
            report.add(r)
            _progress(log, r)
    _run_upstream(args, prof, report, log)


def _run_upstream(args: argparse.Namespace, prof: P.WheelProfile, report: Report, log: Any) -> None:
    """A sample of upstream's own tests for the wheel's kernel, when --upstream-tests is given."""
    if not args.upstream_tests:
        return
    log(f"upstream tests: sampling {args.upstream_sample} from {args.upstream_tests}")
    for r in run_upstream(
        prof,
        Path(args.upstream_tests),
        sys.executable,
        args.upstream_sample,
        args.upstream_seed,
        args.upstream_budget_s,
    ):
        report.add(r)
        _progress(log, r)


def wheel_passed(report: Report) -> bool:
    """The wheel's verdict: its own suites (flash_attn or flash_attn_3, hf, the sampled upstream tests) have
    no failure and its kernel suite ran cases."""
    mine = [r for r in report.results if r.suite in WHEEL_SUITES]
    ran = any(r.ok for r in mine if r.suite in ("flash_attn", "flash_attn_3"))
    return not any(r.status == FAILED for r in mine) and ran


def _logger(args: argparse.Namespace) -> Any:
    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, flush=True)

    return log


def _progress(log: Any, r: Result) -> None:
    if r.status == FAILED:
        log(f"FAIL {r.suite} {r.name}: {r.reason}")
    elif r.status == SKIPPED:
        log(f"skip {r.suite} {r.name}: {r.reason}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="attnforge.parity.parity_run", description=__doc__)
    ap.add_argument(
        "--out", default="reports/gpu", help="folder for parity.json / parity.md / parity.junit.xml"
    )
    ap.add_argument("--wheel", help="the wheel's file name, for the report")
    ap.add_argument("--wheel-sha256", help="the wheel's sha256, for the report (what a signed record binds)")
    ap.add_argument(
        "--manifest", help="the wheel's <wheel>.manifest.json (profile source; parity recorded there)"
    )
    ap.add_argument("--matrix", default=os.environ.get("ATTNFORGE_MATRIX"), help="matrix.yaml (profile tags)")
    ap.add_argument("--suites", default=",".join(SUITES), help=f"comma list of {', '.join(SUITES)}")
    ap.add_argument("--quick", action="store_true", help="one head dim per dtype, bf16-only Flex")
    ap.add_argument(
        "--kernel", choices=("flash-attn", "flash-attn-3"), help="the wheel's kernel (default: manifest's)"
    )
    ap.add_argument(
        "--upstream-tests",
        help="upstream's tests to sample: FA3 a source archive or hopper/ folder; FA2 a checkout or archive of "
        "the release's tag, its tests/ folder or tests/test_flash_attn.py itself",
    )
    ap.add_argument("--upstream-sample", type=int, default=120, help="how many upstream tests to run")
    ap.add_argument("--upstream-seed", type=int, default=0, help="the sample's seed")
    ap.add_argument("--upstream-budget-s", type=float, default=300.0, help="time limit of the upstream run")
    ap.add_argument("--record", action="store_true", help="write the outcome into --manifest's parity")
    ap.add_argument("--report-path", help="path recorded as parity.report (default: OUT/parity.json)")
    ap.add_argument("--stem", default="parity", help="report file names: STEM.json, STEM.md, STEM.junit.xml")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--save-results", help="also write every result (all fields) to this JSON file")
    ap.add_argument("--load-results", action="append", help="results saved by an earlier run, merged in")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    report, code = run(args)
    paths = report.write(Path(args.out), args.stem)
    if args.save_results:
        Path(args.save_results).write_text(json.dumps([r.__dict__ for r in report.results], default=str))
    s = report.to_json()
    print(
        f"parity: {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped in "
        f"{time.perf_counter() - t0:.0f} s on {report.device}; {paths['json']}"
    )
    if args.record and args.manifest:
        from attnforge.wheels.manifest import record_parity  # optional: pydantic (--record only)

        record_parity(
            Path(args.manifest),
            wheel_passed(report),
            report.device,
            args.report_path or str(paths["json"]),
            driver=(nvidia_driver() or {}).get("driver"),
        )
        print(f"parity: recorded in {args.manifest}")
    print(json.dumps({"passed": s["passed"], "failed": s["failed"], "skipped": s["skipped"]}))
    return code


if __name__ == "__main__":
    sys.exit(main())
