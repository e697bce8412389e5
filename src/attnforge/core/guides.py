"""The user guides attnforge ships inside its package (`attnforge/docs/*.md`), found by topic name.

A topic is a guide's file name without `.md` (`records` is `docs/records.md`); its title is the guide's first
`# ` heading. `attnforge docs TOPIC` prints one; messages name a guide as `attnforge docs TOPIC`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from attnforge.core.errors import ConfigurationError, EnvironmentProblem


@dataclass(frozen=True)
class Guide:
    """One shipped guide: its topic name, title and file."""

    topic: str
    title: str
    path: Path


def guides_dir() -> Path:
    """The packaged docs/ folder (a real folder once installed: setuptools installs package data as files)."""
    return Path(str(resources.files("attnforge").joinpath("docs")))


def _title(path: Path) -> str:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("# "):
                return line[2:].strip()
    return path.stem


def guides() -> list[Guide]:
    """Every shipped guide, by topic name; EnvironmentProblem when the installation has none."""
    folder = guides_dir()
    found = sorted(folder.glob("*.md")) if folder.is_dir() else []
    if not found:
        raise EnvironmentProblem(
            f"no guides under {folder}: this attnforge installation lacks its package data (reinstall it)"
        )
    return [Guide(p.stem, _title(p), p) for p in found]


def guide(topic: str) -> Guide:
    """The guide of `topic` (`records`, also `records.md` or `docs/records.md`); ConfigurationError naming
    the known topics (and the closest one) otherwise."""
    name = topic.removeprefix("docs/").removesuffix(".md")
    every = guides()
    for g in every:
        if g.topic == name:
            return g
    names = [g.topic for g in every]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise ConfigurationError(f"no guide named '{topic}': {hint}topics: {', '.join(names)}")
