"""How a generated job gets and calls attnforge: in a user's repository, a pinned attnforge installed from PyPI, a
wheel or the organisation's index, called directly; in attnforge's own repository (``ci.mode: self``), its nox
sessions run from the checkout."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from attnforge import __version__
from attnforge.ci.steps import install_nox
from attnforge.matrix.ci_section import AttnforgeSource

OVERLAY = (
    "compat.overlay.toml"  # the repository's compat overlay (`attnforge compat refresh --write` writes it)
)
WHEEL_GLOB = "flash_attn-*.whl"  # what a parity job runs, as `nox -s gpu-parity -- --wheels DIR` does

# After the install: the overlay, when the repository has one, is the compat data every later step uses.
USE_OVERLAY = (
    f'if [ -f {OVERLAY} ]; then echo "ATTNFORGE_COMPAT=$GITHUB_WORKSPACE/{OVERLAY}" >> "$GITHUB_ENV"; fi\n'
)


@dataclass(frozen=True)
class Invocation:
    """The install step and the command lines of every job, for one mode."""

    mode: str = "user"
    source: AttnforgeSource = field(default_factory=AttnforgeSource)
    check_args: tuple[str, ...] = ()  # the `ci generate` options besides the defaults (repeated by --check)

    @property
    def self_mode(self) -> bool:
        return self.mode == "self"

    @property
    def version(self) -> str:
        return self.source.version or __version__

    def requirement(self, extras: str = "") -> str:
        """The pip arguments that install attnforge (with `extras`, e.g. "build") from the configured source."""
        name = f"attnforge[{extras}]" if extras else "attnforge"
        if self.source.wheel:
            return shlex.quote(f"{name} @ {self.source.wheel}")
        pinned = shlex.quote(f"{name}=={self.version}")
        if self.source.index_url:
            return f"--index-url {shlex.quote(self.source.index_url)} {pinned}"
        return pinned

    def setup(self, extras: str = "") -> list[dict[str, Any]]:
        """The steps that make `attnforge` (or nox) callable: before a job's first command."""
        if self.self_mode:
            return [install_nox()]
        what = self.source.wheel or (
            f"{self.version} from {self.source.index_url}" if self.source.index_url else self.version
        )
        return [
            {
                "name": f"install attnforge {what}",
                "run": f"python -m pip install {self.requirement(extras)}\nattnforge --version\n{USE_OVERLAY}",
            }
        ]

    def build(self, target: str, cells: str) -> str:
        if self.self_mode:
            return f"nox -s build-wheels -- --target {target} --quiet{cells}\n"
        return f"attnforge build --target {target} --quiet{cells}\n"

    def parity(self, out: str) -> str:
        if self.self_mode:
            return f"nox -s gpu-parity -- --wheels {out}"
        return (
            "shopt -s nullglob\n"
            f"wheels=({out}/{WHEEL_GLOB})\n"
            f'if [ "${{#wheels[@]}}" -eq 0 ]; then echo "no flash_attn wheels in {out}" >&2; exit 1; fi\n'
            'for wheel in "${wheels[@]}"; do attnforge parity run --wheel "$wheel"; done\n'
        )

    def publish(self, destination: str) -> str:
        if self.self_mode:
            return f"nox -s publish -- --to {destination}"
        return f"attnforge publish --to {destination}"

    def images(self, target: str) -> str:
        if self.self_mode:
            return f'nox -s images -- --target {target} --push "$REGISTRY"'
        return f'attnforge images build --target {target} --push "$REGISTRY"'

    def runner_check(self, target: str, report: str) -> str:
        if self.self_mode:
            return f"nox -s runner-check -- --target {target} --json {report}"
        return f"attnforge runner check --target {target} --json {report}"

    def generate(self, check: bool = False) -> str:
        """`attnforge ci generate` with the options the workflows were generated with."""
        return " ".join(["attnforge ci generate", *(["--check"] if check else []), *self.check_args])
