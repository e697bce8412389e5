"""A real client: Hugging Face transformers with ``attn_implementation="flash_attention_2"``, ``"sdpa"``, ``"eager"``.

A small randomly initialised Llama-style decoder (no weights downloaded), head dim and dtype taken from the
wheel's profile, a padded batch (so the varlen path runs): logits and one backward step of each are compared
with an fp32 eager model holding the same weights. FA2's error must stay within 2x of the low-precision eager
model's for the logits (max |err|) and 3x for the gradients (relative L2 error of each compared parameter's
gradient); SDPA's errors are recorded beside them."""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch

from attnforge.parity.parity_report import FAILED, PASSED, SKIPPED, Result
from attnforge.parity.profile import WheelProfile
from attnforge.parity.tolerance import BWD_FACTOR, FWD_FACTOR, Check, max_abs_err, rel_l2_err

SUITE = "hf"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# The baseline is PyTorch's own low-precision attention, as upstream's rule has it: transformers' "eager"
# implementation in the same dtype (matmuls in bf16/fp16, like upstream's attention_ref without upcast).
# SDPA is run and recorded beside it; its math path may compute in fp32 inside and is no such baseline.
CASE = "transformers[flash_attention_2 vs eager]"
REL_EPS = 1e-3  # relative: below bf16's own rounding (2**-8), so only a tie-breaker


def padded_batch(vocab: int, batch: int, seq: int, device: str) -> tuple[torch.Tensor, ...]:
    """(input_ids, attention_mask, labels) with left padding in rows 1 and 2 (the varlen path).

    Labels are -100 at padded positions and at the first real token of a padded row: the causal-LM loss
    shifts by one, so that token is predicted from a padded position, whose output each attention
    implementation defines differently (eager attends everywhere, FA2 returns zeros). Counting it made
    fp32 SDPA and fp32 eager disagree by 8% on the embedding gradient (0.8e-6 without it)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    mask[1, :40] = 0
    mask[2, :3] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[torch.arange(batch, device=device), mask.argmax(dim=1)] = -100
    return ids, mask, labels


def _model(cfg: Any, impl: str, state: dict[str, Any], dtype: torch.dtype, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)  # type: ignore[no-untyped-call,unused-ignore]
    m.load_state_dict(state)
    return m.to(device=device, dtype=dtype).train()


def run(profile: WheelProfile, device: str = "cuda") -> list[Result]:
    """Logits and gradients of FA2, SDPA and low-precision eager vs fp32 eager; skips without transformers."""
    shape = "-"
    try:
        import transformers
        from transformers import LlamaConfig
    except Exception as exc:
        return [
            Result(SUITE, "transformers", "-", shape, SKIPPED, reason=f"transformers not importable: {exc}")
        ]
    d = 128 if 128 in profile.head_dims else profile.head_dims[0]
    dt_name = "bf16" if "bf16" in profile.dtypes else profile.dtypes[0]
    heads, kv_heads, layers, seq, batch = 8, 2, 2, 257, 3
    cfg = LlamaConfig(
        vocab_size=1024,
        hidden_size=heads * d,
        intermediate_size=2 * heads * d,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=d,
        max_position_embeddings=1024,
    )
    shape = (
        f"llama L{layers} b{batch} s{seq} h{heads}/{kv_heads} d{d} (transformers {transformers.__version__})"
    )
    t0 = time.perf_counter()
    try:
        torch.manual_seed(0)
        from transformers import AutoModelForCausalLM

        state = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").state_dict()  # type: ignore[no-untyped-call,unused-ignore]
        ids, mask, labels = padded_batch(cfg.vocab_size, batch, seq, device)
        outs: dict[str, dict[str, Any]] = {}
        for key, impl, dt in (
            ("fp32", "eager", torch.float32),
            ("eager", "eager", DTYPES[dt_name]),
            ("sdpa", "sdpa", DTYPES[dt_name]),
            ("flash_attention_2", "flash_attention_2", DTYPES[dt_name]),
        ):
            m = _model(cfg, impl, state, dt, device)
            res = m(input_ids=ids, attention_mask=mask, labels=labels)
            entry: dict[str, Any] = {"logits": res.logits.detach().float(), "loss": float(res.loss)}
            if profile.backward or impl != "flash_attention_2":
                res.loss.backward()
                entry["grads"] = {
                    n: p.grad.detach().float()
                    for n, p in m.named_parameters()
                    if p.grad is not None and ("q_proj" in n or "embed" in n)
                }
            outs[key] = entry
            del m
    except Exception as exc:
        msg = str(exc).strip().splitlines()
        return [
            Result(
                SUITE,
                "transformers[flash_attention_2]",
                dt_name,
                shape,
                FAILED,
                reason=f"{type(exc).__name__}: {msg[0] if msg else ''}",
                details={"traceback": traceback.format_exc(limit=5)},
            )
        ]
    valid = (mask == 1).view(batch, seq, 1)
    ref, lp, sd, fa = outs["fp32"], outs["eager"], outs["sdpa"], outs["flash_attention_2"]
    lg = Check(
        "logits",
        max_abs_err(fa["logits"] * valid, ref["logits"] * valid),
        max_abs_err(lp["logits"] * valid, ref["logits"] * valid),
        1e-3,
        FWD_FACTOR,
    )
    seconds = time.perf_counter() - t0
    notes = {
        "loss": {k: v["loss"] for k, v in outs.items()},
        "sdpa_logits_err": max_abs_err(sd["logits"] * valid, ref["logits"] * valid),
    }
    results = [_res(f"{CASE}:logits", dt_name, shape, [lg], seconds, notes)]
    if "grads" not in fa:
        results.append(
            Result(
                SUITE,
                f"{CASE}:backward",
                dt_name,
                shape,
                SKIPPED,
                reason=f"profile '{profile.name}' was built without backward",
            )
        )
        return results
    # Gradients of whole parameters (embedding rows sum many positions' contributions through both layers):
    # judged on the relative L2 error, with upstream's gradient factor; max |err| is recorded beside it.
    checks = [
        Check(
            n,
            rel_l2_err(fa["grads"][n], ref["grads"][n]),
            rel_l2_err(lp["grads"][n], ref["grads"][n]),
            REL_EPS,
            BWD_FACTOR,
        )
        for n in sorted(ref["grads"])
    ]
    per_param = {
        n: {
            impl: {
                "rel_l2": rel_l2_err(o["grads"][n], ref["grads"][n]),
                "max_abs": max_abs_err(o["grads"][n], ref["grads"][n]),
            }
            for impl, o in (("flash_attention_2", fa), ("eager", lp), ("sdpa", sd))
        }
        for n in sorted(ref["grads"])
    }
    results.append(
        _res(
            f"{CASE}:backward",
            dt_name,
            shape,
            checks,
            0.0,
            {"metric": "relative L2 error vs the fp32 eager model", "grads": per_param},
        )
    )
    return results


def _res(
    kernel: str, dt: str, shape: str, checks: list[Check], seconds: float, notes: dict[str, Any]
) -> Result:
    w = max(checks, key=lambda c: (not c.ok, c.ratio))
    ok = all(c.ok for c in checks)
    return Result(
        SUITE,
        kernel,
        dt,
        shape,
        PASSED if ok else FAILED,
        max_err=w.max_err,
        ratio_vs_torch=w.ratio,
        seconds=seconds,
        reason="" if ok else f"{w.name}: FA2 err {w.max_err:.3g} vs eager {w.torch_err:.3g}",
        details={"worst": w.name, "eager_err": w.torch_err} | notes,
    )
