"""``python -m attnforge.flex.cli_main build ...``: the Flex builder without click or pydantic (for a bare
GPU host that has torch but not attnforge's dependencies); ``attnforge flex build`` is the same with matrix.yaml and full spec validation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from attnforge.flex.aot_build import BuildOptions, build_and_package, failed
from attnforge.flex.defaults import DEFAULT_VARIANTS


def select(variants: list[dict[str, Any]], device: str | None, only: list[str]) -> list[dict[str, Any]]:
    """Variants for ``device`` (all when None), restricted to ``only`` names when given."""
    out = [v for v in variants if device is None or v.get("device", "cuda") == device]
    if only:
        missing = set(only) - {v["name"] for v in out}
        if missing:
            raise SystemExit(f"no such variant(s) for this device: {', '.join(sorted(missing))}")
        out = [v for v in out if v["name"] in only]
    return out


def with_defaults(v: dict[str, Any]) -> dict[str, Any]:
    """Fill a plain variant dict the way the pydantic model would (validated there when available)."""
    try:
        from attnforge.flex.flex_spec import FlexVariant  # optional: pydantic

        return FlexVariant.model_validate(v).as_dict()
    except ImportError:
        base = {
            "mask": "causal",
            "window": None,
            "prefix": None,
            "score_mod": "none",
            "softcap": None,
            "dtype": "bf16",
            "head_dim": 128,
            "heads_q": 16,
            "heads_kv": 16,
            "seq_len": 2048,
            "batch": 1,
            "dynamic": False,
            "backward": True,
            "mode": "default",
            "device": "cuda",
            "scale": None,
            "pad_from": None,
            "client": None,
            "group": None,
        }
        return base | v


def read_variants(path: Path) -> list[dict[str, Any]]:
    """A JSON list of variant dicts, or a ``{"variants": [...], "clients": [...]}`` section (client
    declarations are expanded by ``spec``, which needs pydantic)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    try:
        from attnforge.flex.flex_spec import parse_variants  # optional: pydantic
    except ImportError:
        if isinstance(data, list):
            return data
        raise SystemExit(f"{path}: client declarations need pydantic (pip install pydantic)") from None
    return [v.as_dict() for v in parse_variants(data, str(path))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="attnforge.flex.cli_main")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--defaults", action="store_true", help="the built-in variants")
    b.add_argument("--variants", type=Path, help="JSON file: a list of variant dicts, or {variants, clients}")
    b.add_argument("--device", choices=["cuda", "cpu"])
    b.add_argument("--only", action="append", default=[])
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--wheel-dir", type=Path)
    b.add_argument("--family", default="default")
    b.add_argument("--no-aoti", action="store_true")
    b.add_argument("--no-precompile", action="store_true")
    b.add_argument("--jobs", type=int, default=3)
    b.add_argument("--cache-key-log", type=Path, help="folder: the Mega-Cache step's cache keys per variant")
    a = ap.parse_args(argv)
    raw = read_variants(a.variants) if a.variants else list(DEFAULT_VARIANTS)
    vs = [with_defaults(v) for v in select(raw, a.device, a.only)]
    if not vs:
        print("flex: no variants to build", file=sys.stderr)
        return 3
    opts = BuildOptions(
        out_dir=a.out,
        family=a.family,
        aoti=not a.no_aoti,
        precompile=not a.no_precompile,
        jobs=a.jobs,
        cache_key_log=a.cache_key_log,
    )
    manifest, wheel = build_and_package(vs, opts, a.wheel_dir)
    bad = failed(manifest)
    print(json.dumps({"built": len(vs) - len(bad), "failed": bad, "wheel": str(wheel) if wheel else None}))
    return 4 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
