"""NGC-based images: flash-attn compiled on an NGC PyTorch base against that base's own torch by attnforge's
builder (the env backend's way: `use_interpreter`), finalized on the host like every wheel, then installed
in place of NGC's bundled flash-attn (policy `replace`), or NGC's kept as it is (policy `keep`).

`ngc_request` picks the NGC release of a planned cell; `apply_ngc_facts` takes what the probed base holds:
the cell aimed at its torch (`backends.env.environment_cell`: a custom build such as `2.8.0a0+5228986c39` is
named `.pt<build>` and pinned exactly), labels and smoke expectations; `compile_on_base` builds the
`wheel` target of docker/ngc.Dockerfile (context: the builder package, spec.json, the source archive; no
network) with `--output type=local`, writes the manifest (`build.backend: "env"`) and finalizes the wheel.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnforge.builder.files import sha256_file
from attnforge.builder.settings import BuildSettings
from attnforge.builder.spec import BuildSpec, Source
from attnforge.core import log_context
from attnforge.core.docker_cli import Docker
from attnforge.core.errors import BuildError, ConfigurationError, EnvironmentProblem
from attnforge.engine.backends.env import environment_cell
from attnforge.engine.jobs import BUILDER_DIR, SOURCE_DATE_EPOCH, CellJob, input_hash, make_spec
from attnforge.engine.resources import JobMemoryTable, Machine, detect_machine
from attnforge.engine.settings import Requested, resolve_settings
from attnforge.engine.wheel_record import build_manifest
from attnforge.images.ngc import BaseFacts, select_release
from attnforge.images.requests import ImageRequest, Skipped
from attnforge.images.tags import ImageSpec
from attnforge.matrix.cell import Cell
from attnforge.matrix.compat import NgcRelease
from attnforge.matrix.project import Project
from attnforge.matrix.schema import ProfileSpec, ResourcesSpec
from attnforge.names import cuda_variant
from attnforge.wheels.finalize import finalize_built
from attnforge.wheels.manifest import read_manifest
from attnforge.wheels.naming import cell_from_manifest

Log = Callable[[str], None]

# Paths inside the `build` stage: the context's attnforge/ is bind-mounted read-only at MOUNT.
MOUNT = "/opt/attnforge"
WORK = "/tmp/attnforge-build"
OUT = "/opt/attnforge-out"
_SKIP_SOURCE = shutil.ignore_patterns("build", "dist", "*.egg-info", ".git", "__pycache__", "*.so", "*.o")


def template_of(manifest: dict[str, Any], profiles: dict[str, ProfileSpec]) -> Cell:
    """The planned cell of a finished wheel's manifest, with its profile from the matrix (what to compile)."""
    cell = cell_from_manifest(manifest)
    inputs = manifest.get("inputs") or {}
    name = str(inputs.get("profile") or "full")
    if name not in profiles and name != "full":
        raise ConfigurationError(
            f"{manifest.get('wheel') or manifest.get('cell_id')}: profile {name!r} is not in the matrix's "
            "profiles: an NGC image compiles the profile, so it must be declared"
        )
    return replace(
        cell,
        profile=name,
        profile_spec=profiles.get(name, ProfileSpec()),
        patches=tuple(str(p) for p in inputs.get("patches") or ()),
        source_sha256=inputs.get("source_sha256"),
    )


def ngc_request(
    template: Cell,
    rows: list[NgcRelease],
    *,
    image_template: str,
    policy: str,
    release: str | None = None,
) -> ImageRequest | Skipped:
    """The NGC image of a planned cell: the newest release whose torch family, CUDA and ABI fit (or
    `release`). Torch, Python and the wheel's name are provisional until `apply_ngc_facts`."""
    if template.kernel != "flash-attn":
        return Skipped(template.id, f"NGC images carry flash-attn (FA2) only, not {template.kernel}")
    row, why = select_release(
        rows,
        torch=template.torch,
        toolkit=str(template.toolkit),
        cxx11_abi=template.cxx11_abi,
        release=release,
    )
    if row is None:
        return Skipped(template.id, why)
    spec = ImageSpec(
        kind="ngc",
        kernel=template.kernel,
        kernel_version=template.kernel_version,
        dist_version=f"{template.kernel_version}+{template.local_version}",
        variant=f"ngc{row.release}",
        python=row.python,
        toolkit=f"cuda{row.cuda}",
        torch=row.torch,
        arches=template.arches,
        profile=template.profile,
        profile_tag=template.profile_tag,
        cxx11_abi=row.cxx11_abi,
        parity="not run",
        base_image=image_template.format(release=row.release),
    )
    return ImageRequest(
        spec=spec,
        manifest={"cell_id": template.id, "ngc": {"release": row.release, "policy": policy}},
        ngc=row,
        ngc_image=spec.base_image,
        ngc_policy=policy,
        template=template,
    )


