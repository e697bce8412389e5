"""Run one flash-attn (or FA3) parity case in a child process: ``python -m attnforge.parity.flash_child CASE_JSON SEED``.

Used for the expected-error cases (what the wheel was built without): a wheel that crashes there instead of
raising a clear error must fail that case, not kill the whole parity run. Prints one result line."""

from __future__ import annotations

import faulthandler
import json
import sys

from attnforge.parity.cases import Case

PREFIX = "@@parity-child "


def main(argv: list[str] | None = None) -> int:
    faulthandler.enable()
    args = list(sys.argv[1:] if argv is None else argv)
    d = json.loads(args[0])
    d["window"] = tuple(d["window"])
    case = Case(**d)
    import os

    device = os.environ.get("ATTNFORGE_PARITY_DEVICE", "cuda")
    seed = int(args[1]) if len(args) > 1 else 0
    if case.impl == "fa3":
        import flash_attn_interface

        from attnforge.parity.fa3 import run_case as run_fa3

        results = run_fa3(flash_attn_interface, case, device=device, seed=seed)
    else:
        import flash_attn

        from attnforge.parity.flash import run_case

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
