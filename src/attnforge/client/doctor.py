"""`attnforge doctor`: does the installed flash-attn (or flash-attn-3) fit this environment, and does its
extension load?

Compares the wheel's build record (`<dist-info>/attnforge_build.json`, written by finalize) with the
environment: torch release family and the torch requirement, the torch build's CUDA/ROCm version, the
C++ ABI, Python, then imports the kernel's module (`flash_attn_2_cuda`; FA3: `flash_attn_interface`, which
loads `flash_attn_3._C`) after torch, in a separate process, and, when a GPU is visible, checks its
architecture against the compiled list and the driver against the toolkit. A stable-ABI wheel (FA3,
`torch_floor` in its record) fits any torch from its floor on, any CPython from `abi3_python` on, a newer
CUDA minor of its major, and either C++ ABI. Given an index, it also warns when the installed wheel was
yanked there since (`client.yank_status`).
"""

from __future__ import annotations

from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from attnforge.client.doctor_check import Check
from attnforge.client.interpreter import Interpreter, choose_interpreter, probe_environment
from attnforge.client.yank_status import yank_check
from attnforge.core.kernels import import_names
from attnforge.engine.environment import Env
from attnforge.matrix.arch_policy import wheel_runs_on
from attnforge.names import cuda_version, toolkit_variant
from attnforge.wheels.naming import PROJECT, cuda_minor_compatible, torch_family

EXTENSION = "flash_attn_2_cuda"


def extension_of(kernel: str) -> str:
    """The module `doctor` imports for a kernel: its compiled extension or the module that loads it."""
    return import_names(kernel)[0]


def _accel_of_toolkit(toolkit: str) -> str | None:
    return toolkit_variant(toolkit)


