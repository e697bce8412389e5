"""Compatibility rules: each marks a cell valid, or invalid with a reason naming the cell and the rule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from attnforge.builder.patches import patch_exists
from attnforge.core.arches import arch_number
from attnforge.core.kernels import features as kernel_features
from attnforge.matrix.arch_policy import compiled_targets
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import CompatData, KernelRelease, parse_version
from attnforge.names import cuda_variant


@dataclass(frozen=True)
class Problem:
    """One broken rule: its id, a sentence, and where the fact comes from."""

    rule: str
    message: str
    source: str = ""


@dataclass
class Verdict:
    """The outcome for one cell. `cell` carries what the rules decided (torch variant, patches)."""

    cell: Cell
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    served_by: str | None = None  # a valid cell whose wheel another cell builds (stable ABI: same file)

    @property
    def valid(self) -> bool:
        return not self.problems

    def reasons(self) -> list[str]:
        return [f"[{p.rule}] {p.message}" for p in self.problems]


Rule = Callable[[Verdict, CompatData], None]
RULES: list[tuple[str, Rule]] = []


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    """Register a rule under its id (ids appear in messages and docs/rules.md)."""

    def wrap(fn: Rule) -> Rule:
        RULES.append((rule_id, fn))
        return fn

    return wrap


# A stable-ABI cell whose torch has only newer CUDA builds of the toolkit's major: served, never a builder.
NEWER_RUNTIME = "served on a newer CUDA runtime"


def _fail(v: Verdict, rule_id: str, message: str, source: str = "") -> None:
    v.problems.append(Problem(rule_id, message, source))


@rule("kernel-known")
def _kernel_known(v: Verdict, data: CompatData) -> None:
    c = v.cell
    if data.kernel_release(c.kernel, c.kernel_version) is None:
        known = ", ".join(k.version for k in data.kernel if k.name == c.kernel) or "none"
        _fail(v, "kernel-known", f"{c.kernel} {c.kernel_version} has no compat row (known: {known})")


@rule("torch-python")
def _torch_python(v: Verdict, data: CompatData) -> None:
    t = data.torch_release(v.cell.torch)
    if t is None:  # a torch older than the tables: the Python's first torch may still rule it out
        py = data.python_release(v.cell.python)
        if py and parse_version(v.cell.torch) < parse_version(py.first_torch):
            _fail(
                v,
                "torch-python",
                f"torch {v.cell.torch} has no wheels for Python {v.cell.python} (the first torch with "
                f"Python {v.cell.python} wheels is {py.first_torch})",
                py.source,
            )
        return
    if v.cell.free_threaded:
        if v.cell.python_version not in t.free_threaded:
            shipped = ", ".join(f"{p}t" for p in t.free_threaded) or "none"
            _fail(
                v,
                "torch-python",
                f"torch {t.family} has no free-threaded wheels for Python {v.cell.python} ({v.cell.cp}; "
                f"free-threaded wheels: {shipped}): a free-threaded CPython is its own ABI and needs torch's "
                f"{v.cell.cp} build",
                t.source,
            )
        return
    if v.cell.python not in t.python:
        _fail(
            v,
            "torch-python",
            f"torch {t.family} has no wheels for Python {v.cell.python} (it ships {', '.join(t.python)})",
            t.source,
        )


@rule("torch-known")
def _torch_known(v: Verdict, data: CompatData) -> None:
    if data.torch_release(v.cell.torch) is None and not any(p.rule == "torch-python" for p in v.problems):
        known = ", ".join(t.family for t in data.torch)
        _fail(
            v,
            "torch-known",
            f"torch {v.cell.torch} is not in the compat data (known: {known}; a newer release goes into a "
            "--compat overlay: `attnforge docs compat-data`)",
        )


@rule("toolkit-known")
def _toolkit_known(v: Verdict, data: CompatData) -> None:
    tk = v.cell.toolkit
    row = data.cuda_toolkit(tk.version) if tk.kind == "cuda" else data.rocm_release(tk.version)
    if row is None:
        known = [f"cuda{c.version}" for c in data.cuda] + [f"rocm{r.version}" for r in data.rocm]
        _fail(
            v,
            "toolkit-known",
            f"{tk} is not in the compat data (known: {', '.join(known)}; a newer release goes into a "
            "--compat overlay: `attnforge docs compat-data`)",
        )


@rule("torch-abi")
def _torch_abi(v: Verdict, data: CompatData) -> None:
    t = data.torch_release(v.cell.torch)
    if t and v.cell.cxx11_abi not in t.cxx11_abi:
        shipped = "/".join("TRUE" if a else "FALSE" for a in t.cxx11_abi)
        want = "TRUE" if v.cell.cxx11_abi else "FALSE"
        _fail(
            v, "torch-abi", f"torch {t.family} pip wheels use cxx11abi={shipped} only, not {want}", t.source
        )


@rule("torch-toolkit")
def _torch_toolkit(v: Verdict, data: CompatData) -> None:
    """Pick the torch wheel variant the cell compiles against, or say why none fits."""
    c, t = v.cell, data.torch_release(v.cell.torch)
    if t is None:
        return
    tk = c.toolkit
    if tk.kind == "rocm":
        if tk.version not in t.rocm:
            _fail(
                v,
                "torch-toolkit",
                f"torch {t.family} was not published for ROCm {tk.version} (ROCm variants: {', '.join(t.rocm) or 'none'})",
                t.source,
            )
        else:
            v.cell = replace(c, torch_variant=tk.short)
        return
    variants = t.aarch64_cuda if c.platform == "aarch64" else t.cuda
    if c.platform == "aarch64" and not variants:
        _fail(v, "torch-toolkit", f"torch {t.family} has no aarch64 CUDA wheels", t.source)
        return
    same_major = sorted((x for x in variants if x.split(".")[0] == str(tk.major)), key=parse_version)
    if not same_major:
        _fail(
            v,
            "torch-toolkit",
            f"torch {t.family} has no CUDA {tk.major}.x wheels (variants: {', '.join(variants)}); an extension "
            f"must be compiled with the same CUDA major as torch",
            t.source,
        )
        return
    exact = tk.version in same_major
    lower = [x for x in same_major if parse_version(x) <= parse_version(tk.version)]
    if exact:
        chosen = tk.version
    elif lower:
        chosen = lower[-1]
        v.notes.append(
            f"CUDA {tk.version} has no torch {t.family} wheels of its own: compiled with nvcc {tk.version} against "
            f"torch's cu{chosen.replace('.', '')} build (CUDA minor-version compatibility)"
        )
    elif c.abi_request == "stable" and not c.free_threaded:
        # only a stable-ABI wheel compiled on another torch of this lane can serve it: rule stable-newer-runtime
        chosen = same_major[0]
        v.notes.append(
            f"{NEWER_RUNTIME}: torch {t.family}'s CUDA {tk.major} builds start at {chosen}; the lane's "
            f"stable-ABI wheel, compiled with nvcc {tk.version} on an older torch, runs on its cu"
            f"{chosen.replace('.', '')} runtime (CUDA minor-version compatibility), no compile for torch {t.family}"
        )
    else:
        _fail(
            v,
            "torch-toolkit",
            f"torch {t.family}'s oldest CUDA {tk.major} build is {same_major[0]}, newer than the toolkit "
            f"{tk.version}: compile with CUDA >= {same_major[0]}",
            t.source,
        )
        return
    variant = cuda_variant(chosen)
    abi = t.cxx11_abi_by_variant.get(variant)
    if abi is not None and abi != c.cxx11_abi:
        _fail(
            v,
            "torch-abi",
            f"torch {t.family}'s {variant} wheels use cxx11abi={'TRUE' if abi else 'FALSE'} only, not "
            f"{'TRUE' if c.cxx11_abi else 'FALSE'} (an extension must use the ABI of the torch it is built against)",
            t.source,
        )
        return
    v.cell = replace(c, torch_variant=variant)


@rule("toolkit-arch")
def _toolkit_arch(v: Verdict, data: CompatData) -> None:
    c = v.cell
    if c.toolkit.kind == "cuda":
        gfx = [a for a in c.arches if not a.startswith("sm_")]
        if gfx:
            _fail(v, "toolkit-arch", f"{', '.join(gfx)} are AMD arches; a CUDA cell needs sm_XX arches")
            return
        row = data.cuda_toolkit(c.toolkit.version)
        if row:
            missing = [a for a in c.arches if a not in row.arches]
            if missing:
                _fail(
                    v,
                    "toolkit-arch",
                    f"nvcc {c.toolkit.version} cannot target {', '.join(missing)} "
                    f"(it supports {row.arches[0]}..{row.arches[-1]})",
                    row.source,
                )
    else:
        sm = [a for a in c.arches if a.startswith("sm_")]
        if sm:
            _fail(v, "toolkit-arch", f"{', '.join(sm)} are NVIDIA arches; a ROCm cell needs gfx arches")
            return
        rrow = data.rocm_release(c.toolkit.version)
        if rrow:
            missing = [a for a in c.arches if a not in rrow.gfx]
            if missing:
                _fail(
                    v,
                    "toolkit-arch",
                    f"ROCm {rrow.version} does not support {', '.join(missing)}",
                    rrow.source,
                )


@rule("arch-policy")
def _arch_policy(v: Verdict, data: CompatData) -> None:
    """The compat table's arch policy for the kernel and toolkit: family targets (sm_100 from compute_100f on
    CUDA >= 12.9) and PTX of the newest arch, passed to nvcc as the cell's `-gencode` list."""
    c = v.cell
    if c.toolkit.kind != "cuda" or any(p.rule == "toolkit-arch" for p in v.problems):
        return
    targets = compiled_targets(c.kernel, c.toolkit.version, c.arches, data)
    plain = tuple(f"arch={a.replace('sm_', 'compute_')},code={a}" for a in c.arches)
    if targets.gencode and targets.gencode != plain:  # else setup.py's own flags compile the same
        v.cell = replace(c, gencode=targets.gencode)
        v.notes.append(
            f"arch policy for CUDA {c.toolkit.version}: compiles {', '.join(targets.gencode)}"
            + (f" (PTX {', '.join(targets.ptx)}: JIT on newer GPUs)" if targets.ptx else "")
        )