def ngc_cell(template: Cell, facts: BaseFacts, row: NgcRelease, project: Project, image: str) -> Cell:
    """`template` aimed at the base's own torch, checked by the rules (as `attnforge build --python` does).

    The stand-in's torch is a CPU build: its CUDA version is the one its [[ngc]] row claims, and the
    builder is told to expect a CPU torch (`torch_variant` "cpu"). A real NGC base with a CPU torch is an
    error."""
    env = facts.env
    if env.accel is None:
        if not facts.standin:
            raise EnvironmentProblem(f"{image}: torch {facts.torch} is a CPU build, not an NGC PyTorch image")
        env = replace(env, accel=cuda_variant(row.cuda))
    cell = environment_cell(project, env, template)
    return cell if facts.env.accel is not None else replace(cell, torch_variant="cpu")


def apply_ngc_facts(req: ImageRequest, facts: BaseFacts, project: Project, log: Log) -> ImageRequest:
    """Make the request say what the NGC (or stand-in) base really holds: its torch and Python, the cell
    compiled against them (policy replace), or NGC's own flash-attn (policy keep); labels and expectations."""
    spec = req.spec
    if req.ngc and facts.torch.split("+")[0] != req.ngc.torch.split("+")[0] and not facts.standin:
        log(f"note: {req.ngc_image} has torch {facts.torch}, the compat data says {req.ngc.torch}")
    extra = {
        "io.attnforge.ngc.release": req.ngc.release if req.ngc else "",
        "io.attnforge.ngc.base": req.ngc_image,
        "io.attnforge.ngc.flash-attn-policy": req.ngc_policy,
        "io.attnforge.ngc.bundled-flash-attn": facts.flash_attn or "none",
        "io.attnforge.ngc.constraint": (
            f"{facts.constraint}: flash-attn re-pinned to ours (NGC's original kept as {facts.constraint}.ngc)"
            if req.ngc_policy == "replace" and facts.constraint
            else f"{facts.constraint or 'none'}: unchanged"
        ),
    }
    if facts.standin:
        extra["io.attnforge.standin"] = "true (base is attnforge's local stand-in for NGC, not NGC)"
    spec = replace(spec, torch=facts.torch, python=facts.python, extra_labels=extra)
    expect = {
        "torch": facts.torch,
        "policy": req.ngc_policy,
        "bundled": facts.flash_attn or "",
        "kind": "ngc",
    }
    if req.ngc_policy == "keep":
        if not facts.flash_attn:
            raise BuildError(f"{req.ngc_image} bundles no flash-attn: policy 'keep' has nothing to keep")
        public = facts.flash_attn.split("+")[0]
        spec = replace(
            spec, kernel_version=public, dist_version=facts.flash_attn, profile_tag="bundled", arches=()
        )
        expect["flash_attn"] = facts.flash_attn
        manifest: dict[str, Any] = {
            "kind": "ngc-bundled",
            "ngc": req.manifest.get("ngc"),
            "flash_attn": facts.flash_attn,
            "inputs": {"arches": []},
            "note": "NGC's own flash-attn build: attnforge did not build it",
        }
        return replace(req, spec=spec, ngc_facts=facts, expect=expect, manifest=manifest)
    if req.template is None or req.ngc is None:
        raise BuildError(f"{spec.tag}: an NGC image to compile needs its planned cell and NGC release")
    cell = ngc_cell(req.template, facts, req.ngc, project, req.ngc_image)
    spec = replace(
        spec,
        toolkit=str(cell.toolkit),
        dist_version=f"{cell.kernel_version}+{cell.local_version}",
        profile_tag=cell.profile_tag,
    )
    expect["flash_attn"] = spec.dist_version
    return replace(req, spec=spec, ngc_facts=facts, expect=expect, cell=cell)


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = SOURCE_DATE_EPOCH
    return info