def diagnose(data: dict[str, Any], kernel: str = PROJECT) -> list[Check]:
    """The checks for one probe result (see the module docstring)."""
    env = Env.from_probe(data)
    fa = data.get("flash_attn") or {}
    checks: list[Check] = []
    exe = str((data.get("interpreter") or {}).get("path") or data.get("executable") or "python")
    if not fa.get("installed"):
        which_kernel = "" if kernel == PROJECT else f" --kernel {kernel}"
        return [
            Check(
                kernel,
                "fail",
                f"not installed in {exe}: `attnforge which --python {exe}{which_kernel} --index-url URL` names "
                "its wheel",
            )
        ]
    checks.append(Check(kernel, "ok", f"{fa['version']} at {fa.get('location')}"))
    record = fa.get("build_record") or {}
    inputs = record.get("inputs") or {}
    floor = inputs.get("torch_floor")  # a stable-ABI wheel
    if record:
        checks.append(
            Check("build record", "ok", f"cell {record.get('cell_id', '?')}, variant {record.get('variant')}")
        )
    else:
        checks.append(
            Check("build record", "warn", "no attnforge_build.json: not an attnforge wheel, fewer checks")
        )

    torch = data.get("torch") or {}
    if not torch.get("installed"):
        checks.append(
            Check(
                "torch",
                "fail",
                f"not importable: {torch.get('error', 'not installed')}; install it into this environment: "
                f"{exe} -m pip install torch",
            )
        )
    else:
        checks.append(Check("torch", "ok", f"{torch['version']} ({env.accel or 'CPU-only'})"))
        for raw in fa.get("requires") or []:
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                continue
            if canonicalize_name(req.name) != "torch" or req.marker is not None:
                continue
            try:
                ok = req.specifier.contains(Version(torch["version"]), prereleases=True)
            except InvalidVersion:
                ok = False
            status = "ok" if ok else "fail"
            checks.append(
                Check("torch requirement", status, f"wheel requires {req}, installed {torch['version']}")
            )
        if floor:
            have = torch_family(str(torch["version"]))
            ok = Version(have) >= Version(str(floor))
            checks.append(
                Check(
                    "torch release",
                    "ok" if ok else "fail",
                    f"stable-ABI wheel for torch >= {floor} (built with {inputs.get('torch')}), running {have}",
                )
            )
        elif inputs.get("torch"):
            built, have = torch_family(str(inputs["torch"])), torch_family(str(torch["version"]))
            status = "ok" if built == have else "fail"
            checks.append(
                Check("torch release", status, f"built against torch {inputs['torch']}, running {have}")
            )
        toolkit = str(inputs.get("toolkit") or "")
        want = _accel_of_toolkit(toolkit)
        if want:
            have_accel = env.accel or "a CPU-only build"
            if env.accel == want or (floor and env.accel and cuda_minor_compatible(env.accel, want)):
                checks.append(Check("accelerator", "ok", f"built with {toolkit}, torch is {env.accel}"))
            else:
                checks.append(
                    Check("accelerator", "fail", f"built with {toolkit}, torch here is {have_accel}")
                )
        if "cxx11_abi" in inputs and env.cxx11_abi is not None and not floor:
            ok = bool(inputs["cxx11_abi"]) == env.cxx11_abi
            checks.append(
                Check(
                    "C++ ABI",
                    "ok" if ok else "fail",
                    f"built cxx11abi={bool(inputs['cxx11_abi'])}, torch cxx11abi={env.cxx11_abi}",
                )
            )
    if floor and inputs.get("abi3_python"):
        ok = Version(env.python) >= Version(str(inputs["abi3_python"]))
        checks.append(
            Check(
                "python",
                "ok" if ok else "fail",
                f"abi3 wheel for Python >= {inputs['abi3_python']}, running {env.python}",
            )
        )
    elif inputs.get("python"):
        ok = str(inputs["python"]) == env.python
        checks.append(
            Check("python", "ok" if ok else "fail", f"built for {inputs['python']}, running {env.python}")
        )

    imp = fa.get("import") or {}
    module = extension_of(kernel)
    if imp.get("ok"):
        checks.append(Check(f"import {module}", "ok", str(imp.get("file"))))
    else:
        err = str(imp.get("error") or "not attempted")
        hint = ""
        if "undefined symbol" in err or "cannot open shared object" in err:
            hint = " (compiled against another torch build: install the wheel for this torch, see `attnforge which`)"
        checks.append(Check(f"import {module}", "fail", err + hint))

    arches = [str(a) for a in inputs.get("arches") or []]
    if not env.gpus:
        why = torch.get("gpu_error") or "no GPU visible"
        checks.append(Check("GPU arch", "skip", f"{why}; compiled for {', '.join(arches) or 'unknown'}"))
    elif not arches:
        checks.append(
            Check("GPU arch", "warn", f"GPU {', '.join(env.gpus)}; the wheel's arch list is unknown")
        )
    else:
        for gpu in env.gpus:
            how = wheel_runs_on(inputs, gpu)
            detail = f"GPU {gpu}, compiled for {', '.join(arches)}"
            if how == "ptx":
                detail += " (runs its embedded PTX: JIT-compiled by the driver at first use)"
            checks.append(Check("GPU arch", "ok" if how else "fail", detail))
    toolkit = str(inputs.get("toolkit") or "")
    cuda = cuda_version(toolkit)
    if env.driver_cuda and cuda is not None:
        need = Version(cuda)
        ok = Version(env.driver_cuda) >= need
        checks.append(
            Check("driver", "ok" if ok else "fail", f"driver supports CUDA {env.driver_cuda}, needs {need}")
        )
    elif cuda is not None:
        checks.append(Check("driver", "skip", "nvidia-smi not found"))
    return checks


def run_doctor(
    python: Interpreter | str | None = None, kernel: str = PROJECT, index_url: str | None = None
) -> tuple[dict[str, Any], list[Check]]:
    """Probe the environment of `python` (an Interpreter, or --python's value: `choose_interpreter`),
    importing the kernel's extension, and diagnose it; the first check names the interpreter and its torch.
    With `index_url`, also whether the installed wheel was yanked there since (`client.yank_status`)."""
    interp = python if isinstance(python, Interpreter) else choose_interpreter(python)
    module = extension_of(kernel)
    try:
        data, inspected = probe_environment(interp, kernel, module)
    except Exception as first:
        # the import itself may crash the interpreter: probe again without it and say so
        data, inspected = probe_environment(interp, kernel, "")
        data.setdefault("flash_attn", {})["import"] = {"ok": False, "error": f"the import crashed: {first}"}
    data["interpreter"] = inspected.to_json()  # diagnose's hints name it as the user gave it
    checks = [Check("interpreter", "ok", inspected.describe()), *diagnose(data, kernel)]
    fa = data.get("flash_attn") or {}
    if index_url and fa.get("installed"):
        checks.append(yank_check(index_url, kernel, str(fa["version"]), Env.from_probe(data)))
    return data, checks
