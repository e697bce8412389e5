"""The scheduled ``refresh`` job: `attnforge compat refresh --check` against the package index and, when upstream
moved (exit 1), the overlay written, the workflows regenerated over it and a pull request opened whose body holds
the refresh report and the cells the plan gains or loses."""

from __future__ import annotations

from typing import Any

from attnforge.ci.invocation import OVERLAY
from attnforge.ci.steps import ACTIONS, setup_python
from attnforge.ci.workflow_spec import CiSettings, WorkflowSpec
from attnforge.ci.yamltext import Comment

BRANCH = "attnforge/compat-refresh"

CHECK = f"""set +e
attnforge compat refresh --compat {OVERLAY} --check > "$RUNNER_TEMP/refresh.txt"
code=$?
set -e
cat "$RUNNER_TEMP/refresh.txt"
case "$code" in
  0) echo "moved=false" >> "$GITHUB_OUTPUT" ;;
  1) echo "moved=true" >> "$GITHUB_OUTPUT" ;;
  *) exit "$code" ;;
esac
"""

# Valid cells before and after, from `attnforge plan --format json` (its `cells[].id`, `valid`, `served_by`).
PLAN_DIFF = """import json, sys
def cells(path):
    data = json.load(open(path))
    return {c["id"] for c in data["cells"] if c["valid"] and not c.get("served_by")}, data["summary"]
old, _ = cells(sys.argv[1])
new, summary = cells(sys.argv[2])
print(f"plan of target '{sys.argv[3]}' over the new overlay: {summary}")
for i in sorted(new - old): print(f"  + {i}")
for i in sorted(old - new): print(f"  - {i}")
"""


def refresh_job(spec: WorkflowSpec, settings: CiSettings) -> dict[Any, Any]:
    inv = settings.invocation
    target = spec.target
    write = (
        f'attnforge plan --target {target} --format json > "$RUNNER_TEMP/plan-before.json"\n'
        f"attnforge compat refresh --compat {OVERLAY} --write\n"
        f'attnforge --compat {OVERLAY} plan --target {target} --format json > "$RUNNER_TEMP/plan.json"\n'
        f"attnforge --compat {OVERLAY} {inv.generate().removeprefix('attnforge ')}\n"
    )
    body = (
        "{\n"
        '  echo "attnforge compat refresh found upstream releases the compat data does not have."\n'
        "  echo\n"
        "  echo '```'\n"
        '  cat "$RUNNER_TEMP/refresh.txt"\n'
        f'  python - "$RUNNER_TEMP/plan-before.json" "$RUNNER_TEMP/plan.json" {target} <<\'PY\'\n'
        f"{PLAN_DIFF}"
        "PY\n"
        "  echo '```'\n"
        '} > "$RUNNER_TEMP/body.md"\n'
        'git config user.name "github-actions[bot]"\n'
        'git config user.email "41898283+github-actions[bot]@users.noreply.github.com"\n'
        f'git switch -C "{BRANCH}"\n'
        f"git add -- {OVERLAY} .github/workflows\n"
        'git commit -m "compat: upstream releases (attnforge compat refresh)"\n'
        f'git push --force origin "{BRANCH}"\n'
        f'if gh pr view "{BRANCH}" --json state --jq .state 2>/dev/null | grep -qx OPEN; then\n'
        f'  gh pr edit "{BRANCH}" --body-file "$RUNNER_TEMP/body.md"\n'
        "else\n"
        f'  gh pr create --base "{settings.default_branch}" --head "{BRANCH}" \\\n'
        '    --title "compat: upstream releases" --body-file "$RUNNER_TEMP/body.md"\n'
        "fi\n"
    )
    return {
        Comment(
            "the only job that may write: it pushes a branch and opens a pull request (the repository setting\n"
            "'Allow GitHub Actions to create and approve pull requests' must be on)"
        ): None,
        "name": "compat refresh",
        "runs-on": "ubuntu-latest",
        "timeout-minutes": 30,
        "permissions": {"contents": "write", "pull-requests": "write"},
        "steps": [
            {
                Comment("keeps the job's token in the checkout's git config, for the push below"): None,
                "uses": ACTIONS["checkout"],
            },
            setup_python(settings.python),
            *(
                [{"name": "install attnforge from the checkout", "run": "python -m pip install -e ."}]
                if inv.self_mode
                else inv.setup()
            ),
            {"name": "what moved upstream (exit 1: new rows)", "id": "check", "run": CHECK},
            {
                "name": "write the overlay, plan over it, regenerate the workflows",
                "if": "steps.check.outputs.moved == 'true'",
                "run": write,
            },
            {
                "name": "open or update the pull request",
                "if": "steps.check.outputs.moved == 'true'",
                "env": {"GH_TOKEN": "${{ github.token }}"},
                "run": body,
            },
        ],
    }
