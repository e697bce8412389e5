"""`attnforge wheels finalize`: make a freshly built wheel install right, and say so in its manifest.

For one wheel and its manifest:
1. check the Python/ABI tags and the extension modules' suffixes against the cell's Python;
2. `auditwheel repair` with torch's and the CUDA/ROCm runtime's libraries excluded (they come from the
   torch wheel), taking `manylinux_2_X` when true, else keeping `linux_<arch>` with the reason; a pure
   wheel (ROCm Triton profile) must be `py3-none-any` with no compiled file, and skips auditwheel;
3. rewrite: local version naming the variant (`+cu130torch2.14cxx11abiTRUE[.tag]`, or for a stable-ABI
   wheel `+cu130sm90atorch2.9abi3[.tag]`, added or repaired), `Requires-Dist: torch==X.Y.*` (a custom torch
   build: `torch==<that build>`; a stable-ABI wheel: `torch>=2.9`), the build record
   `<dist-info>/attnforge_build.json`, RECORD regenerated,
   members sorted with SOURCE_DATE_EPOCH timestamps (same input, same bytes);
4. the glibc floor: no compiled file needs a symbol version above the manylinux policy of the torch wheel
   the cell pins (its tags, recorded by the builder; `glibc_floor`);
5. verify: every RECORD hash, the core metadata (packaging, strict), `check-wheel-contents`;
6. write the manifest (`wheel`, `sha256`, `size`, `platform_tag`, `finalize`) beside the new wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

from packaging.metadata import ExceptionGroup as MetadataErrors
from packaging.metadata import InvalidMetadata, Metadata
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from attnforge.builder.files import sha256_file
from attnforge.builder.importcheck import NATIVE_SUFFIXES
from attnforge.core.errors import BuildError, EnvironmentProblem
from attnforge.wheels.glibc_floor import FloorCheck, check_contents
from attnforge.wheels.manifest import manifest_path_for, read_manifest, write_manifest
from attnforge.wheels.naming import TORCH_PROJECT, WheelNames, expected_names, parse_local
from attnforge.wheels.wheelio import Member, WheelContents, read_wheel, source_date_epoch, write_wheel

BUILD_RECORD = "attnforge_build.json"

# Shared libraries a torch extension links that the torch wheel (and its nvidia-*/ROCm dependencies)
# provides at run time: never grafted into our wheel (auditwheel --exclude, wildcards allowed).
TORCH_PROVIDED_LIBS: tuple[str, ...] = (
    "libtorch*.so*",
    "libc10*.so*",
    "libshm.so*",
    "libcuda.so*",
    "libcudart.so*",
    "libcublas*.so*",
    "libcudnn*.so*",
    "libcufft*.so*",
    "libcufile*.so*",
    "libcurand*.so*",
    "libcusolver*.so*",
    "libcusparse*.so*",
    "libnccl*.so*",
    "libnvrtc*.so*",
    "libnvJitLink*.so*",
    "libnvToolsExt*.so*",
    "libnvshmem*.so*",
    "libcupti*.so*",
    "libamdhip64.so*",
    "libhiprtc*.so*",
    "libhipblas*.so*",
    "librocblas*.so*",
    "libMIOpen*.so*",
    "librccl*.so*",
    "libroctx*.so*",
    "libaotriton*.so*",
)

# Keys of the manifest copied into the wheel's build record (not the bytes' own hash, nor timings).
_RECORD_KEYS = (
    "schema",
    "cell_id",
    "variant",
    "kernel",
    "kernel_version",
    "inputs",
    "kernel_set_key",
    "input_hash",
    "toolchain",
    "rocm",
)
PURE_REASON = "pure Python (py3-none-any): no compiled code, auditwheel not needed"

_EXT_SUFFIX_RE = re.compile(r"\.(cpython-(?P<py>\d+)[^.]*|abi3)\.so$")


@dataclass
class AuditResult:
    """What auditwheel decided."""

    platform_tags: list[str]
    reason: str
    repaired: Path | None
    excluded: list[str] = field(default_factory=list)


@dataclass
class FinalizeResult:
    """The finalized wheel and what changed."""

    wheel: Path
    manifest: Path
    names: WheelNames
    platform_tag: str
    platform_reason: str
    sha256: str
    size: int
    changes: list[str]


Log = Callable[[str], None]


def _noop(_: str) -> None:
    return None


def _tool(module: str, hint_pkg: str) -> list[str]:
    """`python -m module` for a tool installed beside attnforge."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise EnvironmentProblem(f"{hint_pkg} is not installed", hint="pip install 'attnforge[publish]'")
    return [sys.executable, "-m", module]