@rule("kernel-requirements")
def _kernel_requirements(v: Verdict, data: CompatData) -> None:
    c = v.cell
    k = data.kernel_release(c.kernel, c.kernel_version)
    if k is None:
        return
    if parse_version(c.torch_family) < parse_version(k.min_torch):
        why = f": {k.min_torch_reason}" if k.min_torch_reason else ""
        _fail(v, "kernel-requirements", f"{c.kernel} {k.version} needs torch >= {k.min_torch}{why}", k.source)
    if c.toolkit.kind == "cuda":
        if parse_version(c.toolkit.version) < parse_version(k.min_cuda):
            _fail(v, "kernel-requirements", f"{c.kernel} {k.version} needs CUDA >= {k.min_cuda}", k.source)
        elif k.recommended_cuda and parse_version(c.toolkit.version) < parse_version(k.recommended_cuda):
            v.notes.append(f"{c.kernel} {k.version}: upstream recommends CUDA >= {k.recommended_cuda}")
        _kernel_arches(v, k)
        low = [a for a in c.arches if a.startswith("sm_") and arch_number(a) < arch_number(k.min_arch)]
        if low:
            _fail(
                v,
                "kernel-requirements",
                f"{c.kernel} {k.version} needs {k.min_arch}+ (Ampere or newer); {', '.join(low)} is too old",
                k.source,
            )
    else:
        if k.rocm_min is None:
            _fail(v, "kernel-requirements", f"{c.kernel} {k.version} has no ROCm support", k.source)
        elif parse_version(c.toolkit.version) < parse_version(k.rocm_min):
            _fail(v, "kernel-requirements", f"{c.kernel} {k.version} needs ROCm >= {k.rocm_min}", k.source)


