"""What `attnforge images build` takes from the project before it builds: the wheels folder, CA bundle, pip
options and bases; the image requests (runtime images of finished wheels, NGC images of planned cells); the
NGC bases made (stand-ins) and probed; the source NGC images compile; and the dry run's description."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attnforge.core.docker_cli import DEFAULT_CA, Docker
from attnforge.core.errors import ConfigurationError
from attnforge.engine.backends.pip_config import PipOptions, pip_options
from attnforge.engine.backends.pip_credentials import NetrcFile, check_netrc
from attnforge.engine.backends.pipplan import PipPlan
from attnforge.engine.settings import Requested
from attnforge.engine.sources import fetch_source
from attnforge.images.ngc import BaseFacts, probe_base
from attnforge.images.ngc_image import apply_ngc_facts, ngc_request, ngc_settings, template_of
from attnforge.images.project_data import optional_compat, optional_matrix
from attnforge.images.requests import (
    ImageRequest,
    Skipped,
    flex_wheels_for,
    read_wheel_manifests,
    runtime_request,
    with_flex,
)
from attnforge.images.runtime_image import DEFAULT_RUNTIME_BASE
from attnforge.images.standin import ensure_standin
from attnforge.images.tags import aliases, resolve_tags
from attnforge.matrix.cell import Cell
from attnforge.matrix.project import Project
from attnforge.matrix.schema import PipSpec, ResourcesSpec
from attnforge.names import cuda_variant, cuda_version

Log = Callable[[str], None]


def wheels_dir_of(project: Project, wheels: Path | None, log: Log) -> Path:
    """--wheels, else the matrix's build.output_dir, else ./wheels."""
    if wheels is not None:
        return wheels
    matrix = optional_matrix(project, log)
    return project.path(matrix.build.output_dir) if matrix is not None else Path("wheels")


def ca_bundle_of(project: Project, ca_bundle: Path | None, no_ca: bool, log: Log) -> Path | None:
    """--ca-bundle, else the matrix's build.extra_ca_bundle, else the host's bundle (None: --no-ca-bundle)."""
    if no_ca:
        return None
    if ca_bundle is not None:
        return ca_bundle
    matrix = optional_matrix(project, log)
    if matrix is not None and matrix.build.extra_ca_bundle:
        return Path(project.path(matrix.build.extra_ca_bundle))
    return DEFAULT_CA if DEFAULT_CA.exists() else None


def pip_options_of(project: Project, host_pip: bool, log: Log) -> PipOptions:
    """The matrix's build.pip (default settings without a matrix); `host_pip` False drops this machine's."""
    matrix = optional_matrix(project, log)
    spec = matrix.build.pip if matrix is not None else PipSpec()
    if not host_pip:
        spec = spec.model_copy(update={"inherit_host_config": False})
    opts = pip_options(spec, base=project.root)
    for note in opts.notes:
        log(note)
    return opts


def pip_netrc_of(options: PipOptions, explicit: Path | None) -> NetrcFile:
    """The netrc pip gets as the BuildKit secret `pip_netrc`: --netrc (else build.pip.netrc) plus the
    credentials scrubbed from this machine's pip config."""
    user_file = check_netrc(explicit, "--netrc") if explicit is not None else options.netrc_file
    return NetrcFile(list(options.logins), user_file)


def runtime_base_for(project: Project, explicit: str | None, toolkit: str, log: Log) -> str:
    """--runtime-base, else the local Debian base (matrix build.local_base), else the compat data's
    CUDA runtime image for the toolkit."""
    if explicit:
        return explicit
    matrix = optional_matrix(project, log)
    if matrix is None or matrix.build.local_base:
        return DEFAULT_RUNTIME_BASE
    compat = optional_compat(project, log)
    cuda = cuda_version(toolkit)
    row = compat.cuda_toolkit(cuda) if compat is not None and cuda is not None else None
    if row is None or not row.runtime_image:
        raise ConfigurationError(f"no runtime base known for {toolkit}: give --runtime-base")
    return str(row.runtime_image)


def gather_requests(
    project: Project,
    *,
    target: str | None,
    wheels_dir: Path,
    kind: str,
    runtime_base: str | None,
    ngc_release: str | None,
    ngc_template: str,
    ngc_policy: str,
    log: Log,
) -> tuple[list[ImageRequest], list[Skipped]]:
    """(image requests, skipped): runtime images of the wheels' manifests, NGC images of the target's cells
    (without a target: of the wheels' cells), filtered by a target's cells."""
    found = read_wheel_manifests(wheels_dir) if wheels_dir.is_dir() else []
    skipped: list[Skipped] = []
    cells: list[Cell] = []
    if target:
        plan = project.plan(target)
        cells = plan.valid
        ids = {c.id for c in cells}
        have = {str(m.get("cell_id")) for _, m in found}
        found = [(w, m) for w, m in found if str(m.get("cell_id")) in ids]
        if kind in ("runtime", "all"):
            skipped += [
                Skipped(c.id, f"no finished wheel in {wheels_dir}") for c in cells if c.id not in have
            ]
    compat = optional_compat(project, log)
    requests: list[ImageRequest] = []
    if kind in ("runtime", "all"):
        for wheel, manifest in found:
            pypi_variant = None
            if compat is not None:
                row = compat.torch_release(str(manifest["inputs"]["torch"]))
                if row is not None and row.pypi_cuda:
                    pypi_variant = cuda_variant(row.pypi_cuda)
            base = runtime_base_for(project, runtime_base, str(manifest["inputs"]["toolkit"]), log)
            req = runtime_request(wheel, manifest, base=base, pypi_variant=pypi_variant)
            requests.append(with_flex(req, flex_wheels_for(req, wheels_dir)))
    if kind in ("ngc", "all"):
        rows = list(compat.ngc) if compat is not None else []
        if not rows:
            raise ConfigurationError("no [[ngc]] rows in the compat data (give one with --compat)")
        if not cells:
            matrix = optional_matrix(project, log)
            profiles = dict(matrix.profiles) if matrix is not None else {}
            cells = [template_of(m, profiles) for _, m in found]
        seen: set[tuple[str, str, tuple[str, ...]]] = set()
        for cell in cells:
            got = ngc_request(cell, rows, image_template=ngc_template, policy=ngc_policy, release=ngc_release)
            if isinstance(got, Skipped):
                skipped.append(got)
                continue
            key = (got.spec.tag, cell.profile, cell.arches)
            if key not in seen:
                seen.add(key)
                requests.append(got)
    return requests, skipped


