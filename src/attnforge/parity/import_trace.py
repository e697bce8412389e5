"""The CPU import/trace check of a stable-ABI FA2 wheel under a torch it was not built against, no GPU needed:
in an interpreter where that torch and the wheel are installed, import `flash_attn` and its extension, find
its ops registered under `torch.ops.flash_attn_stable`, and trace `flash_attn_func` forward and backward on
meta tensors through the registered fakes. The outcome is a `TorchCheck` of kind `cpu-import-trace`."""

from __future__ import annotations

import datetime
import json
import subprocess

from attnforge.core.errors import EnvironmentProblem
from attnforge.wheels.torch_checks import TorchCheck

OPS = ("fwd", "varlen_fwd", "bwd", "varlen_bwd", "fwd_kvcache")
PROBE = """
import json, sys, torch, flash_attn, flash_attn_2_cuda
ops = sorted(n for n in OPS if hasattr(torch.ops.flash_attn_stable, n))
q = torch.empty(2, 128, 8, 128, device="meta", dtype=torch.bfloat16, requires_grad=True)
out = flash_attn.flash_attn_func(q, q, q, causal=True)
out.sum().backward()
print(json.dumps({"torch": torch.__version__, "python": "%d.%d" % sys.version_info[:2],
                  "flash_attn": flash_attn.__version__, "ops": ops, "meta_out": list(out.shape),
                  "meta_grad": list(q.grad.shape), "extension": flash_attn_2_cuda.__file__.rsplit("/", 1)[-1]}))
""".replace("OPS", repr(OPS))


def import_trace(python: str, timeout: float = 600) -> TorchCheck:
    """Run the check in interpreter `python`; a failed import or trace is a check that did not pass."""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        proc = subprocess.run(
            [python, "-c", PROBE], capture_output=True, text=True, timeout=timeout, check=False, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentProblem(f"cannot run {python}: {exc}") from None
    if proc.returncode != 0:
        version = _torch_version(python)
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return TorchCheck(version, "?", "cpu-import-trace", False, date, {"error": tail})
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    passed = got["ops"] == sorted(OPS) and got["meta_out"] == got["meta_grad"] == [2, 128, 8, 128]
    return TorchCheck(got.pop("torch"), got.pop("python"), "cpu-import-trace", passed, date, got)


def _torch_version(python: str) -> str:
    proc = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise EnvironmentProblem(
            f"{python}: torch does not import ({(proc.stderr.strip().splitlines() or ['?'])[-1]})"
        )
    return proc.stdout.strip()