def _kernel_arches(v: Verdict, k: KernelRelease) -> None:
    """A kernel that compiles a fixed set of arches (FA3: sm_90a always, sm_80 optionally)."""
    c = v.cell
    if k.arches:
        other = [a for a in c.arches if a not in k.arches and a.startswith("sm_")]
        if other:
            _fail(
                v,
                "kernel-requirements",
                f"{c.kernel} {k.version} compiles only {', '.join(k.arches)}, not "
                f"{', '.join(other)} (sm_90a is Hopper with wgmma; sm_80 SASS also runs on sm_86/sm_89)",
                k.source,
            )
    missing = [a for a in k.required_arches if a not in c.arches]
    if missing:
        _fail(
            v,
            "kernel-requirements",
            f"every {c.kernel} {k.version} wheel compiles {', '.join(missing)}: add it to the cell's arches",
            k.source,
        )


@rule("offline-toolchain")
def _offline_toolchain(v: Verdict, data: CompatData) -> None:
    """A kernel whose setup.py downloads another compiler for this toolkit cannot build offline."""
    c = v.cell
    k = data.kernel_release(c.kernel, c.kernel_version)
    if k and c.toolkit.kind == "cuda" and c.toolkit.version in k.fetched_toolchain_cuda:
        usable = [
            t.version
            for t in data.cuda
            if parse_version(t.version) >= parse_version(k.min_cuda)
            and t.version not in k.fetched_toolchain_cuda
        ]
        _fail(
            v,
            "offline-toolchain",
            f"{c.kernel} {k.version}'s setup.py builds CUDA {c.toolkit.version} with an nvcc "
            "12.6 + ptxas 12.8 it downloads from NVIDIA at build time; attnforge builds without network "
            f"(patch fa3-offline): use CUDA {', '.join(usable)}",
            k.source,
        )


