"""Run one flash-attn (or FA3) parity case in a child process (`run_case_isolated` launches it): ``python -m attnforge.parity.flash_child CASE_JSON SEED``.

Used for the expected-error cases (what the wheel was built without): a wheel that crashes there instead of
raising a clear error must fail that case, not kill the whole parity run. Prints one result line."""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from attnforge.parity.cases import Case
from attnforge.parity.fa3 import run_case as run_fa3
from attnforge.parity.flash import run_case
from attnforge.parity.flash_tensors import SUITE
from attnforge.parity.parity_report import FAILED, Result

PREFIX = "@@parity-child "


def run_case_isolated(
    c: Case, seed: int = 0, python: str | None = None, timeout_s: float = 300
) -> list[Result]:
    """``run_case`` in a child process (``attnforge.parity.flash_child``): a crash fails this case only."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    cmd = [
        python or sys.executable,
        "-m",
        "attnforge.parity.flash_child",
        json.dumps(dataclasses.asdict(c)),
        str(seed),
    ]
    suite = "flash_attn_3" if c.impl == "fa3" else SUITE
    name = (
        c.kernel_name
        + (":bwd" if c.expect_error_in == "bwd" else ":fwd")
        + (":expect-error" if c.expect_error else "")
    )
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return [Result(suite, name, c.dtype, c.shape, FAILED, reason=f"hung for more than {timeout_s:.0f} s")]
    dt = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith(PREFIX):
            return [Result(**r, seconds=dt) for r in json.loads(line[len(PREFIX) :])]
    if p.returncode < 0:
        try:
            sig = signal.Signals(-p.returncode).name
        except ValueError:
            sig = f"signal {-p.returncode}"
        what = "instead of raising a clear error" if c.expect_error else ""
        return [
            Result(
                suite,
                name,
                c.dtype,
                c.shape,
                FAILED,
                seconds=dt,
                reason=f"the process died with {sig} {what}".strip(),
                details={"stderr_tail": p.stderr[-2000:]},
            )
        ]
    return [
        Result(
            suite,
            name,
            c.dtype,
            c.shape,
            FAILED,
            seconds=dt,
            reason=f"child exited {p.returncode} without a result",
            details={"stderr_tail": p.stderr[-2000:]},
        )
    ]


def main(argv: list[str] | None = None) -> int:
    faulthandler.enable()
    args = list(sys.argv[1:] if argv is None else argv)
    d = json.loads(args[0])
    d["window"] = tuple(d["window"])
    case = Case(**d)
    device = os.environ.get("ATTNFORGE_PARITY_DEVICE", "cuda")
    seed = int(args[1]) if len(args) > 1 else 0
    # the child imports only the kernel its case runs (the other may not be installed)
    if case.impl == "fa3":
        import flash_attn_interface

        results = run_fa3(flash_attn_interface, case, device=device, seed=seed)
    else:
        import flash_attn

        results = run_case(flash_attn, case, device=device, seed=seed)
    out = []
    for r in results:
        out.append(
            {
                "suite": r.suite,
                "kernel": r.kernel,
                "dtype": r.dtype,
                "shape": r.shape,
                "status": r.status,
                "max_err": r.max_err,
                "ratio_vs_torch": r.ratio_vs_torch,
                "reason": r.reason,
                "details": r.details,
            }
        )
    print(PREFIX + json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
