"""One timed first step of a FlexAttention client, in this (fresh) process; run by benchmarks/flex_clients.py.

    python benchmarks/flex_clients_child.py --client transformers|diffusers|torch \\
        --mode cold|warm|megacache|dropin --shape '{"batch": 2, "seq_len": 512, ...}' --device cuda \\
        [--train] [--steady N] [--save FILE.pt] [--artifacts DIR] [--cache-key-log FILE] [--profile FILE]

Clients (each model randomly initialised from a config built here, seeded, no download):
  transformers  a small Llama decoder with attn_implementation="flex_attention"; a training step is
                forward with labels + loss.backward() (--train), else a forward under no_grad
  diffusers     a small Flux transformer with set_attention_backend("flex"); a forward under no_grad
  torch         a plain script: q, k, v -> flex(q, k, v, block_mask=causal) (+ backward with --train)
Modes:
  cold       the client's own compile (transformers and torch: no attnforge at all; diffusers: attnforge's
             flex backend over an empty artifacts folder = torch.compile(flex_attention))
  warm       ``attnforge_flex.enable([client])`` (the installed wheel, or --artifacts), then the same code
  megacache  torch only: ``attnforge_flex.load()`` then the unchanged script (the Mega-Cache, zero lines)
  dropin     torch only: ``flex = attnforge_flex.flex_attention`` after ``enable(["torch"])`` (one line)
The first step is timed from just before ``enable``/``load`` (or the first call) to the synchronised end of
the step; imports, model construction, inputs and the script's block mask (``mask_s``) are not in it. Prints one JSON line: first_step_s,
steady_step_s (median of --steady more steps), used (what attnforge_flex.stats() says ran), counters.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple


class Client(NamedTuple):
    """A client's step, what of its output is saved, what runs before the first step (timed), set-up facts."""

    step: Any
    saved: Any
    prepare: Any = None
    info: dict[str, Any] | None = None


def _sync(dev: str) -> None:
    import torch

    if dev == "cuda":
        torch.cuda.synchronize()


def _enable(client: str, artifacts: str | None) -> None:
    import attnforge_flex

    attnforge_flex.enable([client], artifacts=artifacts)


def transformers_step(a: argparse.Namespace, shape: dict[str, Any]) -> Client:
    """The Llama decoder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dt = torch.bfloat16
    cfg = LlamaConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        intermediate_size=2 * shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads_q"],
        num_key_value_heads=shape["heads_kv"],
        max_position_embeddings=8192,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(a.device, dt)
    model.set_attn_implementation("flex_attention")
    model.train(a.train)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq_len"]), generator=g).to(a.device)
    layer0 = model.model.layers[0].self_attn.q_proj.weight

    def step() -> Any:
        if not a.train:
            with torch.no_grad():
                return model(ids).logits
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=ids)
        out.loss.backward()
        return out.logits

    def saved(logits: Any) -> dict[str, Any]:
        got = {"out": logits.detach().float().cpu()}
        if a.train and layer0.grad is not None:
            got["grad"] = layer0.grad.detach().float().cpu()
        return got

    return Client(step, saved)


def diffusers_step(a: argparse.Namespace, shape: dict[str, Any]) -> Client:
    """The Flux transformer: ``seq_len`` = text + image tokens."""
    import torch
    from diffusers import FluxTransformer2DModel

    dt = torch.bfloat16
    hd, txt = shape["head_dim"], shape["text_tokens"]
    img = shape["seq_len"] - txt
    first = max(2, hd // 8 // 2 * 2)  # RoPE axes: even sizes summing to the head dim
    rope = [first, (hd - first) // 4 * 2, hd - first - (hd - first) // 4 * 2]
    torch.manual_seed(0)
    model = (
        FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=shape["layers"],
            num_single_layers=shape["single_layers"],
            attention_head_dim=hd,
            num_attention_heads=shape["heads_q"],
            joint_attention_dim=64,
            pooled_projection_dim=64,
            axes_dims_rope=rope,
        )
        .to(a.device, dt)
        .eval()
    )
    model.set_attention_backend("flex")
    g = torch.Generator().manual_seed(1)
    b = shape["batch"]
    inp = {
        "hidden_states": torch.randn(b, img, 16, generator=g).to(a.device, dt),
        "encoder_hidden_states": torch.randn(b, txt, 64, generator=g).to(a.device, dt),
        "pooled_projections": torch.randn(b, 64, generator=g).to(a.device, dt),
        "timestep": torch.full((b,), 0.5, device=a.device),
        "img_ids": torch.stack([torch.zeros(img), torch.arange(img) // 32, torch.arange(img) % 32], 1).to(
            a.device
        ),
        "txt_ids": torch.zeros(txt, 3, device=a.device),
    }

    def step() -> Any:
        with torch.no_grad():
            return model(**inp).sample

    return Client(step, lambda out: {"out": out.detach().float().cpu()})


def torch_step(a: argparse.Namespace, shape: dict[str, Any]) -> Client:
    """The plain script (``prepare`` picks its flex function)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dt = torch.bfloat16
    g = torch.Generator().manual_seed(1)
    b, s, d = shape["batch"], shape["seq_len"], shape["head_dim"]
    q, k, v = (
        torch.randn(b, h, s, d, generator=g).to(a.device, dt).requires_grad_(a.train)
        for h in (shape["heads_q"], shape["heads_kv"], shape["heads_kv"])
    )
    go = torch.randn(b, shape["heads_q"], s, d, generator=g).to(a.device, dt)
    state: dict[str, Any] = {}

    def causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:  # the script's own mask
        return q_idx >= kv_idx

    def prepare() -> None:
        if a.mode == "dropin":
            import attnforge_flex

            _enable("torch", a.artifacts)
            state["flex"] = attnforge_flex.flex_attention
        else:
            if a.mode == "megacache":
                import attnforge_flex

                attnforge_flex.load(a.artifacts)
            state["flex"] = torch.compile(flex_attention)

    # built before the loop, as a script does (its first create_block_mask imports torch._dynamo: about 2.5 s on
    # the H100 machine, 4-5 s on the 2-core CPU, in every process, cold or warm; not in the timed step)
    t0 = time.perf_counter()
    state["mask"] = create_block_mask(causal, None, None, s, s, device=a.device)
    mask_s = round(time.perf_counter() - t0, 4)

    def step() -> Any:
        if a.train:
            for t in (q, k, v):
                t.grad = None
        gqa = shape["heads_q"] != shape["heads_kv"]
        out = state["flex"](q, k, v, block_mask=state["mask"], enable_gqa=gqa)
        if a.train:
            out.backward(go)
        return out

    def saved(out: Any) -> dict[str, Any]:
        got = {"out": out.detach().float().cpu()}
        if a.train and q.grad is not None:
            got["grad"] = q.grad.detach().float().cpu()
        return got

    return Client(step, saved, prepare, {"mask_s": mask_s})


