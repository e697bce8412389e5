"""A torch release newer than every compile of a CUDA lane (torch 2.15: CUDA 13.2 builds only): the `release`
target plans its CUDA 13.2 lane (cp311-cp315, cp314t, cp315t) and, for `abi: stable`, serves the torch 2.15
cells of the CUDA 13.0 lane with that lane's existing abi3 wheel (CUDA minor-version compatibility) instead
of compiling; without a stable-ABI wheel the older toolkit stays refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from attnforge.matrix.compat import load_compat
from attnforge.matrix.file import parse_matrix
from attnforge.matrix.plan import plan_target
from attnforge.matrix.rules import NEWER_RUNTIME

Run = Callable[..., tuple[int, str, str]]

TARGET = """\
version: 1
kernels:
  flash-attn: {{version: "2.8.3", source: {{sha256: "{sha}"}}}}
profiles:
  full: {{}}
defaults: {{kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: full}}
targets:
  t:
    {abi}
    matrix:
      toolkit: [{toolkits}]
      torch: [{torches}]
      python: ["3.12"]
      arch: [[sm_90]]
      profile: [full]
"""


def _plan(toolkits: str, torches: str, abi: str = "abi: stable"):  # type: ignore[no-untyped-def]
    text = TARGET.format(abi=abi, toolkits=toolkits, torches=torches, sha="1" * 64)
    return plan_target(parse_matrix(text), "t", load_compat())


def test_release_plans_torch_215_on_cuda_132(run_cli: Run, root: Path) -> None:
    code, out, _ = run_cli("--matrix", str(root / "matrix.yaml"), "plan", "-t", "release", "--format", "json")
    assert code == 0
    cells = [c for c in json.loads(out)["cells"] if c["valid"] and c["torch"] == "2.15.0"]
    lane = {c["python"] for c in cells if c["toolkit"] == "cuda13.2"}
    assert lane == {"3.11", "3.12", "3.13", "3.14", "3.14t", "3.15", "3.15t"}
    built = [c for c in cells if c["toolkit"] == "cuda13.2" and not c["served_by"]]
    assert {c["wheel"] for c in built} == {
        "flash_attn-2.8.3+cu132sm80sm90torch2.10abi3-cp310-abi3-linux_x86_64.whl",
        "flash_attn-2.8.3+cu132torch2.15cxx11abiTRUE-cp314-cp314t-linux_x86_64.whl",
        "flash_attn-2.8.3+cu132torch2.15cxx11abiTRUE-cp315-cp315t-linux_x86_64.whl",
    }
    # the CUDA 13.0 lane's abi3 wheel (compiled on an older torch) serves torch 2.15: nothing compiled for it
    old_lane = [c for c in cells if c["toolkit"] == "cuda13.0" and c["arches"] == ["sm_80", "sm_90"]]
    assert {c["python"] for c in old_lane} == {"3.11", "3.12", "3.13", "3.14", "3.15"}
    assert all(c["served_by"] and "torch2.1" in c["served_by"] for c in old_lane)
    assert all(any(n.startswith(NEWER_RUNTIME) for n in c["notes"]) for c in old_lane)


def test_stable_cell_of_an_older_toolkit_is_served_by_the_lane_wheel() -> None:
    plan = _plan("cuda13.0", '"2.14", "2.15"')
    (v215,) = [v for v in plan.verdicts if v.cell.torch.startswith("2.15")]
    (v214,) = [v for v in plan.verdicts if v.cell.torch.startswith("2.14")]
    assert v215.valid and v215.served_by == v214.cell.id
    assert v215.cell.wheel_name == v214.cell.wheel_name and v215.cell.torch_variant == "cu132"


def test_no_older_torch_in_the_lane_means_no_wheel() -> None:
    plan = _plan("cuda13.0", '"2.15"')
    (v,) = plan.verdicts
    assert not v.valid and "no torch release has CUDA 13.0" in " ".join(v.reasons())


def test_per_torch_target_still_refuses_the_older_toolkit() -> None:
    plan = _plan("cuda13.0", '"2.15"', abi="")
    (v,) = plan.verdicts
    assert not v.valid and "[torch-toolkit] torch 2.15's oldest CUDA 13 build is 13.2" in v.reasons()[0]
