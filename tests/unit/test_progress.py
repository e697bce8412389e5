"""The CI (plain) progress view: one line per stage, with its status and time; the live view is unchanged."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from attnforge.cli.progress_view import ConsoleProgressView
from attnforge.engine.progress import PlainProgressView

CELL = "flash-attn-2.8.3-cu130-torch2.14.1-cp311-abi1-sm90-fwd128-x86_64"


def _view(quiet: bool = True) -> tuple[ConsoleProgressView, io.StringIO]:
    view = ConsoleProgressView(quiet=quiet)
    buf = io.StringIO()
    view.console = Console(file=buf, width=200, highlight=False, color_system=None)
    return view, buf


def _lines(buf: io.StringIO) -> list[str]:
    """The printed lines without the elapsed-time prefix."""
    return [line.split("] ", 1)[1] for line in buf.getvalue().splitlines()]


def _engine_calls(view: ConsoleProgressView, with_status: bool) -> None:
    """What Engine reports for one cell: its own stages, and each builder stage event (start, then end)."""
    view.stage(CELL, "fetching sources")
    view.stage(CELL, "building (MAX_JOBS=2)")
    for name, seconds in (("source", 0.4), ("unpack", 2.0), ("venv", 68.3), ("compile", 202.0)):
        view.stage(CELL, name, "start" if with_status else None)
        if name == "compile":
            view.units(CELL, 5, 5)
        view.stage(CELL, name, "done" if with_status else None, seconds if with_status else None)
    view.stage(CELL, "import_check", "start" if with_status else None)
    view.stage(CELL, "import_check", "failed" if with_status else None, 1.2 if with_status else None)
    view.stage(CELL, "failed")


def test_ci_prints_each_builder_stage_once_with_status_and_time() -> None:
    view, buf = _view()
    _engine_calls(view, with_status=True)
    assert _lines(buf) == [
        f"{CELL}: fetching sources",
        f"{CELL}: building (MAX_JOBS=2)",
        f"{CELL}: source done (0s)",
        f"{CELL}: unpack done (2s)",
        f"{CELL}: venv done (68s)",
        f"{CELL}: compiled 5/5 units, ETA -",
        f"{CELL}: compile done (202s)",
        f"{CELL}: import_check failed (1s)",
        f"{CELL}: failed",
    ]


def test_ci_stage_names_only_still_print_once() -> None:
    """Engine passes only the stage name today: the second event of a builder stage is its end."""
    view, buf = _view()
    _engine_calls(view, with_status=False)
    lines = _lines(buf)
    for name in ("source", "unpack", "venv", "compile", "import_check"):
        assert sum(line.startswith(f"{CELL}: {name} ") for line in lines) == 1, name
    assert f"{CELL}: venv ended (0s)" in lines
    assert lines[0] == f"{CELL}: fetching sources" and lines[-1] == f"{CELL}: failed"
    assert len(lines) == 9


def test_ci_units_every_ten_percent() -> None:
    view, buf = _view()
    for done in range(1, 21):
        view.units(CELL, done, 20)
    assert len(_lines(buf)) == 11  # the first unit, then 10%, 20%, ..., 100%


@pytest.mark.parametrize("with_status", [True, False])
def test_live_view_prints_nothing_and_tracks_the_stage(with_status: bool) -> None:
    view, buf = _view(quiet=False)
    _engine_calls(view, with_status)
    assert buf.getvalue() == ""  # not entered: the live table only renders inside `with view:`
    assert view.cells[CELL].stage == "failed" and view.cells[CELL].finished is not None


def test_eta_comes_from_the_unit_plan() -> None:
    view, _ = _view()
    view.plan_units(CELL, [("flash_fwd_split_hdim128_bf16_sm80", 400.0), ("flash_api", 100.0)], 2)
    p = view.cells[CELL]
    assert int(p.eta().rstrip("s")) in (399, 400)  # the plan: 400 s, nothing finished yet
    p.compile_started = (p.compile_started or 0.0) - 200.0  # 200 s in: flash_api was planned to end at 100 s
    view.units(CELL, 1, 2, "flash_api.cpp")
    assert 595 <= int(p.eta().rstrip("s")) <= 600  # it ran 2x the plan: 800 s in all, 600 s left
    view.units(CELL, 2, 2, "flash_fwd_split_hdim128_bf16_sm80.cu")
    assert p.eta() == "-"


def test_plain_view_prints_the_same_ci_lines() -> None:
    """The engine's own view (no rich) prints what the CLI's view prints in CI."""
    rich_view, rich_buf = _view()
    _engine_calls(rich_view, with_status=True)
    buf = io.StringIO()
    _engine_calls(PlainProgressView(buf), with_status=True)
    assert _lines(buf) == _lines(rich_buf)


def test_log_lines_are_plain_text_with_a_level() -> None:
    view, buf = _view()
    view.log(f"{CELL}: MAX_JOBS=4 [memory: 8 GiB per job]")
    view.log("OOM: resuming with MAX_JOBS=2", "warning")
    view.log("[red]not markup[/]", "error")
    assert buf.getvalue().splitlines() == [
        f"{CELL}: MAX_JOBS=4 [memory: 8 GiB per job]",
        "OOM: resuming with MAX_JOBS=2",
        "[red]not markup[/]",
    ]
