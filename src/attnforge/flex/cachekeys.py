"""Cache-key diagnostics: what Inductor's FX graph cache and AOTAutograd's cache hash, per compiled graph.

A Mega-Cache entry hits only when the loading process computes the same key as the building one. Both caches
log, at DEBUG, every component of a key with its own hash ("FX graph cache hash details for key ..." and
"Autograd graph cache hash details for key ..."). ``capture(path)`` writes those records as JSON lines while a
block runs; ``diff(a, b)`` pairs the n-th key of each kind in two such files and returns the components that
differ. On the H100 the fwd+bwd Flex entries missed on load while the forward ones hit: one GPU run of the
builder and of the first-call worker with ``--cache-key-log`` shows which component differs.

    python -m attnforge.flex.cachekeys diff build.jsonl load.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LOGGERS = {
    "fx": ("torch._inductor.codecache", "FX graph cache hash details for key "),
    "aot": ("torch._functorch._aot_autograd.autograd_cache", "Autograd graph cache hash details for key "),
}
# loggers whose INFO records (hit, miss, bypass, "unable to load") are kept as {"kind": "log"} records
INFO_LOGGERS = (
    "torch._inductor.codecache",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._inductor.triton_bundler",
    "torch.compiler._cache",
)


class _KeyRecords(logging.Handler):
    """Keeps hash-detail records as ``{"kind", "key", "lines"}`` and INFO+ records as ``{"kind": "log"}``."""

    def __init__(self, out: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        for kind, (name, prefix) in LOGGERS.items():
            if record.name == name and msg.startswith(prefix):
                head, _, body = msg.partition("\n")
                key = head[len(prefix) :].rstrip(":").strip()
                self.out.append({"kind": kind, "key": key, "lines": body.splitlines()})
                return
        if record.levelno >= logging.INFO:
            self.out.append(
                {"kind": "log", "logger": record.name, "level": record.levelname, "msg": msg[:2000]}
            )
        if record.levelno >= logging.WARNING:
            print(f"{record.name}: {msg}", file=sys.stderr)


@contextmanager
def capture(path: str | Path) -> Iterator[list[dict[str, Any]]]:
    """Record every FX graph / AOTAutograd cache key computed inside the block, and the caches' hit, miss and
    load-failure messages, and write them to ``path`` (JSON lines). The loggers are raised to DEBUG and detached
    from torch's handlers meanwhile (warnings still go to stderr)."""
    records: list[dict[str, Any]] = []
    saved = []
    h = _KeyRecords(records)
    for name in dict.fromkeys([n for n, _ in LOGGERS.values()] + list(INFO_LOGGERS)):
        lg = logging.getLogger(name)
        saved.append((lg, h, lg.level, lg.propagate))
        lg.addHandler(h)
        lg.setLevel(logging.DEBUG)
        lg.propagate = False
    try:
        yield records
    finally:
        for lg, h, level, propagate in saved:
            lg.removeHandler(h)
            lg.setLevel(level)
            lg.propagate = propagate
        Path(path).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def read(path: str | Path) -> list[dict[str, Any]]:
    """The records ``capture`` wrote."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def _component(line: str) -> tuple[str, tuple[str, str]]:
    """A detail line ``[hash] name: value`` as (name, (hash, the whole line)): components are compared by
    their hash (a value's repr may hold a memory address that differs between equal processes)."""
    digest, _, rest = line.partition("]")
    return rest.strip().split(":", 1)[0].strip(), (digest.lstrip("[").strip(), line)


def diff(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kind, the n-th key of ``a`` against the n-th of ``b``: equal keys are reported as such, different
    ones with the components (by name) whose lines differ."""
    out: list[dict[str, Any]] = []
    for kind in LOGGERS:
        ka = [r for r in a if r["kind"] == kind]
        kb = [r for r in b if r["kind"] == kind]
        for i in range(max(len(ka), len(kb))):
            ra = ka[i] if i < len(ka) else None
            rb = kb[i] if i < len(kb) else None
            item: dict[str, Any] = {"kind": kind, "index": i, "a": ra and ra["key"], "b": rb and rb["key"]}
            if ra is None or rb is None:
                item["same"] = False
                item["differs"] = ["(key present on one side only)"]
            else:
                item["same"] = ra["key"] == rb["key"]
                la = dict(_component(x) for x in ra["lines"])
                lb = dict(_component(x) for x in rb["lines"])
                item["differs"] = [
                    {"component": n, "a": (la.get(n) or ("", None))[1], "b": (lb.get(n) or ("", None))[1]}
                    for n in sorted(set(la) | set(lb))
                    if (la.get(n) or ("",))[0] != (lb.get(n) or ("",))[0]
                ]
            out.append(item)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="attnforge.flex.cachekeys", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("diff", help="compare the cache keys of two --cache-key-log files")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    a, b = read(args.a), read(args.b)
    result = diff(a, b)
    logs = {
        side: [f"{r['logger']}: {r['msg'][:300]}" for r in recs if r["kind"] == "log"]
        for side, recs in (("a_log", a), ("b_log", b))
    }
    print(json.dumps({"keys": result, **logs}, indent=1))
    return 0 if all(r["same"] for r in result) else 1


if __name__ == "__main__":
    sys.exit(main())
