"""The steps and actions every generated workflow shares (checkout, Python, nox, the signing key)."""

from __future__ import annotations

from typing import Any

# One place for the actions used (update here, regenerate, commit). Majors on the Node 24 runtime:
# actionlint flags the Node 20 ones (cache@v4, upload-artifact@v4, download-artifact@v4..v6).
ACTIONS = {
    "checkout": "actions/checkout@v5",
    "setup-python": "actions/setup-python@v6",
    "cache-restore": "actions/cache/restore@v5",
    "cache-save": "actions/cache/save@v5",
    "upload": "actions/upload-artifact@v6",
    "download": "actions/download-artifact@v7",
}

FORK_GUARD = "github.event.pull_request.head.repo.full_name == github.repository || github.event_name != 'pull_request'"


def checkout() -> dict[str, Any]:
    return {"uses": ACTIONS["checkout"], "with": {"persist-credentials": False}}


def setup_python(python: str, cells: tuple[str, ...] = ()) -> dict[str, Any]:
    """actions/setup-python with `python` (what nox runs on, the default `python` afterwards) and before it the
    cells' own Pythons (the docker backend mounts the host's interpreter of each; `3.14t` is the free-threaded
    build, which setup-python installs by that name)."""
    others = [p for p in dict.fromkeys(cells) if p != python]
    version = "\n".join([*others, python]) + "\n" if others else python
    return {"uses": ACTIONS["setup-python"], "with": {"python-version": version}}


def install_nox() -> dict[str, Any]:
    return {"name": "install nox", "run": "python -m pip install nox"}


def signing_key() -> dict[str, Any]:
    """The site key from the ATTNFORGE_SIGNING_KEY_PEM secret (docs/records.md); without it, a runner's own."""
    return {
        "name": "the site signing key (secret ATTNFORGE_SIGNING_KEY_PEM)",
        "run": 'if [ -n "$PEM" ]; then printf \'%s\\n\' "$PEM" > "$RUNNER_TEMP/site.pem"; '
        'echo "ATTNFORGE_SIGNING_KEY=$RUNNER_TEMP/site.pem" >> "$GITHUB_ENV"; fi',
        "env": {"PEM": "${{ secrets.ATTNFORGE_SIGNING_KEY_PEM }}"},
    }


def runs_on(labels: tuple[str, ...] | list[str]) -> Any:
    return labels[0] if len(labels) == 1 else list(labels)
