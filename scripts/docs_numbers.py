"""Rewrite the plan numbers written into the docs from the plan itself (`--check`: only say which differ).

A number in the docs that comes from a target's plan is marked where it stands:

    <!-- plan:release:valid -->227<!-- /plan -->
    <!-- plan:release@abi=torch:cost.shared.wheels -->172<!-- /plan -->

`release` is the target of matrix.yaml, `@abi=torch` plans it with another `abi:` than its own, and the key is
one of `numbers()`'s. A whole `attnforge plan -t T --cost --cores N` output sits between
`<!-- plan-cost:T:N -->` and `<!-- /plan-cost -->` (a fenced block). Costs use the packaged unit-time table
only (the reference machine's seconds), so every machine writes the same numbers. Run it where this checkout's
attnforge imports (`pip install -e .`, a nox session, or PYTHONPATH=src).

    python scripts/docs_numbers.py            rewrite the marked numbers in FILES
    python scripts/docs_numbers.py --check    exit 1 naming each marked number that differs from the plan
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from attnforge.cli.commands.plan import render_cost
from attnforge.engine.cost import PlanCost, Scenario, plan_cost
from attnforge.engine.unittimes import UnitTimeTable
from attnforge.matrix.plan import Plan
from attnforge.matrix.project import Project

ROOT = Path(__file__).resolve().parents[1]
FILES = ("README.md", "docs/ci.md", "docs/stable-abi.md", "docs/build.md")
MARK = re.compile(
    r"<!-- plan:(?P<target>[\w-]+)(?:@abi=(?P<abi>torch|stable))?:(?P<key>[\w.-]+) -->(?P<value>[^<]*)<!-- /plan -->"
)
BLOCK = re.compile(
    r"(?P<open><!-- plan-cost:(?P<target>[\w-]+):(?P<cores>\d+) -->\n)(?P<body>.*?)(?P<close><!-- /plan-cost -->)",
    re.S,
)
COST_CORES = 16  # the cost keys' "about N h": an LPT plan on this many cores
WIDTH = 160  # the rendered cost table's widest line (rich sizes the table to its content)


def _count(n: int) -> str:
    return f"{n:,}"


def _scenario(prefix: str, sc: Scenario) -> dict[str, str]:
    return {
        f"{prefix}.kernel_sets": _count(len(sc.sets)),
        f"{prefix}.wheels": _count(sc.wheels),
        f"{prefix}.cells": _count(sc.cells),
        f"{prefix}.units": _count(sc.units),
        f"{prefix}.hours": f"{sc.compile_s / 3600:.1f}",
        f"{prefix}.wall_hours": f"{sc.wall_s(COST_CORES) / 3600:.1f}",
    }


def _cost_numbers(cost: PlanCost) -> dict[str, str]:
    out = _scenario("cost.shared", cost.shared) | _scenario("cost.per_torch", cost.per_torch)
    out |= _scenario("cost.none", cost.none)
    alone = cost.per_torch_bindings or cost.shared
    out |= _scenario("cost.per_torch_bindings", alone)
    out["cost.stable_saves_wheels"] = _count(alone.wheels - cost.shared.wheels)
    out["cost.not_estimated"] = _count(len(cost.not_estimated))
    return out


def plan_numbers(plan: Plan) -> dict[str, str]:
    """The numbers of a plan the docs may cite, by key."""
    s = plan.summary()
    valid = [v for v in plan.verdicts if v.valid]
    out = {key: _count(s[key]) for key in ("cells", "valid", "invalid", "wheels", "kernel_sets")}
    out["served"] = _count(s["served_by_another_wheel"])
    out["variants"] = _count(len(s["variants"]))
    out["stable_abi_cells"] = _count(sum(1 for v in valid if v.cell.abi3_python))
    for family in sorted({v.cell.torch_family for v in valid}):
        out[f"torch_cells.{family}"] = _count(sum(1 for v in valid if v.cell.torch_family == family))
    for rule in sorted({p.rule for v in plan.verdicts for p in v.problems}):
        out[f"only_rule.{rule}"] = _count(
            sum(1 for v in plan.verdicts if v.problems and {p.rule for p in v.problems} == {rule})
        )
    return out


class Numbers:
    """Plans and costs of the targets the docs cite, each computed once."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self._plans: dict[tuple[str, str | None], Plan] = {}
        self._costs: dict[tuple[str, str | None, int], PlanCost] = {}
        self._numbers: dict[tuple[str | None, ...], dict[str, str]] = {}

    def plan(self, target: str, abi: str | None) -> Plan:
        if (target, abi) not in self._plans:
            if abi is None:
                self._plans[(target, abi)] = self.project.plan(target)
            else:
                from attnforge.matrix.plan import plan_target

                matrix = self.project.matrix
                spec = matrix.targets[target].model_copy(update={"abi": abi})
                changed = matrix.model_copy(update={"targets": {**matrix.targets, target: spec}})
                self._plans[(target, abi)] = plan_target(
                    changed, target, self.project.compat, self.project.lock
                )
        return self._plans[(target, abi)]

    def cost(self, target: str, abi: str | None, cores: int = COST_CORES) -> PlanCost:
        if (target, abi, cores) not in self._costs:
            self._costs[(target, abi, cores)] = plan_cost(self.plan(target, abi), UnitTimeTable(), cores)
        return self._costs[(target, abi, cores)]

    def value(self, target: str, abi: str | None, key: str) -> str:
        if abi == self.project.matrix.targets[target].abi:
            abi = None  # the target as written: one plan and one cost for both spellings
        if (target, abi) not in self._numbers:
            self._numbers[(target, abi)] = plan_numbers(self.plan(target, abi))
        known = self._numbers[(target, abi)]
        if key.startswith("cost."):
            if (target, abi, "cost") not in self._numbers:
                self._numbers[(target, abi, "cost")] = _cost_numbers(self.cost(target, abi))
            known = self._numbers[(target, abi, "cost")]
        if key not in known:
            raise KeyError(f"unknown key {key!r} (known: {', '.join(sorted(known))})")
        return known[key]

    def cost_block(self, target: str, cores: int) -> str:
        buffer = io.StringIO()
        console = Console(file=buffer, width=WIDTH, color_system=None, force_terminal=False, highlight=False)
        render_cost(self.cost(target, None, cores), console)
        lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
        return "```\n" + "\n".join(lines) + "\n```\n"