def prepare_ngc_bases(
    project: Project,
    requests: list[ImageRequest],
    *,
    docker: Docker,
    standin: bool,
    pip_plan: PipPlan,
    ca_bundle: Path | None,
    netrc: Path | None,
    standin_torch: str,
    log: Log,
) -> list[ImageRequest]:
    """The requests, NGC ones told what their base holds: each base probed once (with `standin`, the local
    stand-in made first when missing)."""
    facts_of: dict[str, BaseFacts] = {}
    for req in requests:
        if req.spec.kind != "ngc" or req.ngc_image in facts_of:
            continue
        if standin and req.ngc is not None:
            res = ensure_standin(
                req.ngc.release,
                plan=pip_plan,
                ca_bundle=ca_bundle,
                netrc=netrc,
                torch_requirement=standin_torch,
                docker=docker,
                log=log,
            )
            log(f"{res.tag}: {'built' if res.created else 'present'} ({res.image_id[:19]})")
        facts_of[req.ngc_image] = probe_base(docker, req.ngc_image)
    return [
        apply_ngc_facts(r, facts_of[r.ngc_image], project, log) if r.spec.kind == "ngc" else r
        for r in requests
    ]


def ngc_source(project: Project, requests: list[ImageRequest], given: Path | None) -> Path | None:
    """What NGC images compile: --source, else the kernel's pinned source of the matrix (fetched into the
    cache like `attnforge build` does); None when no image compiles anything."""
    cells = [
        r.template
        for r in requests
        if r.spec.kind == "ngc" and r.ngc_policy == "replace" and r.template is not None
    ]
    if given is not None or not cells:
        return given
    kernels = sorted({c.kernel for c in cells})
    if len(kernels) != 1:
        raise ConfigurationError(
            f"NGC images of several kernels ({', '.join(kernels)}) in one build: give --source"
        )
    cell = cells[0]
    matrix = project.matrix
    cache = project.path(matrix.build.cache_dir)
    src = fetch_source(cell.kernel, matrix.kernels[cell.kernel], cell.source_sha256, cache, project.root)
    return Path(src.path)


def dry_run_lines(
    requests: list[ImageRequest],
    *,
    repository: str,
    pip_plan: PipPlan,
    ca_bundle: Path | None,
    netrc: Path | None,
    requested: Requested | None = None,
    resources: ResourcesSpec | None = None,
) -> list[str]:
    """What `--dry-run` prints: each image with its tag, alias, base and what goes in (an NGC compile's
    settings, resolved as the build would: `ngc_settings`); pip's indexes; secrets."""
    lines: list[str] = []
    specs = resolve_tags([r.spec for r in requests])
    alias_of = {t: a for a, t in aliases(specs).items()}
    for req, spec in zip(requests, specs, strict=True):
        lines.append(f"{repository}:{spec.tag}  ({spec.kind}, base {spec.base_image})")
        if spec.tag in alias_of:
            lines.append(f"  alias {repository}:{alias_of[spec.tag]}")
        if spec.kind == "runtime":
            lines.append(f"  wheel {req.wheel}; {req.torch_requirement} (variant {req.torch_variant or '-'})")
        else:
            what = (
                f"compiles {req.template.id}"
                if req.template and req.ngc_policy == "replace"
                else "keeps NGC's"
            )
            lines.append(f"  NGC {req.ngc.release if req.ngc else '?'} policy {req.ngc_policy}: {what}")
            if req.template and req.ngc_policy == "replace":
                lines.append("  " + ngc_settings(req.template, requested, resources).line())
        lines.append(
            f"  torch {spec.torch}, {spec.toolkit}, arches {','.join(spec.arches)}, profile {spec.profile}"
        )
    lines.append(
        f"pip: index {pip_plan.index_url}; extra {pip_plan.extra_index_urls}; local "
        f"{[str(p) for p in pip_plan.local.find_links + pip_plan.local.simple_roots]}"
    )
    lines.append(f"secrets: pip_conf{', ca_bundle' if ca_bundle else ''}{', pip_netrc' if netrc else ''}")
    return lines