@rule("stable-abi")
def _stable_abi(v: Verdict, data: CompatData) -> None:
    """From its stable-ABI torch on, a kernel's cell is one cp3X-abi3 wheel for every torch >= that floor:
    always (FA3: `stable_abi_torch`), or when its target asks for it with `abi: stable` (FA2:
    `stable_binding_torch`, built with the `stable_binding_patch`)."""
    c = v.cell
    k = data.kernel_release(c.kernel, c.kernel_version)
    if k is None:
        return
    floor, patch = k.stable_abi_torch, None
    if floor is None and c.abi_request == "stable":
        floor, patch = _stable_binding(v, k)
    if floor is None or c.toolkit.kind != "cuda":
        return
    if c.free_threaded and parse_version(c.torch_family) >= parse_version(floor):
        if patch:  # FA2's opt-in stable binding: this cell keeps the per-torch one
            v.notes.append(
                f"abi: stable, but Python {c.python} is free-threaded: no abi3 wheel loads in it (the limited "
                f"API needs the GIL; PEP 703): a per-torch {c.cp} wheel"
            )
        else:
            _fail(
                v,
                "stable-abi",
                f"{c.kernel} {k.version} builds only cp{(k.abi3_python or '3.10').replace('.', '')}-abi3 wheels "
                f"from torch {floor} on, and a free-threaded CPython ({c.python}) loads no abi3 extension "
                "(the limited API needs the GIL; PEP 703)",
                k.source,
            )
        return
    if parse_version(c.torch_family) < parse_version(floor):
        if patch:
            v.notes.append(
                f"abi: stable, but torch {c.torch_family} is older than {c.kernel} {k.version}'s stable-ABI "
                f"floor {floor} (torch/csrc/stable ops it calls): a per-torch wheel for torch {c.torch_family}"
            )
        return  # FA3: kernel-requirements says why
    floor_py = k.abi3_python or "3.10"
    if parse_version(c.python_version) < parse_version(floor_py):
        _fail(
            v,
            "stable-abi",
            f"{c.kernel} {k.version} wheels are cp{floor_py.replace('.', '')}-abi3: Python "
            f"{c.python} is older",
            k.source,
        )
        return
    patches = tuple(sorted({*c.patches, patch})) if patch else c.patches
    v.cell = replace(c, torch_floor=floor, abi3_python=floor_py, patches=patches)
    binding = f" (patch '{patch}')" if patch else ""
    v.notes.append(
        f"stable ABI{binding}: one {v.cell.wheel_tag} wheel serves torch >= {floor} and "
        f"Python >= {floor_py}; built here with torch {c.torch} and Python {c.python}"
    )


