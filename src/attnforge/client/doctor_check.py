"""One line of `attnforge doctor`'s report: what was checked, its status and the detail."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    """One line of the report."""

    name: str
    status: str  # ok | fail | warn | skip
    detail: str
