"""The optional smoke run: install a flash-attn (or flash-attn-3) wheel into a fresh venv that reuses the
machine's torch (`--system-site-packages`) and compare one small flash_attn_func forward with torch SDPA on
every GPU.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnforge.core.kernels import KERNELS, facts, modules
from attnforge.runner.host import Host

PREFIX = "@@attnforge-runner-smoke "

# `--system-site-packages` reaches the *base* interpreter's packages only: when the machine's torch lives
# in a venv (e.g. /opt/torch/.venv), a .pth file in the new venv chains that venv's site-packages too.
LINK_SCRIPT = (
    "import site, sys; "
    "open(site.getsitepackages()[0] + '/_attnforge_base.pth', 'w').write('\\n'.join(sys.argv[1:]) + '\\n')"
)

# Runs inside the venv: standard library + torch + the kernel only (@DIST@ / @API@ become its distribution and
# API module: flash_attn, or flash_attn_3 with flash_attn_interface; see `script_for`).
SMOKE_SCRIPT = r"""
import importlib, json, sys, time
from importlib import metadata
DIST = "@DIST@"
API = "@API@"
out = {"devices": [], "error": None}
def done():
    print("@@attnforge-runner-smoke " + json.dumps(out), flush=True)
    sys.exit(0)
try:
    import torch
    import torch.nn.functional as F
    out["torch"] = torch.__version__
    reqs = [r for r in (metadata.requires(DIST) or []) if r.replace(" ", "").lower().startswith("torch")]
    out["torch_requirement"] = reqs[0] if reqs else None
    api = importlib.import_module(API)
    flash_attn_func = getattr(api, "flash_attn_func", None)
    if flash_attn_func is None:  # say which file was imported, as `from API import flash_attn_func` would
        raise ImportError("cannot import name 'flash_attn_func' from %r (%s)" % (API, api.__file__))
    out["flash_attn"] = metadata.version(DIST)
except Exception as exc:
    out["error"] = "import: %s: %s" % (type(exc).__name__, exc)
    done()
record = {}
try:
    record = json.loads(metadata.distribution(DIST).read_text("attnforge_build.json") or "{}")
except Exception:
    pass
# a wheel that was never finalized has no record: the manifest beside it (passed as argv[1]) says the same
inputs = record.get("inputs") or (json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
head_dims = inputs.get("head_dims") or [128]
hdim = 128 if 128 in head_dims else int(head_dims[0])
dtypes = inputs.get("dtypes") or ["bf16"]
dtype = torch.bfloat16 if "bf16" in dtypes else torch.float16
out["shape"] = {"batch": 2, "seqlen": 256, "heads": 4, "head_dim": hdim, "dtype": str(dtype), "causal": True}
for i in range(torch.cuda.device_count()):
    row = {"index": i, "name": torch.cuda.get_device_name(i), "passed": False}
    try:
        dev = torch.device("cuda", i)
        gen = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(2, 256, 4, hdim, device=dev, dtype=dtype, generator=gen) for _ in range(3))
        t0 = time.perf_counter()
        got = flash_attn_func(q, k, v, causal=True)
        torch.cuda.synchronize(dev)
        row["seconds"] = round(time.perf_counter() - t0, 4)
        ref = F.scaled_dot_product_attention(
            q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(), is_causal=True
        ).transpose(1, 2)
        err = (got.float() - ref).abs().max().item()
        row["max_abs_err"] = err
        row["tolerance"] = 2e-2
        row["passed"] = bool(torch.isfinite(got).all().item()) and err <= 2e-2
    except Exception as exc:
        row["error"] = "%s: %s" % (type(exc).__name__, str(exc)[:500])
    out["devices"].append(row)
if not out["devices"]:
    out["error"] = "torch sees no GPU (torch.cuda.device_count() == 0)"
done()
"""


@dataclass
class SmokeResult:
    """`passed`/`failed` count GPUs; `ran` is False when no smoke run was asked for or it could not start."""

    passed: int = 0
    failed: int = 0
    ran: bool = False
    source: str = ""
    detail: str = "not asked for (--smoke-wheel PATH or --smoke-index URL)"
    results: list[dict[str, Any]] = field(default_factory=list)
    output: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failed": self.failed,
            "ran": self.ran,
            "source": self.source,
            "detail": self.detail,
            "results": self.results,
            "torch": self.output.get("torch"),
            "flash_attn": self.output.get("flash_attn"),
            "torch_requirement": self.output.get("torch_requirement"),
            "shape": self.output.get("shape"),
        }


def parse_smoke_output(stdout: str) -> dict[str, Any] | None:
    """The JSON the script printed on its marker line (None when absent)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PREFIX):
            data: dict[str, Any] = json.loads(line[len(PREFIX) :])
            return data
    return None


