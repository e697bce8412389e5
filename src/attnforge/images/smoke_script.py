"""Smoke test run *inside* an attnforge image: `python /opt/attnforge/smoke.py --expect JSON`.

Standard library and torch only (it must not import attnforge). Checks, in order: torch imports and is the
expected build; the kernel package and its compiled extension import (flash_attn and `flash_attn_2_cuda`;
FA3: flash_attn_3, `flash_attn_3._C` and `flash_attn_interface`, from --expect's dist/extension/api); the arch list from the wheel's
build record (or the image's manifest copy); a CPU-side call into the extension; `pip check` for
flash-attn; NGC policy (bundled flash-attn replaced or kept); the Flex cache folder; and GPU parity
against SDPA only when a GPU is visible. The last line is `@@attnforge-smoke {json}`; exit 0 when all pass.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import traceback
from importlib import metadata
from typing import Any

MANIFEST_COPY = "/opt/attnforge/manifest.json"
PREFIX = "@@attnforge-smoke "


def build_record(dist: str = "flash_attn") -> dict[str, Any]:
    """The wheel's attnforge_build.json (dist-info), else the manifest copied into the image."""
    try:
        text = metadata.distribution(dist).read_text("attnforge_build.json")
    except metadata.PackageNotFoundError:
        text = None
    if text:
        data: dict[str, Any] = json.loads(text)
        data["_from"] = "dist-info/attnforge_build.json"
        return data
    if os.path.exists(MANIFEST_COPY):
        with open(MANIFEST_COPY, encoding="utf-8") as fh:
            data = json.load(fh)
        data["_from"] = MANIFEST_COPY
        return data
    return {"_from": "none"}