def audit(wheel: Path, workdir: Path, arch: str, extra_excludes: Sequence[str] = ()) -> AuditResult:
    """`auditwheel repair --plat auto` with torch's libraries excluded; on refusal keep `linux_<arch>`."""
    patcher = "patchelf" if shutil.which("patchelf") else "none"
    cmd = [
        *_tool("auditwheel", "auditwheel"),
        "repair",
        "--plat",
        "auto",
        "--patcher",
        patcher,
        "-w",
        str(workdir),
    ]
    for pattern in (*TORCH_PROVIDED_LIBS, *extra_excludes):
        cmd += ["--exclude", pattern]
    cmd.append(str(wheel))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    output = proc.stdout + proc.stderr
    excluded = sorted(set(re.findall(r"Excluding (\S+)", output)))
    produced = sorted(workdir.glob("*.whl"))
    if proc.returncode == 0 and produced:
        tags = sorted({t.platform for t in parse_wheel_filename(produced[0].name)[3]})
        best = tags[-1] if tags else f"linux_{arch}"
        libs = f"; not grafted (provided by torch): {', '.join(excluded)}" if excluded else ""
        return AuditResult(tags, f"auditwheel repair: consistent with {best}{libs}", produced[0], excluded)
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.startswith("INFO:")]
    why = next((ln for ln in reversed(lines) if "error" in ln.lower() or "cannot" in ln.lower()), None)
    why = why or (lines[-1] if lines else f"auditwheel exited {proc.returncode}")
    if patcher == "none" and "patcher" in output:
        why += " (install patchelf to let auditwheel graft non-torch libraries)"
    return AuditResult([f"linux_{arch}"], f"auditwheel refused a manylinux tag: {why}", None, excluded)


def _check_python_tags(contents: WheelContents, names: WheelNames, tags: frozenset[Any]) -> None:
    interpreters = {t.interpreter for t in tags}
    abis = {t.abi for t in tags}
    if interpreters != {names.python_tag}:
        raise BuildError(
            f"{contents.filename}: Python tag {'.'.join(sorted(interpreters))} but the cell is "
            f"{names.python_tag}: the build used the wrong interpreter"
        )
    if names.abi_tag == "abi3" and abis != {"abi3"}:
        raise BuildError(
            f"{contents.filename}: ABI tag {'.'.join(sorted(abis))}, but the cell is a stable-ABI wheel "
            f"({names.wheel_tag}): the build did not use the limited API"
        )
    if abis not in ({names.python_tag}, {"abi3"}):
        raise BuildError(f"{contents.filename}: ABI tag {'.'.join(sorted(abis))} is not {names.python_tag}")
    digits = names.python_tag[2:]
    for member in contents.members:
        m = _EXT_SUFFIX_RE.search(member)
        if m and m["py"] and m["py"] != digits:
            raise BuildError(f"{contents.filename}: {member} is compiled for CPython {m['py']}, not {digits}")