def rewrite(text: str, numbers: Numbers) -> str:
    """`text` with every marked number and cost block as the plan says."""

    def one(m: re.Match[str]) -> str:
        value = numbers.value(m["target"], m["abi"], m["key"])
        return m.group(0).replace(f"-->{m['value']}<!--", f"-->{value}<!--", 1)

    def block(m: re.Match[str]) -> str:
        return m["open"] + numbers.cost_block(m["target"], int(m["cores"])) + m["close"]

    return MARK.sub(one, BLOCK.sub(block, text))


def differences(path: Path, numbers: Numbers) -> list[str]:
    """`file:line: key: written X, the plan says Y` for each marked number that differs."""
    text = path.read_text(encoding="utf-8")
    found = []
    for m in MARK.finditer(text):
        want = numbers.value(m["target"], m["abi"], m["key"])
        if m["value"] != want:
            line = text.count("\n", 0, m.start()) + 1
            found.append(
                f"{path}:{line}: {m['target']}:{m['key']}: written {m['value']}, the plan says {want}"
            )
    for m in BLOCK.finditer(text):
        if m["body"] != numbers.cost_block(m["target"], int(m["cores"])):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path}:{line}: the plan-cost block of {m['target']} differs from the plan")
    return found


def main(argv: list[str] | None = None, log: Callable[[str], None] = print) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 when a marked number differs"
    )
    ap.add_argument("--matrix", type=Path, default=ROOT / "matrix.yaml")
    ap.add_argument("files", nargs="*", type=Path, default=[ROOT / f for f in FILES])
    args = ap.parse_args(argv)
    numbers = Numbers(Project(args.matrix, None))
    if args.check:
        found = [d for path in args.files for d in differences(path, numbers)]
        for d in found:
            log(d)
        if found:
            log("run `python scripts/docs_numbers.py` to write the plan's numbers")
        return 1 if found else 0
    for path in args.files:
        text = path.read_text(encoding="utf-8")
        new = rewrite(text, numbers)
        if new != text:
            path.write_text(new, encoding="utf-8")
            log(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
