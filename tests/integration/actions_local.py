"""Run a GitHub Actions job's `run:` steps locally, as the runner would: in order, under
`bash --noprofile --norc -eo pipefail`, with the workflow's, the job's and the step's `env`, and
GITHUB_ENV / GITHUB_OUTPUT / GITHUB_PATH / RUNNER_TEMP / GITHUB_WORKSPACE as files and folders of a temp tree.

`uses:` steps are not run (the caller provides what they would: the checkout, the Python, the artifacts).
Expressions are only allowed in `env` values (`${{ secrets.X }}` and `${{ vars.X }}` read as unset, as on a
fork) and in a step's `if` of the form `steps.ID.outputs.NAME == 'VALUE'`; a `run:` script holding one fails.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
OUTPUT_IF = re.compile(r"^steps\.([\w-]+)\.outputs\.([\w-]+) == '([^']*)'$")


@dataclass
class StepRun:
    """One step: run (exit code, seconds, output) or skipped (why)."""

    job: str
    name: str
    code: int | None = None
    seconds: float = 0.0
    output: str = ""
    skipped: str = ""


@dataclass
class LocalRunner:
    """A workspace and a runner temp folder; the environment every step starts from."""

    workspace: Path
    temp: Path
    base_env: dict[str, str]
    results: list[StepRun] = field(default_factory=list)

    def _expr(self, text: str) -> str:
        def value(m: re.Match[str]) -> str:
            expr = m.group(1)
            if expr.startswith(("secrets.", "vars.")) or expr == "github.token":
                return ""
            if expr == "github.repository":
                return "example/scratch"
            raise AssertionError(f"expression the local runner does not evaluate: {m.group(0)}")

        return EXPR.sub(value, text)

    def run_job(
        self,
        workflow: dict[str, Any],
        job_id: str,
        skip: Callable[[dict[str, Any]], str] = lambda step: "",
        timeout: int = 900,
    ) -> list[StepRun]:
        """Run the job's steps; stops at the first failing one (its StepRun has the non-zero code)."""
        job = workflow["jobs"][job_id]
        files = {
            n: self.temp / f"{job_id}.{n.lower()}" for n in ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_PATH")
        }
        for path in files.values():
            path.write_text("")
        env = {**self.base_env, **{k: str(v) for k, v in (workflow.get("env") or {}).items()}}
        env.update({k: self._expr(str(v)) for k, v in (job.get("env") or {}).items()})
        env.update({k: str(p) for k, p in files.items()})
        env.update(
            {"GITHUB_WORKSPACE": str(self.workspace), "RUNNER_TEMP": str(self.temp), "GITHUB_JOB": job_id}
        )
        outputs: dict[str, dict[str, str]] = {}
        runs: list[StepRun] = []
        for i, step in enumerate(job.get("steps", [])):
            name = step.get("name") or step.get("uses") or f"step {i}"
            result = StepRun(job_id, name)
            runs.append(result)
            why = "" if "run" in step else f"action {step['uses']}: provided by the test"
            why = why or skip(step) or self._condition(step.get("if"), outputs)
            if why:
                result.skipped = why
                continue
            script = step["run"]
            assert "${{" not in script, f"{job_id}/{name}: an expression inside a run script"
            step_env = {**env, **_env_file(files["GITHUB_ENV"])}
            extra_path = [p for p in files["GITHUB_PATH"].read_text().splitlines() if p]
            if extra_path:
                step_env["PATH"] = ":".join([*reversed(extra_path), step_env["PATH"]])
            step_env.update({k: self._expr(str(v)) for k, v in (step.get("env") or {}).items()})
            files["GITHUB_OUTPUT"].write_text("")
            start = time.monotonic()
            proc = subprocess.run(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                cwd=self.workspace,
                env=step_env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            result.code, result.seconds = proc.returncode, round(time.monotonic() - start, 1)
            result.output = proc.stdout + proc.stderr
            if "id" in step:
                outputs[step["id"]] = _env_file(files["GITHUB_OUTPUT"])
            if proc.returncode != 0:
                break
        self.results.extend(runs)
        return runs

    @staticmethod
    def _condition(cond: str | None, outputs: dict[str, dict[str, str]]) -> str:
        """'' when the step runs; else why not (`always()`/`failure()` steps are uploads: `uses:`)."""
        if not cond:
            return ""
        m = OUTPUT_IF.match(cond.strip())
        assert m, f"condition the local runner does not evaluate: {cond}"
        got = outputs.get(m.group(1), {}).get(m.group(2), "")
        return "" if got == m.group(3) else f"if: {cond} (it is '{got}')"

    def report(self) -> str:
        """One line per step: what ran (exit code, seconds) and what did not, with why."""
        lines = []
        for r in self.results:
            state = f"skipped: {r.skipped}" if r.skipped else f"exit {r.code} in {r.seconds} s"
            lines.append(f"  {r.job} / {r.name}: {state}")
        return "\n".join(lines)


def _env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a GITHUB_ENV/GITHUB_OUTPUT file (the one-line form the generated steps write)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, v in pairs}