def _check_pure(contents: WheelContents, names: WheelNames, tags: frozenset[Any]) -> None:
    """A pure cell's wheel: exactly `py3-none-any`, Root-Is-Purelib, no compiled member."""
    tag = ".".join(sorted(str(t) for t in tags))
    if tag != names.wheel_tag:
        raise BuildError(
            f"{contents.filename}: tag {tag}, but a {names.local_version} wheel (ROCm Triton) must be "
            f"{names.wheel_tag}: the build compiled an extension (FLASH_ATTENTION_TRITON_AMD_ENABLE unset?)"
        )
    wheel_meta = contents.message(f"{contents.dist_info}/WHEEL")
    if str(wheel_meta.get("Root-Is-Purelib", "")).strip().lower() != "true":
        raise BuildError(f"{contents.filename}: Root-Is-Purelib is not true in a pure wheel")
    native = [m for m in contents.members if m.lower().endswith(NATIVE_SUFFIXES)]
    if native:
        raise BuildError(f"{contents.filename}: compiled files in a pure wheel: {', '.join(native[:5])}")


def _rewrite_metadata(msg: Message, names: WheelNames, changes: list[str]) -> bytes:
    """Version with the local segment, and the cell's torch requirement (`WheelNames.torch_requirement`)."""
    old_version = msg.get("Version", "")
    if old_version != names.version:
        msg.replace_header("Version", names.version)
    requires = msg.get_all("Requires-Dist") or []
    del msg["Requires-Dist"]
    pinned = False
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            raise BuildError(f"METADATA has an invalid Requires-Dist: {line!r}") from None
        if canonicalize_name(req.name) == TORCH_PROJECT and req.marker is None:
            if not pinned:
                msg["Requires-Dist"] = names.torch_requirement
                if str(req.specifier) != names.torch_requirement.removeprefix(TORCH_PROJECT):
                    changes.append(f"Requires-Dist: {line} -> {names.torch_requirement}")
                pinned = True
            continue
        msg["Requires-Dist"] = line
    if not pinned:
        msg["Requires-Dist"] = names.torch_requirement
        changes.append(f"Requires-Dist: added {names.torch_requirement}")
    return msg.as_bytes()


def _rewrite_wheel_file(msg: Message, py: str, abi: str, plats: list[str], build: str | None) -> bytes:
    del msg["Tag"]
    del msg["Build"]
    for plat in plats:
        msg["Tag"] = f"{py}-{abi}-{plat}"
    if build:
        msg["Build"] = build
    return msg.as_bytes()


def build_record(manifest: dict[str, Any], names: WheelNames, platform_tag: str) -> bytes:
    """The JSON installed with the wheel: what `attnforge doctor` compares the environment against."""
    record = {k: manifest[k] for k in _RECORD_KEYS if k in manifest}
    record.update(
        {
            "dist_version": names.version,
            "local_version": names.local_version,
            "variant": names.variant,
            "torch_requirement": names.torch_requirement,
            "platform_tag": platform_tag,
        }
    )
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8")


def check_wheel_contents(wheel: Path, toplevel: Sequence[str]) -> None:
    """Run check-wheel-contents; the toplevel list is given (flash-attn ships a package and an extension)."""
    cmd = [*_tool("check_wheel_contents", "check-wheel-contents"), "--no-config"]
    if toplevel:
        cmd += ["--toplevel", ",".join(toplevel)]
    proc = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"check-wheel-contents: {(proc.stdout + proc.stderr).strip()}")


def validate_metadata(raw: bytes, where: str) -> Metadata:
    """Parse core metadata strictly (packaging); BuildError listing the problems."""
    try:
        return Metadata.from_email(raw, validate=True)
    except (InvalidMetadata, MetadataErrors) as exc:
        problems = getattr(exc, "exceptions", [exc])
        raise BuildError(f"{where}: invalid METADATA: {'; '.join(str(p) for p in problems)}") from None