@rule("stable-newer-runtime")
def _stable_newer_runtime(v: Verdict, data: CompatData) -> None:
    """A cell let through rule torch-toolkit on the promise of a stable-ABI wheel must have become one."""
    if v.cell.stable_abi or not any(n.startswith(NEWER_RUNTIME) for n in v.notes):
        return
    t = data.torch_release(v.cell.torch)
    oldest = v.cell.torch_variant or "?"
    _fail(
        v,
        "torch-toolkit",
        f"torch {v.cell.torch_family}'s oldest CUDA {v.cell.toolkit.major} build is {oldest}, newer than the "
        f"toolkit {v.cell.toolkit.version}, and this cell gets no stable-ABI wheel: compile with a newer CUDA",
        t.source if t else "",
    )


def _stable_binding(v: Verdict, k: KernelRelease) -> tuple[str | None, str | None]:
    """The torch floor and patch of a kernel's opt-in stable-ABI binding, or (None, None) with a note saying
    why the cell keeps the per-torch one."""
    c = v.cell
    if not k.stable_binding_torch or not k.stable_binding_patch:
        v.notes.append(
            f"abi: stable, but {c.kernel} {k.version} has no stable-ABI binding: a per-torch wheel"
        )
        return None, None
    if c.toolkit.kind != "cuda":
        v.notes.append(f"abi: stable, but the stable-ABI binding is CUDA only: a per-torch {c.toolkit} wheel")
        return None, None
    return k.stable_binding_torch, k.stable_binding_patch


@rule("profile")
def _profile(v: Verdict, data: CompatData) -> None:
    c, spec = v.cell, v.cell.profile_spec
    k = data.kernel_release(c.kernel, c.kernel_version)
    if spec.head_dims and k:
        bad = [d for d in spec.head_dims if d not in k.head_dims]
        if bad:
            _fail(
                v, "profile", f"profile '{c.profile}': {c.kernel} {k.version} has no head dim {bad}", k.source
            )
    if spec.disable and k and k.disable_macros:
        unsupported = [d for d in spec.disable if d.upper() not in k.disable_macros]
        if unsupported:
            _fail(
                v,
                "profile",
                f"profile '{c.profile}': {c.kernel} {k.version} has no FLASHATTENTION_DISABLE_ "
                f"macro for {', '.join(unsupported)} (it can leave out {', '.join(kernel_features(c.kernel))})",
                k.source,
            )
    if spec.dtypes and k:
        bad_dt = [d for d in spec.dtypes if d not in k.dtypes]
        lacking = [d for d in k.always_dtypes if d not in spec.dtypes]
        if bad_dt:
            _fail(
                v,
                "profile",
                f"profile '{c.profile}': {c.kernel} {k.version} has no {', '.join(bad_dt)} "
                f"kernels (dtypes: {', '.join(k.dtypes)})",
                k.source,
            )
        if lacking:
            _fail(
                v,
                "profile",
                f"profile '{c.profile}': {c.kernel} {k.version} always compiles "
                f"{', '.join(lacking)} (no switch turns it off): list it in dtypes",
                k.source,
            )
    if "sm80" in spec.disable and "sm_80" in c.arches:
        _fail(
            v, "profile", f"profile '{c.profile}' disables the sm80 path, but the cell's arches include sm_80"
        )
    if c.toolkit.kind == "cuda" and spec.rocm_backend:
        _fail(v, "profile", f"profile '{c.profile}' sets rocm_backend, but {c.toolkit} is a CUDA toolkit")
    if c.toolkit.kind == "rocm":
        backend = spec.rocm_backend or "ck"
        if k and backend not in k.rocm_backends:
            _fail(v, "profile", f"{c.kernel} {k.version} has no ROCm '{backend}' backend", k.source)
        elif k:
            allowed = k.ck_gfx if backend == "ck" else k.triton_amd_gfx
            bad_gfx = [a for a in c.arches if allowed and a not in allowed]
            if bad_gfx:
                _fail(
                    v,
                    "profile",
                    f"the {backend} backend of {c.kernel} {k.version} does not support {', '.join(bad_gfx)} "
                    f"(supports {', '.join(allowed)})",
                    k.source,
                )


