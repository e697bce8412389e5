"""Scheduling from unit times: the table's estimates and records, LPT plans, threads, parallel kernel sets,
the ETA, the units a cell compiles, and the setup hook's start order."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from attnforge.builder.patches import PATCHES_DIR
from attnforge.engine.schedule import (
    cell_units,
    choose_parallel_cells,
    choose_threads,
    list_schedule,
    makespan,
    plan_eta,
)
from attnforge.engine.unittimes import UnitTimeTable, flags_of, flags_scale, unit_key
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.schema import ProfileSpec

FA = ("flash-attn", "2.8.3", "cuda13.0")
SPLIT = "flash_fwd_split_hdim128_bf16_sm80"


def seed(rows: list[tuple[str, str, float, str]], reference: str = "big") -> dict[str, Any]:
    units = [
        {
            "machine": m,
            "kernel": FA[0],
            "version": FA[1],
            "toolkit": FA[2],
            "unit": u,
            "arches": 1,
            "flags": f,
            "s": s,
        }
        for m, u, s, f in rows
    ]
    return {"reference_machine": reference, "units": units}


def test_estimates_exact_then_relatives_then_kind(tmp_path: Path) -> None:
    table = UnitTimeTable(
        tmp_path / "unit_times.json", seed([("big", SPLIT, 400.0, "-"), ("big", "flash_api", 80.0, "-")])
    )
    assert table.estimate(*FA, SPLIT, 1, "-").s == 400.0
    # the other dtype costs the same; two arches twice as much; compiled-out features less
    other = table.estimate(*FA, SPLIT.replace("bf16", "fp16"), 1, "-")
    assert other.s == 400.0 and "other dtype" in other.source
    assert table.estimate(*FA, SPLIT, 2, "-").s == pytest.approx(800.0)
    lean = flags_of(["dropout", "alibi", "softcap", "uneven_k", "local", "backward"])
    assert table.estimate(*FA, SPLIT, 1, lean).s == pytest.approx(400.0 * flags_scale(lean))
    # another kind of unit: the median of its kind, else a default
    assert table.estimate(*FA, "flash_bwd_hdim64_fp16_sm80", 1, "-").source.startswith("default")


def test_an_unmeasured_head_dim_takes_the_nearest_of_its_kind_and_causality() -> None:
    causal = SPLIT.replace("_sm80", "_causal_sm80")
    rows = [
        ("big", SPLIT, 400.0, "-"),
        ("big", causal, 200.0, "-"),
        ("big", SPLIT.replace("128", "64"), 300.0, "-"),
    ]
    table = UnitTimeTable(None, seed(rows))
    wide = table.estimate(*FA, SPLIT.replace("128", "256"), 1, "-")
    assert wide.s == 400.0 and "head dim 128" in wide.source
    assert table.estimate(*FA, causal.replace("128", "192"), 1, "-").s == 200.0
    assert table.estimate(*FA, SPLIT.replace("128", "32"), 1, "-").s == 300.0  # 64 is nearer than 128
    narrow = table.estimate(*FA, SPLIT.replace("hdim128_bf16", "hdim32_fp16"), 1, "-")
    assert narrow.s == 300.0 and "other dtype" in narrow.source and "head dim 64" in narrow.source


def test_measured_rows_win_and_scale_the_seed(tmp_path: Path) -> None:
    path = tmp_path / "unit_times.json"
    table = UnitTimeTable(path, seed([("big", SPLIT, 400.0, "-"), ("big", "flash_api", 80.0, "-")]))
    times = {
        SPLIT: {"s": 1000.0, "peak_rss_gb": 4.0},
        "flash_fwd_hdim64_bf16_sm80": {"s": 5.0, "peak_rss_gb": 0.01},
    }
    assert table.record(*FA, 1, "-", times, "test") == 1  # the 0.01 GB one was a ccache hit
    again = UnitTimeTable(path, seed([("big", SPLIT, 400.0, "-"), ("big", "flash_api", 80.0, "-")]))
    assert again.estimate(*FA, SPLIT, 1, "-").s == 1000.0
    assert again.factor == pytest.approx(2.5)
    assert again.estimate(*FA, "flash_api", 1, "-").s == pytest.approx(200.0)  # seed x this machine's factor
    for s in (900.0, 1100.0, 1200.0, 1300.0, 1400.0):
        again.record(*FA, 1, "-", {SPLIT: {"s": s, "peak_rss_gb": 4.0}}, "test")
    row = json.loads(path.read_text())["units"][unit_key(*FA, SPLIT, 1, "-")]
    assert row["runs"] == [900.0, 1100.0, 1200.0, 1300.0, 1400.0] and row["s"] == 1200.0


def test_seed_machines_are_converted_to_the_reference(tmp_path: Path) -> None:
    rows = [("big", SPLIT, 400.0, "-"), ("small", SPLIT, 1200.0, "-"), ("small", "flash_api", 240.0, "-")]
    table = UnitTimeTable(None, seed(rows))
    assert table.estimate(*FA, SPLIT, 1, "-").s == 400.0
    assert table.estimate(*FA, "flash_api", 1, "-").s == pytest.approx(80.0)


def test_packaged_seed_orders_split_units_first() -> None:
    table = UnitTimeTable(None)
    split = table.estimate(*FA, SPLIT, 1, "-").s
    bwd = table.estimate(*FA, "flash_bwd_hdim128_bf16_sm80", 1, "-").s
    assert split > bwd > table.estimate(*FA, "flash_api", 1, "-").s


def test_lpt_beats_the_given_order_and_threads_help_only_with_arches() -> None:
    durations = [100.0, 100.0, 100.0, 100.0, 400.0]
    assert list_schedule([10.0, 20.0, 30.0], 2) == [(0.0, 10.0), (0.0, 20.0), (10.0, 40.0)]
    assert makespan(durations, 4, lpt=False) == 500.0 and makespan(durations, 4) == 400.0
    one_arch = choose_threads(durations, arches=1, cores=16)
    assert one_arch.threads == 1 and one_arch.jobs == 16
    # two long units, four arches, 16 cores: threads shorten the tail
    wide = choose_threads([1000.0, 1000.0], arches=4, cores=16)
    assert wide.threads == 4 and wide.makespan_s < 1000.0 * 0.5
    # memory caps jobs x threads
    capped = choose_threads([1000.0] * 8, arches=4, cores=16, gb_per_thread=4.0, memory_gb=16.0)
    assert capped.jobs * min(capped.threads, 4) * 4.0 <= 16.0


def test_parallel_kernel_sets_when_one_set_cannot_fill_the_cores() -> None:
    few_long = [[400.0, 400.0], [400.0, 400.0], [400.0, 400.0], [400.0, 400.0]]
    assert choose_parallel_cells(few_long, 16) == 4
    assert choose_parallel_cells([[100.0] * 64, [10.0]], 16) == 1
    assert choose_parallel_cells([[100.0]], 16) == 1


def test_eta_follows_the_plan_and_how_finished_units_ran() -> None:
    order = [("a", 400.0), ("b", 300.0), ("c", 100.0)]
    assert plan_eta(order, 2, {}, 0.0) == pytest.approx(400.0)
    assert plan_eta(order, 2, {}, 100.0) == pytest.approx(300.0)
    # b planned to end at 300 s ended at 600 s: the rest takes twice as long
    assert plan_eta(order, 2, {"b": 600.0}, 600.0) == pytest.approx(200.0)
    assert plan_eta(order, 2, {"a": 1.0, "b": 1.0, "c": 1.0}, 5.0) == 0.0
    # past the scaled plan: half the unfinished work per job
    assert plan_eta(order, 2, {"b": 300.0}, 900.0) == pytest.approx(0.5 * 500.0 / 2)


def _cell(profile: ProfileSpec, name: str) -> Cell:
    return Cell(
        "flash-attn",
        "2.8.3",
        Toolkit.parse("cuda13.0"),
        "2.14.1",
        "3.11",
        True,
        ("sm_90",),
        name,
        profile_spec=profile,
    )


def test_cell_units_follow_the_profile() -> None:
    full = cell_units(_cell(ProfileSpec(), "full"))
    assert len(full) == 73 and full[0] == "flash_api"
    fwd128 = ProfileSpec(
        head_dims=[128],
        dtypes=["bf16"],
        disable=["backward", "dropout", "alibi", "softcap", "uneven_k", "local"],
    )
    units = cell_units(_cell(fwd128, "fwd128"))
    assert sorted(units) == sorted(
        [
            "flash_api",
            "flash_fwd_hdim128_bf16_sm80",
            "flash_fwd_hdim128_bf16_causal_sm80",
            SPLIT,
            "flash_fwd_split_hdim128_bf16_causal_sm80",
        ]
    )


def test_setup_hook_starts_the_longest_estimate_first() -> None:
    sys.path.insert(0, str(PATCHES_DIR))
    try:
        import setup_hook
    finally:
        sys.path.pop(0)
    src = "csrc/flash_attn/src/{}.cu"
    names = ["flash_bwd_hdim128_bf16_sm80", SPLIT, "flash_fwd_hdim64_bf16_sm80"]
    sources = ["csrc/flash_attn/flash_api.cpp", *(src.format(n) for n in names)]
    estimates = setup_hook.unit_seconds(f"{SPLIT}=10,flash_api=500,bogus")
    assert estimates == {SPLIT: 10.0, "flash_api": 500.0}
    ordered = setup_hook.longest_first(sources, estimates)
    assert ordered[0].endswith("flash_api.cpp") and ordered[-1].endswith(f"{SPLIT}.cu")
    # without estimates the split-KV units come first (the H100 measurement), then backward
    default = setup_hook.longest_first(sources)
    assert default[0].endswith(f"{SPLIT}.cu") and "bwd" in default[1]


def test_plan_cost_shows_what_sharing_saves(run_cli: Any, root: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copy(root / "matrix.yaml", tmp_path / "matrix.yaml")  # no measured table: the seed only
    code, out, _ = run_cli(
        "--matrix",
        str(tmp_path / "matrix.yaml"),
        "plan",
        "-t",
        "release",
        "--cost",
        "--cores",
        "16",
        "--format",
        "json",
    )
    assert code == 0
    cost = json.loads(out)
    shared, per_torch, none = cost["shared"], cost["per_torch"], cost["none"]
    assert shared["kernel_sets"] < per_torch["kernel_sets"] < none["kernel_sets"]
    assert shared["compile_hours"] < per_torch["compile_hours"] < none["compile_hours"]
    assert shared["wall_hours"] < shared["compile_hours"] and cost["machine_factor"] == 1.0
    assert all("rocm" in c for c in cost["not_estimated"])
    # one CUDA lane's kernel set serves every torch release of it
    lane = [
        s
        for s in cost["kernel_sets"]
        if any("cu126-torch2.6" in c for c in s["cells"]) and any("cu126-torch2.14" in c for c in s["cells"])
    ]
    assert lane and lane[0]["kernel_units"] == 72
    # the target is `abi: stable`: torch >= 2.10 cells share one wheel (and one binding) per lane
    assert lane[0]["wheels"] < len(lane[0]["cells"])
    alone = cost["without_stable_abi"]
    assert alone["cells"] == shared["cells"] and alone["wheels"] == alone["cells"] > shared["wheels"]
    assert alone["compile_hours"] > shared["compile_hours"]
    code, text, _ = run_cli("--matrix", str(tmp_path / "matrix.yaml"), "plan", "-t", "release", "--cost")
    assert code == 0 and "sharing kernels across torch releases saves" in text
    assert f"stable-ABI wheels: {shared['wheels']} wheels and bindings serve {shared['cells']} cells" in text


def test_setup_hook_writes_the_ninja_file_in_its_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """setuptools sorts sources by name; the hook re-orders the edges torch writes into build.ninja (and
    only those: the objects torch returns for the link keep their order)."""
    from torch.utils import cpp_extension

    sys.path.insert(0, str(PATCHES_DIR))
    try:
        import setup_hook
    finally:
        sys.path.pop(0)
    seen: dict[str, list[str]] = {}

    def record(**kwargs: Any) -> None:
        seen.update(sources=kwargs["sources"], objects=kwargs["objects"])

    monkeypatch.setattr(cpp_extension, "_write_ninja_file_and_compile_objects", record)
    order = ["csrc/b_split.cu", "csrc/a_api.cpp"]
    assert setup_hook.start_in_order(order)
    sources = sorted(str(Path(s).resolve()) for s in order)
    objects = [s + ".o" for s in sources]
    cpp_extension._write_ninja_file_and_compile_objects(sources=sources, objects=objects, cflags=[])
    assert [Path(s).name for s in seen["sources"]] == ["b_split.cu", "a_api.cpp"]
    assert [Path(o).name for o in seen["objects"]] == ["b_split.cu.o", "a_api.cpp.o"]
    assert [Path(o).name for o in objects] == ["a_api.cpp.o", "b_split.cu.o"]  # the link order is untouched