def finalize(
    wheel: Path,
    manifest: Path | None = None,
    out_dir: Path | None = None,
    *,
    extra_excludes: Sequence[str] = (),
    keep_input: bool = False,
    log: Log = _noop,
) -> FinalizeResult:
    """Finalize `wheel` (see the module docstring); returns the new wheel and its manifest."""
    src = wheel.resolve()
    if not src.is_file():
        raise BuildError(f"{wheel}: no such wheel")
    manifest_in = (manifest or manifest_path_for(src)).resolve()
    data = read_manifest(manifest_in)
    try:
        dist, version, build, tags = parse_wheel_filename(src.name)
    except InvalidWheelFilename as exc:
        raise BuildError(f"{src.name}: {exc}") from None
    local = src.name.split("-")[1].partition("+")[2]  # as spelled (packaging lower-cases it)
    names = expected_names(data, local or None)
    if canonicalize_name(dist) != canonicalize_name(names.dist):
        raise BuildError(f"{src.name}: distribution {dist} is not {names.dist}")
    if version.public != Version(str(data["kernel_version"])).public:
        raise BuildError(
            f"{src.name}: version {version.public} but the manifest says {data['kernel_version']}"
        )
    changes: list[str] = []
    if not local:
        changes.append(f"local version: added +{names.local_version}")
    elif local.lower() != names.local_version.lower():
        parts = parse_local(local)
        what = "not an attnforge local version" if parts is None else f"names variant {parts.variant}"
        changes.append(f"local version: replaced +{local} ({what}) with +{names.local_version}")
        log(f"warning: {src.name}: local version +{local} is wrong for this cell; repaired")

    contents_in = read_wheel(src)
    plats_in = sorted({t.platform for t in tags})
    if names.pure_python:
        _check_pure(contents_in, names, tags)
    else:
        _check_python_tags(contents_in, names, tags)
        if not all(p.endswith("_" + names.platform) for p in plats_in):
            raise BuildError(f"{src.name}: platform {'.'.join(plats_in)} is not {names.platform}")
    py = next(iter(tags)).interpreter
    abi = next(iter(tags)).abi

    out = (out_dir or src.parent).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if names.pure_python:
        result, contents = AuditResult(["any"], PURE_REASON, None), contents_in
    else:
        with tempfile.TemporaryDirectory(prefix=".audit-", dir=out) as tmp:
            result = audit(src, Path(tmp), names.platform, extra_excludes)
            contents = read_wheel(result.repaired) if result.repaired else contents_in
    floor = FloorCheck(None, PURE_REASON)
    if not names.pure_python:
        torch_tags = ((data.get("build") or {}).get("glibc_floor") or {}).get("torch_wheel_tags") or []
        floor = check_contents(contents, list(torch_tags), names.platform, src.name)
        log(f"{src.name}: glibc floor {floor.floor or '-'} ({floor.source}); needs {floor.highest}")
    if plats_in != result.platform_tags:
        changes.append(f"platform tag: {'.'.join(plats_in)} -> {'.'.join(result.platform_tags)}")
    log(f"{src.name}: {result.reason}")

    new_dist_info = f"{names.dist}-{names.version}.dist-info"
    members: dict[str, Member] = {}
    for name, member in contents.members.items():
        if name.endswith((".pyc", ".pyo")) or "/__pycache__/" in f"/{name}":
            changes.append(f"dropped bytecode {name}")
            continue
        if name.startswith(contents.dist_info + "/"):
            name = new_dist_info + name[len(contents.dist_info) :]
        members[name] = member
    metadata_name = f"{new_dist_info}/METADATA"
    wheel_name = f"{new_dist_info}/WHEEL"
    if metadata_name not in members or wheel_name not in members:
        raise BuildError(f"{src.name}: .dist-info lacks METADATA or WHEEL")
    build_tag = f"{build[0]}{build[1]}" if build else None
    renamed = WheelContents(contents.filename, new_dist_info, members)
    members[metadata_name] = Member(_rewrite_metadata(renamed.message(metadata_name), names, changes))
    members[wheel_name] = Member(
        _rewrite_wheel_file(renamed.message(wheel_name), py, abi, result.platform_tags, build_tag)
    )
    platform_tag = ".".join(result.platform_tags)
    members[f"{new_dist_info}/{BUILD_RECORD}"] = Member(build_record(data, names, platform_tag))

    build_part = f"-{build_tag}" if build_tag else ""
    filename = f"{names.dist}-{names.version}{build_part}-{py}-{abi}-{platform_tag}.whl"
    epoch = source_date_epoch()
    # written and verified in a staging folder first: a failed check never replaces anything in `out`
    with tempfile.TemporaryDirectory(prefix=".finalized-", dir=out) as staging:
        staged = write_wheel(Path(staging), filename, new_dist_info, members, epoch)
        written = read_wheel(staged)
        validate_metadata(written.members[metadata_name].data, staged.name)
        check_wheel_contents(staged, written.toplevel())
        final = out / filename
        os.replace(staged, final)
    digest, size = sha256_file(final), final.stat().st_size

    data.update(
        {
            "variant": data.get("variant") or names.variant,
            "local_version": names.local_version,
            "wheel": final.name,
            "sha256": digest,
            "size": size,
            "platform_tag": {"tag": platform_tag, "reason": result.reason},
            "finalize": {
                "torch_requirement": names.torch_requirement,
                "source_date_epoch": epoch,
                "excluded_libs": result.excluded,
                "glibc_floor": floor.record(),
                "checks": [
                    "record",
                    "metadata",
                    "pure-python" if names.pure_python else "auditwheel",
                    *([] if floor.floor is None else ["glibc-floor"]),
                    "check-wheel-contents",
                ],
                "changes": changes,
            },
        }
    )
    if data["variant"] != names.variant:
        raise BuildError(
            f"{src.name}: manifest variant {data['variant']} but the inputs name {names.variant}"
        )
    manifest_out = manifest_path_for(final)
    write_manifest(manifest_out, data)
    if final != src and src.parent == final.parent and not keep_input:
        src.unlink()
        if manifest_in != manifest_out and manifest_in == manifest_path_for(src):
            manifest_in.unlink(missing_ok=True)
    return FinalizeResult(final, manifest_out, names, platform_tag, result.reason, digest, size, changes)