@rule("shared-kernels")
def _shared_kernels(v: Verdict, data: CompatData) -> None:
    """A CUDA cell of a kernel release with a torch-free patch compiles its kernel units without torch: the
    patch joins the cell and the kernel-set key leaves torch out (kernels compiled once per CUDA lane). The
    note says why, with the torch release's Philox layout that the binding converts from."""
    c = v.cell
    k = data.kernel_release(c.kernel, c.kernel_version)
    if k and k.torch_free_patch and c.toolkit.kind == "cuda":
        v.cell = replace(c, patches=tuple(sorted({*c.patches, k.torch_free_patch})))
        t = data.torch_release(c.torch)
        layout = t.philox_offset_intragraph if t else None
        state = f"{layout} offset_intragraph_" if layout else "its layout checked when the binding compiles"
        v.notes.append(
            f"kernel units without torch (patch '{k.torch_free_patch}'): their objects serve every torch "
            f"release and Python of this CUDA lane; the binding converts torch {c.torch_family}'s Philox state "
            f"({state}) to the kernels' own"
        )


@rule("cxx-standard")
def _cxx_standard(v: Verdict, data: CompatData) -> None:
    """torch >= 2.14 headers need C++20; flash-attn hard-codes C++17: the build applies the cxx20 patch, or
    cxx20-binding (the binding only) when the kernel units no longer include torch."""
    c = v.cell
    t = data.torch_release(c.torch)
    k = data.kernel_release(c.kernel, c.kernel_version)
    if t and k and t.cxx_std > k.cxx_std and (k.torch_headers == "stable" or c.stable_abi):
        v.notes.append(
            f"torch {t.family} headers need C++{t.cxx_std}, but {c.kernel} {k.version} includes only torch's "
            f"stable headers, which compile as C++{k.cxx_std}: no patch"
        )
    elif t and k and t.cxx_std > k.cxx_std:
        name = f"cxx{t.cxx_std}"
        if c.torch_free_kernels and patch_exists(f"{name}-binding"):
            name += "-binding"
        v.cell = replace(c, patches=tuple(sorted({*c.patches, name})))
        v.notes.append(
            f"torch {t.family} headers need C++{t.cxx_std} but {c.kernel} {k.version} compiles with "
            f"C++{k.cxx_std}: patch '{name}' applied"
        )


# Rules about PyPI's torch wheels, which a build against an installed torch answers by itself: that torch
# exists, runs this Python, has this ABI and was built for this toolkit (the env backend).
ENVIRONMENT_ANSWERS = frozenset({"torch-known", "torch-python", "torch-abi", "torch-toolkit"})


def host_compiler_problem(toolkit: Toolkit, image: str, data: CompatData) -> Problem | None:
    """Rule `host-compiler`: a CUDA toolkit's crt/host_config.h rejects gcc majors above its `max_gcc`, so a
    builder base must offer a g++ at or below it. None when it does, or when the base's OS (from its tag) or
    the toolkit's limit is unknown."""
    row = data.cuda_toolkit(toolkit.version) if toolkit.kind == "cuda" else None
    base_os = data.os_of_image(image)
    if row is None or row.max_gcc is None or base_os is None:
        return None
    if any(n <= row.max_gcc for n in base_os.gcc):
        return None
    offered = ", ".join(str(n) for n in base_os.gcc)
    return Problem(
        "host-compiler",
        f"CUDA {toolkit.version} accepts gcc <= {row.max_gcc} (crt/host_config.h), but its builder base {image} "
        f"({base_os.name}) offers g++ {offered} only: pick another base with build.base_images.{toolkit}",
        f"{row.source}; {base_os.source}",
    )


def check(cell: Cell, data: CompatData, answered: frozenset[str] = frozenset()) -> Verdict:
    """Run every rule on a cell, but those the caller's environment has `answered` (noted as such)."""
    verdict = Verdict(cell)
    for rule_id, fn in RULES:
        if rule_id in answered:
            verdict.notes.append(f"[{rule_id}] answered by the environment's own torch")
            continue
        fn(verdict, data)
    return verdict