def _used(a: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """What the steps ran: attnforge_flex.stats() for warm/dropin, Inductor's cache counters otherwise."""
    from torch._dynamo.utils import counters

    hits = {k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd")}
    if a.mode in ("warm", "dropin"):
        import attnforge_flex

        stats = attnforge_flex.stats().get(a.client, {})
        # "not served": attnforge logged the shape and the client compiled it as usual
        ran = sorted(
            {"compile" if k == "not served" else k for k, n in stats.items() if k != "variants" and n}
        )
        return "+".join(ran) or "none", {"stats": stats, **hits}
    if a.mode == "megacache":
        fx = hits.get("inductor", {})
        return (
            "megacache"
            if fx.get("fxgraph_cache_hit") and not fx.get("fxgraph_cache_miss")
            else "megacache-miss"
        ), hits
    return "compile", hits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--client", choices=["transformers", "diffusers", "torch"], required=True)
    ap.add_argument("--mode", choices=["cold", "warm", "megacache", "dropin"], required=True)
    ap.add_argument("--shape", required=True, help="JSON: batch, seq_len, heads_q, heads_kv, head_dim, ...")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--steady", type=int, default=10)
    ap.add_argument("--save", type=Path)
    ap.add_argument("--artifacts", help="an artifacts folder instead of the installed wheel's")
    ap.add_argument("--empty-artifacts", help="diffusers cold: the empty folder its backend is enabled over")
    ap.add_argument(
        "--cache-key-log", help="megacache: record the cache keys computed (attnforge.flex.cachekeys)"
    )
    ap.add_argument(
        "--profile", help="write where the first step's time went (cProfile, top 50) to this file"
    )
    a = ap.parse_args(argv)
    shape = json.loads(a.shape)
    import contextlib

    import torch

    build = {"transformers": transformers_step, "diffusers": diffusers_step, "torch": torch_step}[a.client]
    step, saved, prepare, info = build(a, shape)
    keys: Any = contextlib.nullcontext()
    if a.cache_key_log:
        from attnforge.flex.cachekeys import capture

        keys = capture(a.cache_key_log)
    _sync(a.device)
    prof = None
    if a.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    with keys:
        t0 = time.perf_counter()
        if prepare is not None:
            prepare()
        elif a.mode == "warm":
            _enable(a.client, a.artifacts)
        elif a.client == "diffusers":  # cold: the normal compile behind the same backend, no artifacts
            import attnforge_flex

            attnforge_flex.enable(["diffusers"], artifacts=a.empty_artifacts)
        out = step()
        _sync(a.device)
        first = time.perf_counter() - t0
    if prof is not None:
        import io
        import pstats

        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(50)
        Path(a.profile).write_text(
            f"{a.client} {a.mode}: first step {first:.3f} s\n{buf.getvalue()}", encoding="utf-8"
        )
    used, counters = _used(a)
    if a.save:
        torch.save(saved(out), a.save)
    times = []
    for _ in range(a.steady):
        t1 = time.perf_counter()
        step()
        _sync(a.device)
        times.append(time.perf_counter() - t1)
    print(
        json.dumps(
            {
                "first_step_s": round(first, 4),
                "used": used,
                "counters": counters,
                **(info or {}),
                "steady_step_s": round(statistics.median(times), 5) if times else None,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