def summarize(data: dict[str, Any], source: str) -> SmokeResult:
    """Count GPUs that passed and failed; an import error fails every GPU (at least one)."""
    devices = list(data.get("devices") or [])
    res = SmokeResult(ran=True, source=source, results=devices, output=data)
    if data.get("error") and not devices:
        res.failed = 1
        req = data.get("torch_requirement")
        res.detail = str(data["error"]) + (
            f" (wheel requires {req}, torch here {data.get('torch')})" if req else ""
        )
        return res
    res.passed = sum(1 for d in devices if d.get("passed"))
    res.failed = len(devices) - res.passed
    parts = []
    for d in devices:
        what = f"max |err| {d['max_abs_err']:.2e}" if "max_abs_err" in d else d.get("error", "failed")
        parts.append(f"GPU{d['index']} {'ok' if d.get('passed') else 'FAILED'} ({what})")
    res.detail = f"flash_attn {data.get('flash_attn')} vs SDPA: " + "; ".join(parts)
    return res


def profile_hint(wheel: Path | None) -> dict[str, Any]:
    """Head dims and dtypes from the manifest beside ``wheel`` (``<wheel>.manifest.json``), when there is one."""
    if wheel is None:
        return {}
    try:
        data = json.loads(Path(str(wheel) + ".manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    inputs = data.get("inputs") or {}
    return {k: inputs[k] for k in ("head_dims", "dtypes") if inputs.get(k)}


def kernel_of_wheel(wheel: Path) -> str:
    """flash_attn_3-3.0.0+...whl -> flash-attn-3 (a file of no known kernel: flash-attn)."""
    dist = wheel.name.split("-")[0]
    return next((k for k in KERNELS if facts(k)["dist"] == dist), "flash-attn")


def script_for(kernel: str) -> str:
    """The smoke script for a kernel (its distribution and API module from kernels.json)."""
    mods = modules(kernel)
    return SMOKE_SCRIPT.replace("@DIST@", mods["dist"]).replace("@API@", mods["api"])


def run_smoke(
    host: Host,
    python: str,
    *,
    wheel: Path | None = None,
    index_url: str | None = None,
    workdir: Path | None = None,
    base_site: list[str] | None = None,
    timeout: float = 900.0,
    kernel: str = "flash-attn",
) -> SmokeResult:
    """Install the wheel (or `kernel`, flash-attn by default, from the index) into a fresh venv and run the
    script.

    `base_site`: site-packages folders of the interpreter that has torch (chained with a .pth file).
    """
    source = str(wheel) if wheel else f"{kernel} from {index_url}"
    tmp = Path(tempfile.mkdtemp(prefix="attnforge-smoke-", dir=workdir))
    try:
        venv = tmp / "venv"
        made = host.run([python, "-m", "venv", "--system-site-packages", str(venv)], timeout=300)
        if not made.ok:
            return SmokeResult(ran=False, failed=1, source=source, detail=f"venv: {made.reason()}")
        vpy = str(venv / "bin" / "python")
        if base_site:
            linked = host.run([vpy, "-c", LINK_SCRIPT, *base_site], timeout=60)
            if not linked.ok:
                return SmokeResult(ran=False, failed=1, source=source, detail=f"venv link: {linked.reason()}")
        pip = [vpy, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--quiet"]
        what = [str(wheel)] if wheel else ["--index-url", str(index_url), kernel]
        installed = host.run([*pip, *what], timeout=600)
        if not installed.ok:
            return SmokeResult(
                ran=False, failed=1, source=source, detail=f"pip install: {installed.reason()}"
            )
        hint = profile_hint(wheel)
        script = script_for(kernel_of_wheel(wheel) if wheel else kernel)
        res = host.run([vpy, "-c", script, *([json.dumps(hint)] if hint else [])], timeout=timeout)
        data = parse_smoke_output(res.stdout)
        if data is None:
            return SmokeResult(ran=True, failed=1, source=source, detail=f"smoke script: {res.reason()}")
        return summarize(data, source)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