def arch_fits(gpu: str, arches: list[str]) -> bool:
    """SASS for sm_XY runs on the same major with an equal or higher minor ('a'/'f' arches: exact only)."""
    if gpu in arches or any(a[:-1] == gpu for a in arches if a.endswith(("a", "f"))):
        return True
    g = int(gpu[3:])
    for a in arches:
        if not a.startswith("sm_") or not a[3:].isdigit():
            continue
        b = int(a[3:])
        if b // 10 == g // 10 and b <= g:
            return True
    return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect", default="{}", help="JSON: torch, flash_attn, policy, bundled, kind")
    args = ap.parse_args()
    expect: dict[str, Any] = json.loads(args.expect)
    report: dict[str, Any] = {"checks": {}, "ok": False}
    checks: dict[str, str] = report["checks"]
    failures: list[str] = []

    def fail(name: str, why: str) -> None:
        checks[name] = "FAIL: " + why
        failures.append(f"{name}: {why}")
        print(f"FAIL {name}: {why}", flush=True)

    def ok(name: str, what: str) -> None:
        checks[name] = "ok: " + what
        print(f"ok   {name}: {what}", flush=True)

    # torch
    try:
        import torch

        report["torch"] = torch.__version__
        want = expect.get("torch")
        if want and torch.__version__ != want:
            fail("torch", f"torch {torch.__version__}, the image promises {want}")
        else:
            ok("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    except Exception as exc:
        fail("torch", f"import torch: {exc!r}")
        print(PREFIX + json.dumps(report), flush=True)
        return 1

    # flash_attn + the compiled extension
    ext: Any = None
    dist = str(expect.get("dist") or "flash_attn")
    ext_name = str(expect.get("extension") or "flash_attn_2_cuda")
    api_name = str(expect.get("api") or "flash_attn")
    try:
        api = importlib.import_module(api_name)
        dist_version = metadata.version(dist)
        report["flash_attn"] = dist_version
        want = expect.get("flash_attn")
        if want and dist_version.lower() != want.lower():  # local versions compare case-insensitively
            fail(dist, f"installed {dist_version}, expected {want}")
        else:
            ok(dist, f"{dist_version} ({os.path.dirname(api.__file__ or '')})")
        ext = importlib.import_module(ext_name)
        where = getattr(ext, "__file__", "") or ""
        report["extension"] = where
        if getattr(ext, "STANDIN", False) and expect.get("policy") == "keep":
            ok(ext_name, f"{where}: the NGC stand-in's stub (NGC's own is compiled)")
        elif not where.endswith(".so"):
            fail(ext_name, f"{where} is not a compiled extension")
        else:
            ok(ext_name, where)
    except Exception as exc:
        fail("import", f"{exc!r}")

    # arch list from the wheel's manifest
    record = build_record(dist)
    arches = list((record.get("inputs") or {}).get("arches") or [])
    report["arches"] = arches
    if arches:
        ok("arches", f"{','.join(arches)} (from {record['_from']})")
    elif expect.get("policy") == "keep":
        ok("arches", "NGC's bundled flash-attn: no attnforge build record (arch list unknown)")
    else:
        fail("arches", "no arch list in the wheel's build record nor in " + MANIFEST_COPY)

    # a CPU-side check through the extension
    if ext is not None:
        try:
            if getattr(ext, "STANDIN", False) and expect.get("policy") == "keep":
                ok("cpu", "the NGC stand-in's bundled flash-attn is a fake: no kernel to call")
            elif hasattr(ext, "add_one"):  # attnforge's small test fixture shaped like flash-attn
                y = ext.add_one(torch.zeros(4))
                if not torch.equal(y, torch.ones(4)):
                    raise RuntimeError(f"add_one gave {y}")
                ok("cpu", "add_one(zeros(4)) == ones(4) through the extension")
            else:
                flash_attn_func = importlib.import_module(api_name).flash_attn_func
                q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
                try:
                    flash_attn_func(q, q, q)
                    ok("cpu", "flash_attn_func ran on CPU tensors")
                except RuntimeError as exc:
                    ok("cpu", f"the extension's own input check answered: {str(exc).splitlines()[0][:120]}")
        except Exception as exc:
            fail("cpu", repr(exc))

    # pip check (only problems that name flash-attn fail the smoke test)
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    ours = [ln for ln in lines if "flash-attn" in ln.lower() or "flash_attn" in ln.lower()]
    if ours:
        fail("pip-check", "; ".join(ours))
    else:
        ok(
            "pip-check",
            "no problem names flash-attn" + (f" ({len(lines)} other lines)" if proc.returncode else ""),
        )

    # NGC: what happened to the bundled flash-attn and the constraint file
    policy = expect.get("policy")
    if policy:
        constraint = os.environ.get("PIP_CONSTRAINT", "") or "/etc/pip/constraint.txt"
        pins = []
        if os.path.exists(constraint):
            with open(constraint, encoding="utf-8") as fh:
                pins = [ln.strip() for ln in fh if ln.lower().replace("_", "-").startswith("flash-attn")]
        report["constraint_pins"] = pins
        if policy == "replace":
            want_pin = f"flash-attn=={expect.get('flash_attn')}"
            if [p.lower() for p in pins] != [want_pin.lower()]:
                fail("ngc-policy", f"constraint {constraint} pins {pins}, expected [{want_pin}]")
            else:
                ok(
                    "ngc-policy",
                    f"bundled flash-attn {expect.get('bundled')} replaced; {constraint} pins ours",
                )
        elif policy == "keep":
            if str(report.get("flash_attn")).lower() != str(expect.get("bundled")).lower():
                fail("ngc-policy", f"kept policy but flash-attn is {report.get('flash_attn')}")
            else:
                ok("ngc-policy", f"NGC's bundled flash-attn {expect.get('bundled')} kept and imports")

    # Flex kernel caches: the attnforge-flex-kernels wheel (loaded on a GPU only) and the Inductor cache folder
    try:
        report["flex"] = metadata.version("attnforge-flex-kernels")
        import attnforge_flex  # noqa: F401  (never imports torch, never raises)

        ok("flex", f"attnforge-flex-kernels {report['flex']} installed")
    except metadata.PackageNotFoundError:
        report["flex"] = None
    except Exception as exc:
        fail("flex", f"import attnforge_flex: {exc!r}")
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache:
        entries = sum(len(files) for _, _, files in os.walk(cache)) if os.path.isdir(cache) else 0
        report["flex_cache_files"] = entries
        ok("flex-cache", f"TORCHINDUCTOR_CACHE_DIR={cache} ({entries} files)")

    # GPU parity, only where a GPU is present
    if torch.cuda.is_available() and ext is not None:
        try:
            cap = torch.cuda.get_device_capability()
            gpu = f"sm_{cap[0]}{cap[1]}"
            report["gpu"] = f"{torch.cuda.get_device_name()} ({gpu})"
            if arches and not arch_fits(gpu, arches):
                fail("gpu", f"{gpu} is not among the image's arches {arches}")
            elif hasattr(ext, "add_one"):
                y = ext.add_one(torch.zeros(4, device="cuda"))
                if y.cpu().tolist() != [1.0] * 4:
                    raise RuntimeError(f"add_one on CUDA gave {y}")
                ok("gpu", f"add_one on {report['gpu']}")
            else:
                flash_attn_func = importlib.import_module(api_name).flash_attn_func
                torch.manual_seed(0)
                q, k, v = (torch.randn(2, 256, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                out = flash_attn_func(q, k, v, causal=True)
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
                ).transpose(1, 2)
                err = (out.float() - ref.float()).abs().max().item()
                if err > 2e-2:
                    fail("gpu", f"max |flash - sdpa| = {err:.3g} on {report['gpu']}")
                else:
                    ok("gpu", f"parity with SDPA, max abs diff {err:.3g} on {report['gpu']}")
        except Exception as exc:
            fail("gpu", "".join(traceback.format_exception_only(type(exc), exc)).strip())
    else:
        report["gpu"] = "no GPU"
        ok("gpu", "no GPU visible: parity not run")

    report["ok"] = not failures
    report["failures"] = failures
    print(PREFIX + json.dumps(report, sort_keys=True), flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
