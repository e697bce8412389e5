"""Helpers of scripts/remote-gpu-run.sh that need attnforge or JSON (run on the remote GPU host).

python3 scripts/remote_gpu_report.py key PYTHON PROFILE
    the kernel-set key of the env cell `attnforge build --python PYTHON --profile PROFILE --arch sm_90`
    makes (where carried kernel objects must be unpacked to be found)
python3 scripts/remote_gpu_report.py cross-torch MANIFEST OBJECTS_MANIFEST PARITY_RC
    reports/gpu/cross_torch.json: the wheel, the torch it was bound against, what compiled and what was
    reused, which machine and torch the reused objects came from, the parity verdict
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def kernel_set_key(python: str, profile: str) -> str:
    from attnforge.cli.commands.build import environment_build
    from attnforge.matrix.project import Project

    _, cells = environment_build(Project(Path("matrix.yaml")), python, None, [], profile, ["sm_90"])
    return cells[0].kernel_set_key


def cross_torch_report(manifest_path: Path, objects_manifest: Path, parity_rc: int) -> dict[str, object]:
    manifest = json.loads(manifest_path.read_text())
    objects = json.loads(objects_manifest.read_text())
    parity_file = Path("reports/gpu/cross-torch/parity.json")
    parity = json.loads(parity_file.read_text()) if parity_file.is_file() else {}
    build = manifest["build"]
    return {
        "command": "bash scripts/remote-gpu-run.sh start cross-torch "
        f"(GPU_RUN_CROSS_PROFILE={manifest['inputs']['profile']})",
        "wheel": manifest_path.name.removesuffix(".manifest.json"),
        "kernel_set_key": manifest.get("kernel_set_key"),
        "torch_build": build.get("torch_build"),
        "objects_created_by": objects.get("created_by"),
        "objects_built_with": objects.get("built_with"),
        "units_total": build.get("units_total"),
        "units_compiled": build.get("units_compiled"),
        "units_reused": build.get("units_reused"),
        "parity": {
            "device": parity.get("device"),
            "passed": parity.get("passed"),
            "failed": parity.get("failed"),
            "exit_code": parity_rc,
        },
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["key"] and len(argv) == 3:
        print(kernel_set_key(argv[1], argv[2]))
        return 0
    if argv[:1] == ["cross-torch"] and len(argv) == 4:
        report = cross_torch_report(Path(argv[1]), Path(argv[2]), int(argv[3]))
        out = Path("reports/gpu/cross_torch.json")
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