def finalize_built(
    built: Path, manifest: dict[str, Any], out_dir: Path, *, log: Log = _noop
) -> FinalizeResult:
    """For the build engine: finalize `built` into `out_dir`, given its manifest as a dict.

    A copy of the wheel and the manifest go to `out_dir`, then `finalize` replaces the copy with the
    finalized wheel; `built` itself is left alone.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / built.name
    if target.resolve() != built.resolve():
        shutil.copy2(built, target)
    write_manifest(manifest_path_for(target), {**manifest, "wheel": target.name})
    return finalize(target, None, out_dir, log=log)


def verify(wheel: Path) -> list[str]:
    """Check a finalized wheel without changing it; returns the problems (empty when fine)."""
    problems: list[str] = []
    try:
        contents = read_wheel(wheel)
        data = read_manifest(manifest_path_for(wheel))
        names = expected_names(data, wheel.name.split("-")[1].partition("+")[2] or None)
    except BuildError as exc:
        return [str(exc)]
    meta = contents.message(f"{contents.dist_info}/METADATA")
    if meta.get("Version", "").lower() != names.version.lower():
        problems.append(f"METADATA Version {meta.get('Version')} is not {names.version}")
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    torch_reqs = [str(r) for r in reqs if canonicalize_name(r.name) == TORCH_PROJECT and r.marker is None]
    if torch_reqs != [names.torch_requirement]:
        problems.append(f"torch requirement {torch_reqs or 'missing'} is not [{names.torch_requirement!r}]")
    if f"{contents.dist_info}/{BUILD_RECORD}" not in contents.members:
        problems.append(f"no {BUILD_RECORD} in {contents.dist_info}")
    if names.pure_python:
        try:
            _check_pure(contents, names, parse_wheel_filename(wheel.name)[3])
        except (BuildError, InvalidWheelFilename) as exc:
            problems.append(str(exc))
    digest, size = sha256_file(wheel), wheel.stat().st_size
    if (data.get("sha256"), data.get("size"), data.get("wheel")) != (digest, size, wheel.name):
        problems.append("manifest sha256/size/wheel do not match the file")
    try:
        validate_metadata(contents.members[f"{contents.dist_info}/METADATA"].data, wheel.name)
        check_wheel_contents(wheel, contents.toplevel())
    except BuildError as exc:
        problems.append(str(exc))
    return problems
