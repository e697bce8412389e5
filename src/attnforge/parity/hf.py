"""A real client: Hugging Face transformers with ``attn_implementation="flash_attention_2"`` vs ``"sdpa"``.

A small randomly initialised Llama-style decoder (no weights downloaded), head dim and dtype taken from the
wheel's profile, a padded batch (so the varlen path runs): logits and one backward step of each are compared
with an fp32 eager model holding the same weights. FA2's error must stay within 2x (logits) / 3x (grads)
of SDPA's."""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch

from .profile import WheelProfile
from .report import FAILED, PASSED, SKIPPED, Result
from .tolerance import BWD_FACTOR, FWD_FACTOR, Check, max_abs_err

SUITE = "hf"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _model(cfg: Any, impl: str, state: dict[str, Any], dtype: torch.dtype, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    m.load_state_dict(state)
    return m.to(device=device, dtype=dtype).train()


def run(profile: WheelProfile, device: str = "cuda") -> list[Result]:
    """Logits and gradients of FA2 vs SDPA vs fp32 eager; skips with a reason when transformers is absent."""
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
    cfg = LlamaConfig(vocab_size=1024, hidden_size=heads * d, intermediate_size=2 * heads * d,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=d, max_position_embeddings=1024)  # fmt: skip
    shape = (
        f"llama L{layers} b{batch} s{seq} h{heads}/{kv_heads} d{d} (transformers {transformers.__version__})"
    )
    t0 = time.perf_counter()
    try:
        torch.manual_seed(0)
        from transformers import AutoModelForCausalLM

        state = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").state_dict()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
        mask = torch.ones(batch, seq, dtype=torch.long, device=device)
        mask[1, :40] = 0  # left padding in one row: the varlen path
        mask[2, :3] = 0
        labels = ids.masked_fill(mask == 0, -100)
        outs: dict[str, dict[str, Any]] = {}
        for impl, dt in (
            ("eager", torch.float32),
            ("sdpa", DTYPES[dt_name]),
            ("flash_attention_2", DTYPES[dt_name]),
        ):
            m = _model(cfg, impl, state, dt, device)
            res = m(input_ids=ids, attention_mask=mask, labels=labels)
            entry: dict[str, Any] = {"logits": res.logits.detach().float(), "loss": float(res.loss)}
            if profile.backward or impl != "flash_attention_2":
                res.loss.backward()
                entry["grads"] = {n: p.grad.detach().float() for n, p in m.named_parameters()
                                  if p.grad is not None and ("q_proj" in n or "embed" in n)}  # fmt: skip
            outs[impl] = entry
            del m
    except Exception as exc:
        msg = str(exc).strip().splitlines()
        return [Result(SUITE, "transformers[flash_attention_2]", dt_name, shape, FAILED,
                       reason=f"{type(exc).__name__}: {msg[0] if msg else ''}",
                       details={"traceback": traceback.format_exc(limit=5)})]  # fmt: skip
    valid = (mask == 1).view(batch, seq, 1)
    ref, sd, fa = outs["eager"], outs["sdpa"], outs["flash_attention_2"]
    lg = Check(
        "logits",
        max_abs_err(fa["logits"] * valid, ref["logits"] * valid),
        max_abs_err(sd["logits"] * valid, ref["logits"] * valid),
        1e-3,
        FWD_FACTOR,
    )
    seconds = time.perf_counter() - t0
    results = [_res("transformers[flash_attention_2 vs sdpa]:logits", dt_name, shape, [lg], seconds,
                    {"loss": {k: v["loss"] for k, v in outs.items()}})]  # fmt: skip
    if "grads" not in fa:
        results.append(Result(SUITE, "transformers[flash_attention_2 vs sdpa]:backward", dt_name, shape, SKIPPED,
                              reason=f"profile '{profile.name}' was built without backward"))  # fmt: skip
        return results
    checks = [
        Check(n, max_abs_err(fa["grads"][n], ref["grads"][n]), max_abs_err(sd["grads"][n], ref["grads"][n]),
              1e-4, BWD_FACTOR)
        for n in sorted(ref["grads"])
    ]  # fmt: skip
    results.append(_res("transformers[flash_attention_2 vs sdpa]:backward", dt_name, shape, checks, 0.0, {}))
    return results


def _res(
    kernel: str, dt: str, shape: str, checks: list[Check], seconds: float, notes: dict[str, Any]
) -> Result:
    w = max(checks, key=lambda c: (not c.ok, c.ratio))
    ok = all(c.ok for c in checks)
    return Result(SUITE, kernel, dt, shape, PASSED if ok else FAILED, max_err=w.max_err, ratio_vs_torch=w.ratio,
                  seconds=seconds, reason="" if ok else f"{w.name}: FA2 err {w.max_err:.3g} vs SDPA {w.torch_err:.3g}",
                  details={"worst": w.name, "sdpa_err": w.torch_err} | notes)  # fmt: skip