def source_archive(src: Path, dest_dir: Path) -> Path:
    """The kernel source as an archive in `dest_dir`: an sdist/tarball copied as it is, a folder packed
    (sorted, fixed times and owners; build outputs and VCS files left out) under a top folder `src/`."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    if src.is_file() and src.name.endswith((".tar.gz", ".tgz")):
        return Path(shutil.copy2(src, dest_dir / src.name))
    if not src.is_dir():
        raise ConfigurationError(f"--source {src}: give a source folder or an sdist (.tar.gz)")
    with tempfile.TemporaryDirectory(prefix="attnforge-src-") as tmp:
        tree = Path(tmp) / "src"
        shutil.copytree(src, tree, ignore=_SKIP_SOURCE)
        out = dest_dir / f"{src.name}.tar.gz"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(tree, arcname="src", recursive=False, filter=_tar_filter)
            for path in sorted(tree.rglob("*")):
                tar.add(
                    path,
                    arcname=f"src/{path.relative_to(tree).as_posix()}",
                    recursive=False,
                    filter=_tar_filter,
                )
        out.write_bytes(gzip.compress(buf.getvalue(), mtime=0))
    return out


NGC_THREADS = (1, "image build: one nvcc thread")


def ngc_settings(
    cell: Cell,
    requested: Requested | None = None,
    resources: ResourcesSpec | None = None,
    machine: Machine | None = None,
) -> BuildSettings:
    """The settings of an NGC compile, from the one resolver: `images build --max-jobs` (or MAX_JOBS), then
    the matrix's `build.resources`, then this machine and the cell's measured per-arch job memory
    (`JobMemoryTable`); one nvcc thread unless one of those says otherwise."""
    return resolve_settings(
        cell,
        resources or ResourcesSpec(),
        requested,
        machine=machine or detect_machine(),
        table=JobMemoryTable(),
        threads=NGC_THREADS,
    )


def ngc_spec(cell: Cell, facts: BaseFacts, source: Source, settings: BuildSettings) -> BuildSpec:
    """The builder's spec inside the `build` stage: the base's python and torch as they are, no shared
    kernel objects or ccache (one image, one compile), output in OUT."""
    work = Path(WORK)
    spec = make_spec(
        cell,
        source=source,
        workdir=work,
        objects_dir=work / "objects",
        ccache_dir=work / "ccache",
        settings=settings,
        venv_root=work,
        interpreter=facts.executable,
    )
    return spec.replace(output_dir=OUT, kernel_objects_dir=None, ccache_dir=None, venv_dir=f"{WORK}/venv")


def compile_on_base(
    dk: Docker,
    req: ImageRequest,
    *,
    base_ref: str,
    dockerfile: Path,
    source: Path,
    requested: Requested | None,
    resources: ResourcesSpec | None,
    out_dir: Path,
    on_line: Callable[[str], None],
) -> ImageRequest:
    """Build flash-attn on the base with the builder, finalize it into `out_dir`; the request with the
    finalized wheel and its manifest (plus the NGC release and policy) to install in the `replace` stage."""
    cell, facts = req.cell, req.ngc_facts
    if cell is None or facts is None:
        raise BuildError(f"{req.spec.tag}: apply_ngc_facts first (no cell for the base's torch)")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="attnforge-ngc-") as tmp:
        ctx = Path(tmp) / "context"
        archive = source_archive(source, ctx / "attnforge" / "source")
        shutil.copytree(
            BUILDER_DIR, ctx / "attnforge" / "builder", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
        src = Source(path=f"{MOUNT}/source/{archive.name}", sha256=sha256_file(archive))
        settings = ngc_settings(cell, requested, resources)
        log_context.log(f"  {settings.line()}")
        spec = ngc_spec(cell, facts, src, settings)
        (ctx / "attnforge" / "spec.json").write_text(spec.dumps() + "\n", encoding="utf-8")
        log_context.log(
            f"  compiling {cell.id} on {base_ref} (torch {facts.torch}, {facts.executable}, no network)"
        )
        out = Path(tmp) / "out"
        res = dk.build(
            ctx,
            dockerfile,
            [],
            build_args={"NGC_IMAGE": base_ref},
            target="wheel",
            network="none",
            output=out,
            on_line=on_line,
        )
        result = _read_result(out)
        if not res.ok or not result.get("ok"):
            said = [
                ln.split("attnforge: error: ", 1)[1]
                for ln in res.output.splitlines()
                if "attnforge: error: " in ln
            ]
            why = said[-1] if said else res.tail(12)
            raise BuildError(f"flash-attn did not build on {base_ref} for {cell.id}: {why}")
        raw = out / str(result["wheel_name"])
        seconds = time.monotonic() - start
        result["image"] = base_ref
        identity = json.dumps(
            {"backend": "env", "image": base_ref, "python": facts.executable, "torch": facts.torch},
            sort_keys=True,
        )
        job = CellJob(
            cell,
            spec,
            Path(tmp),
            out / "build.log",
            settings,
            input_hash(cell, identity),
        )
        manifest = build_manifest(cell, raw, result, job, "env", seconds)
        final = finalize_built(raw, manifest, out_dir, log=log_context.log)
    if final.names.version.lower() != req.spec.dist_version.lower():
        raise BuildError(
            f"{final.wheel.name}: version {final.names.version}, the image promises {req.spec.dist_version}"
        )
    log_context.log(
        f"  {final.wheel.name}: finalized ({final.platform_tag}, {final.names.torch_requirement})"
    )
    data = read_manifest(final.manifest)
    return replace(req, wheel=final.wheel, manifest={**data, "ngc": req.manifest.get("ngc")})


def _read_result(out: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((out / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data
