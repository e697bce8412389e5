"""A cell (one wheel to produce) and the names derived from it: variant, local version, wheel file, keys."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from attnforge import names
from attnforge.builder.patches import patch_scope, torch_free
from attnforge.matrix.schema import ProfileSpec
from attnforge.names import custom_torch_slug


@dataclass(frozen=True)
class Toolkit:
    """An accelerator toolkit: CUDA x.y or ROCm x.y."""

    kind: str  # "cuda" | "rocm"
    version: str  # "12.8"

    @classmethod
    def parse(cls, text: str) -> Toolkit:
        return cls(*names.split_toolkit(text))

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])

    @property
    def short(self) -> str:
        """cu128 / rocm6.4: PyTorch's own variant spelling."""
        return names.toolkit_variant(str(self)) or str(self)

    def __str__(self) -> str:
        return f"{self.kind}{self.version}"


@dataclass(frozen=True)
class Cell:
    """One wheel: kernel, torch, toolkit, Python, ABI, arches, profile, platform."""

    kernel: str
    kernel_version: str
    toolkit: Toolkit
    torch: str  # exact release, e.g. "2.14.1"
    python: str  # "3.11"
    cxx11_abi: bool
    arches: tuple[str, ...]
    profile: str
    platform: str = "x86_64"
    torch_variant: str | None = None  # the torch wheel variant it builds against (cu130, rocm6.4)
    torch_build: str | None = None  # an existing environment's exact torch (`2.11.0+cu130`, `2.10.0a0+5a8c`)
    torch_floor: str | None = (
        None  # a stable-ABI (abi3) wheel: the oldest torch it serves ("2.9"), set by a rule
    )
    abi3_python: str | None = None  # ... and the oldest CPython ("3.10"): its tag is cp310-abi3
    abi_request: str = field(
        default="torch", compare=False, hash=False
    )  # its target's `abi` (torch | stable)
    profile_spec: ProfileSpec = field(default_factory=lambda: ProfileSpec(), compare=False, hash=False)
    source_sha256: str | None = field(default=None, compare=False, hash=False)
    patches: tuple[str, ...] = field(default=(), compare=False, hash=False)
    source_kind: str = field(default="pypi-sdist", compare=False, hash=False)
    # the -gencode pairs the arch policy compiles (rule `arch-policy`); empty: the kernel's setup.py decides
    gencode: tuple[str, ...] = field(default=(), compare=False, hash=False)

    @property
    def torch_family(self) -> str:
        return ".".join(self.torch.split(".")[:2])

    @property
    def custom_torch(self) -> str | None:
        """For a torch build that is not a plain release wheel (a nightly, NGC's `2.10.0a0+<sha>`): its slug
        (`2100a05a8cd0ef`), which the local version and the variant carry; None for release wheels."""
        return custom_torch_slug(self.torch_build) if self.torch_build else None

    @property
    def cp(self) -> str:
        """`cp311`, or `cp314t` for a free-threaded CPython (its ABI tag; ids and venvs use it too)."""
        return "cp" + self.python.replace(".", "")

    @property
    def free_threaded(self) -> bool:
        """A free-threaded CPython (`3.14t`): its own ABI (`cp314t`), venv and binding; no abi3 wheel loads in
        it (PEP 703: the limited API is not available without the GIL)."""
        return self.python.endswith("t")

    @property
    def python_version(self) -> str:
        """The CPython release without the free-threading suffix: `3.14` for `3.14t`."""
        return self.python.removesuffix("t")

    @property
    def interpreter_tag(self) -> str:
        """The wheel's interpreter tag: `cp314` for both 3.14 and 3.14t (the `t` is in the ABI tag)."""
        return "cp" + self.python_version.replace(".", "")

    @property
    def stable_abi(self) -> bool:
        """One wheel for every torch >= torch_floor and CPython >= abi3_python (FA3 on torch >= 2.9)."""
        return self.torch_floor is not None

    @property
    def py_tag(self) -> str:
        """The wheel's interpreter tag: the cell's CPython, or the abi3 floor (cp310)."""
        return (
            "cp" + (self.abi3_python or "3.10").replace(".", "") if self.stable_abi else self.interpreter_tag
        )

    @property
    def name_parts(self) -> names.LocalParts:
        """The axes its variant and local version name (`attnforge.names` makes and parses both)."""
        if self.stable_abi:
            return names.LocalParts(
                accel=self.toolkit.short,
                torch_family=str(self.torch_floor),
                cxx11_abi=True,
                profile_tag=self.profile_tag,
                arches=tuple(a.replace("_", "") for a in self.arches),
                stable_abi=True,
            )
        return names.LocalParts(
            accel=self.toolkit.short,
            torch_family=self.torch_family,
            cxx11_abi=self.cxx11_abi,
            profile_tag=self.profile_tag,
            torch_build=self.custom_torch,
        )

    @property
    def variant(self) -> str:
        """Index/image family name: cu128-torch2.8 (+ -cxx11abiFALSE for the old ABI); a stable-ABI wheel names
        its toolkit, arches and torch floor instead of one torch release: cu130-sm90a-torch2.9abi3."""
        return self.name_parts.variant

    @property
    def profile_tag(self) -> str | None:
        return names.profile_tag(self.profile, self.profile_spec.tag, self.profile_spec.is_full)

    @property
    def local_version(self) -> str:
        """Upstream's habit (cu128torch2.8cxx11abiTRUE), `.pt<build>` for a custom torch build, then the
        profile tag when not full. A stable-ABI wheel: cu130sm90atorch2.9abi3[.tag] (toolkit, arches, floor)."""
        return self.name_parts.local_version

    @property
    def pure_python(self) -> bool:
        """A ROCm Triton-profile cell: setup.py declares no extension, the wheel is pure Python."""
        return self.toolkit.kind == "rocm" and self.profile_spec.rocm_backend == "triton"

    @property
    def wheel_tag(self) -> str:
        """`cp311-cp311-linux_x86_64`, `cp314-cp314t-linux_x86_64` (free-threaded), `cp310-abi3-linux_x86_64`
        (stable ABI), or `py3-none-any` for a pure-Python (Triton) cell."""
        if self.pure_python:
            return "py3-none-any"
        abi = "abi3" if self.stable_abi else self.cp
        return f"{self.py_tag}-{abi}-linux_{self.platform}"

    @property
    def wheel_name(self) -> str:
        dist = self.kernel.replace("-", "_")
        return f"{dist}-{self.kernel_version}+{self.local_version}-{self.wheel_tag}.whl"

    @property
    def arch_slug(self) -> str:
        return "-".join(a.replace("_", "") for a in self.arches)

    @property
    def id(self) -> str:
        abi = "abi1" if self.cxx11_abi else "abi0"
        torch = f"{self.torch}-pt{self.custom_torch}" if self.custom_torch else self.torch
        return (
            f"{self.kernel}-{self.kernel_version}-{self.toolkit.short}-torch{torch}-{self.cp}-{abi}"
            f"-{self.arch_slug}-{self.profile}-{self.platform}"
        )

    def compile_flags(self) -> list[str]:
        """Preprocessor flags the profile adds to every compile (FA2 and FA3 name them alike)."""
        return [f"-DFLASHATTENTION_DISABLE_{d.upper()}" for d in self.profile_spec.disable]

    @property
    def torch_free_kernels(self) -> bool:
        """Its kernel units include no torch header (a `torch_free` patch, rule `shared-kernels`): their
        objects serve every torch release of the CUDA lane, and the kernel-set key leaves torch out."""
        return torch_free(self.patches)

    def key_inputs(self, across_torch: bool = True) -> dict[str, object]:
        """What decides the compiled GPU code: Python never; torch only while the kernel units include it
        (`across_torch=False`: torch always, the key before kernels were shared across torch releases); for
        a stable-ABI wheel the torch floor, not the torch release it happens to build with, unless its
        kernel units are torch-free too (FA2's stable binding): then it shares the per-torch cells' key, as
        the same kernel objects serve both bindings. Patches that touch only the binding (scope `binding`:
        stable-abi, cxx20-binding, dispatch-subset-stable) are left out."""
        inputs: dict[str, object] = {
            "kernel": self.kernel,
            "version": self.kernel_version,
            "source_sha256": self.source_sha256,
            "patches": [p for p in self.patches if patch_scope(p) != "binding"],
            "toolkit": str(self.toolkit),
            "cxx11_abi": self.cxx11_abi,
            "arches": list(self.arches),
            "platform": self.platform,
            "profile": self.profile_spec.model_dump(exclude={"description"}),
        }
        if self.gencode:  # family targets and embedded PTX change the objects (absent: older keys still hold)
            inputs["gencode"] = list(self.gencode)
        shared = across_torch and self.torch_free_kernels
        if self.stable_abi and not shared:
            inputs.update(
                torch=f"stable-abi>={self.torch_floor}", torch_variant=None, abi3_python=self.abi3_python
            )
        elif not self.stable_abi and not shared:
            inputs.update(torch=self.torch, torch_variant=self.torch_variant)
            if self.custom_torch:
                inputs["torch_build"] = self.torch_build
        return inputs

    @property
    def kernel_set_key(self) -> str:
        """Cells with the same key link the same compiled kernel objects."""
        return _digest(self.key_inputs())

    @property
    def torch_kernel_set_key(self) -> str:
        """The key with torch always in it (what kernel sets were before sharing across torch releases)."""
        return _digest(self.key_inputs(across_torch=False))

    @property
    def binding_slug(self) -> str:
        """What the per-(torch, Python) part of a build is named by: `cp311-torch2.14.1[-pt<build>]`."""
        slug = f"{self.cp}-torch{self.torch}"
        return f"{slug}-pt{self.custom_torch}" if self.custom_torch else slug

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kernel": self.kernel,
            "kernel_version": self.kernel_version,
            "toolkit": str(self.toolkit),
            "torch": self.torch,
            "torch_variant": self.torch_variant,
            "torch_build": self.torch_build,
            "torch_floor": self.torch_floor,
            "python": self.python,
            "cxx11_abi": self.cxx11_abi,
            "arches": list(self.arches),
            "profile": self.profile,
            "platform": self.platform,
            "variant": self.variant,
            "local_version": self.local_version,
            "wheel": self.wheel_name,
            "kernel_set_key": self.kernel_set_key,
            "patches": list(self.patches),
            "gencode": list(self.gencode),
        }


def _digest(inputs: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
