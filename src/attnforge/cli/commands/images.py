"""`attnforge images`: build, smoke-test and push prebuilt images (runtime and NGC-based)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from attnforge.builder.toolkits import cuda_variant
from attnforge.core.errors import ConfigurationError, NothingToDoError
from attnforge.core.pins import cpu_torch, local_base

DEFAULT_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def _log(msg: str) -> None:
    click.echo(msg, err=True)


def _optional(project: Any, attr: str) -> Any:
    """project.matrix / project.compat, or None when the file is missing or invalid (logged)."""
    try:
        return getattr(project, attr)
    except ConfigurationError as exc:
        _log(f"note: no {attr} data ({exc}); going on without it")
        return None


def _wheels_dir(project: Any, wheels: Path | None) -> Path:
    if wheels is not None:
        return wheels
    matrix = _optional(project, "matrix")
    return project.path(matrix.build.output_dir) if matrix is not None else Path("wheels")


def _ca_bundle(project: Any, ca_bundle: Path | None, no_ca: bool) -> Path | None:
    if no_ca:
        return None
    if ca_bundle is not None:
        return ca_bundle
    matrix = _optional(project, "matrix")
    if matrix is not None and matrix.build.extra_ca_bundle:
        return Path(project.path(matrix.build.extra_ca_bundle))
    return DEFAULT_CA if DEFAULT_CA.exists() else None


def _pip_options(project: Any, host_pip: bool) -> Any:
    from attnforge.engine.backends.pip_config import pip_options
    from attnforge.matrix.schema import PipSpec

    matrix = _optional(project, "matrix")
    spec = matrix.build.pip if matrix is not None else PipSpec()
    if not host_pip:
        spec = spec.model_copy(update={"inherit_host_config": False})
    return pip_options(spec)


LOCAL_RUNTIME_BASE = local_base()


def runtime_base_for(project: Any, explicit: str | None, toolkit: str) -> str:
    """--runtime-base, else the local Debian base (matrix build.local_base), else the compat data's
    CUDA runtime image for the toolkit."""
    if explicit:
        return explicit
    matrix = _optional(project, "matrix")
    if matrix is None or matrix.build.local_base:
        return LOCAL_RUNTIME_BASE
    compat = _optional(project, "compat")
    row = compat.cuda_toolkit(toolkit.removeprefix("cuda")) if compat is not None else None
    if row is None or not row.runtime_image:
        raise ConfigurationError(f"no runtime base known for {toolkit}: give --runtime-base")
    return str(row.runtime_image)


def gather_requests(
    project: Any,
    *,
    target: str | None,
    wheels_dir: Path,
    kind: str,
    runtime_base: str | None,
    ngc_release: str | None,
    ngc_template: str,
    ngc_policy: str,
) -> tuple[list[Any], list[Any]]:
    """(image requests, skipped): runtime images of the wheels' manifests, NGC images of the target's cells
    (without a target: of the wheels' cells), filtered by a target's cells."""
    from attnforge.images.ngc_image import ngc_request, template_of
    from attnforge.images.requests import (
        Skipped,
        flex_wheels_for,
        read_wheel_manifests,
        runtime_request,
        with_flex,
    )

    found = read_wheel_manifests(wheels_dir) if wheels_dir.is_dir() else []
    skipped: list[Any] = []
    cells: list[Any] = []
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
    compat = _optional(project, "compat")
    requests: list[Any] = []
    if kind in ("runtime", "all"):
        for wheel, manifest in found:
            pypi_variant = None
            if compat is not None:
                row = compat.torch_release(str(manifest["inputs"]["torch"]))
                if row is not None and row.pypi_cuda:
                    pypi_variant = cuda_variant(row.pypi_cuda)
            base = runtime_base_for(project, runtime_base, str(manifest["inputs"]["toolkit"]))
            req = runtime_request(wheel, manifest, base=base, pypi_variant=pypi_variant)
            requests.append(with_flex(req, flex_wheels_for(req, wheels_dir)))
    if kind in ("ngc", "all"):
        rows = list(compat.ngc) if compat is not None else []
        if not rows:
            raise ConfigurationError("no [[ngc]] rows in the compat data (give one with --compat)")
        if not cells:
            matrix = _optional(project, "matrix")
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


def ngc_source(project: Any, requests: list[Any], given: Path | None) -> Path | None:
    """What NGC images compile: --source, else the kernel's pinned source of the matrix (fetched into the
    cache like `attnforge build` does); None when no image compiles anything."""
    from attnforge.engine.sources import fetch_source

    cells = [r.template for r in requests if r.spec.kind == "ngc" and r.ngc_policy == "replace"]
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


_cred_options = [
    click.option("--username", default=None, help="Registry user (default: $ATTNFORGE_REGISTRY_USER)."),
    click.option(
        "--password-env",
        default=None,
        metavar="VAR",
        help="Environment variable holding the password (default: ATTNFORGE_REGISTRY_PASSWORD).",
    ),
    click.option(
        "--password-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="File holding the password (first line).",
    ),
]


def cred_options(f: Any) -> Any:
    for opt in reversed(_cred_options):
        f = opt(f)
    return f


@click.group("images")
def command() -> None:
    """Prebuilt container images: build + smoke-test, push (all or nothing), NGC stand-in, base pins.

    \b
    attnforge images build --target default              runtime images of the target's wheels
    attnforge images build --kind ngc --target T         flash-attn compiled on NGC PyTorch bases
    attnforge images push --registry HOST:PORT           push the last build's image set
    Credentials: --username + $ATTNFORGE_REGISTRY_PASSWORD (or --password-env/--password-file), never argv.
    """


@command.command("build")
@click.option("--target", default=None, help="Only the cells of this matrix target.")
@click.option(
    "--wheels",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder of finished wheels + manifests (default: matrix build.output_dir).",
)
@click.option("--kind", type=click.Choice(["runtime", "ngc", "all"]), default="runtime", show_default=True)
@click.option(
    "--repository", default="attnforge/flash-attn", show_default=True, help="Local image repository."
)
@click.option(
    "--runtime-base",
    default=None,
    help="Base of runtime images (default: local/debian:bookworm when matrix build.local_base, else the compat "
    "data's nvidia/cuda:<ver>-runtime-ubuntu22.04 of the toolkit; pinned in docker/bases.toml).",
)
@click.option(
    "--torch-index", default=None, help="The one index pip uses for torch and its deps (e.g. PyTorch's)."
)
@click.option("--extra-index-url", "extra_index", multiple=True, help="More indexes for pip in the build.")
@click.option(
    "--no-host-pip", is_flag=True, help="Ignore this machine's pip configuration (mirrors, find-links)."
)
@click.option(
    "--ca-bundle",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Extra CA bundle, given as a BuildKit secret (default: matrix build.extra_ca_bundle, else the host's).",
)
@click.option("--no-ca-bundle", is_flag=True, help="Give no CA bundle to the builds.")
@click.option(
    "--netrc",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="netrc with index credentials, given as a BuildKit secret (never in a layer or the history).",
)
@click.option(
    "--flex-cache",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="FlexAttention kernel cache folder baked in as TORCHINDUCTOR_CACHE_DIR.",
)
@click.option(
    "--source",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="flash-attn source (folder or sdist) compiled on the NGC base (default: the matrix's pinned sdist).",
)
@click.option("--ngc-release", default=None, help="Use this NGC release instead of the newest that fits.")
@click.option("--ngc-standin", is_flag=True, help="Use (and make) attnforge's local stand-in NGC bases.")
@click.option(
    "--standin-torch",
    default=cpu_torch(),
    show_default=True,
    help="torch the stand-in base preinstalls (the small CPU wheel keeps images small).",
)
@click.option(
    "--ngc-policy",
    type=click.Choice(["replace", "keep"]),
    default="replace",
    show_default=True,
    help="NGC's bundled flash-attn: replace it with ours (constraint re-pinned) or keep and test it.",
)
@click.option("--max-jobs", type=int, default=2, show_default=True, help="MAX_JOBS of the NGC compile.")
@click.option("--no-smoke", is_flag=True, help="Skip the smoke test (the push then refuses the set).")
@click.option(
    "--strict-bases",
    is_flag=True,
    help="A local base whose image ID differs from docker/bases.toml is an error.",
)
@click.option(
    "--allow-unpinned-base",
    is_flag=True,
    help="Build on a registry base that docker/bases.toml has no digest for.",
)
@click.option("--push", "push_to", default=None, metavar="HOST:PORT", help="Push the set after building.")
@cred_options
@click.option(
    "--dry-run", is_flag=True, help="Print the images, tags, bases and build arguments; build nothing."
)
@click.pass_obj
def build_cmd(
    project: Any,
    target: str | None,
    wheels: Path | None,
    kind: str,
    repository: str,
    runtime_base: str | None,
    torch_index: str | None,
    extra_index: tuple[str, ...],
    no_host_pip: bool,
    ca_bundle: Path | None,
    no_ca_bundle: bool,
    netrc: Path | None,
    flex_cache: Path | None,
    source: Path | None,
    ngc_release: str | None,
    ngc_standin: bool,
    standin_torch: str,
    ngc_policy: str,
    max_jobs: int,
    no_smoke: bool,
    strict_bases: bool,
    allow_unpinned_base: bool,
    push_to: str | None,
    username: str | None,
    password_env: str | None,
    password_file: Path | None,
    dry_run: bool,
) -> None:
    """Build the images of finished wheels (runtime) and/or of a target's cells on NGC bases; smoke-test each.

    The set is recorded in <wheels>/images.json; `--push` (or `images push`) pushes all of it or nothing.
    """
    from attnforge.core.docker_cli import Docker
    from attnforge.images.credentials import resolve_credentials
    from attnforge.images.ngc import NGC_IMAGE_TEMPLATE, STANDIN_TEMPLATE, probe_base
    from attnforge.images.ngc_image import apply_ngc_facts
    from attnforge.images.pipplan import plan_pip
    from attnforge.images.push import push_set
    from attnforge.images.runtime_image import BuildOptions, build_set, git_revision
    from attnforge.images.standin import ensure_standin
    from attnforge.images.tags import aliases, resolve_tags

    creds = resolve_credentials(username, password_env, password_file) if push_to else None
    if push_to and no_smoke:
        raise ConfigurationError("--push needs the smoke test: drop --no-smoke")
    wheels_dir = _wheels_dir(project, wheels)
    template = STANDIN_TEMPLATE if ngc_standin else NGC_IMAGE_TEMPLATE
    requests, skipped = gather_requests(
        project,
        target=target,
        wheels_dir=wheels_dir,
        kind=kind,
        runtime_base=runtime_base,
        ngc_release=ngc_release,
        ngc_template=template,
        ngc_policy=ngc_policy,
    )
    for s in skipped:
        _log(f"skipped {s.what}: {s.why}")
    if not requests:
        raise NothingToDoError(f"no image to build (wheels folder {wheels_dir}, kind {kind})")
    ca = _ca_bundle(project, ca_bundle, no_ca_bundle)
    options = _pip_options(project, not no_host_pip)
    pip_plan = plan_pip(torch_index=torch_index, options=options, extra_index_urls=list(extra_index))
    if dry_run:
        specs = resolve_tags([r.spec for r in requests])
        alias_of = {t: a for a, t in aliases(specs).items()}
        for req, spec in zip(requests, specs, strict=True):
            click.echo(f"{repository}:{spec.tag}  ({spec.kind}, base {spec.base_image})")
            if spec.tag in alias_of:
                click.echo(f"  alias {repository}:{alias_of[spec.tag]}")
            if spec.kind == "runtime":
                click.echo(
                    f"  wheel {req.wheel}; {req.torch_requirement} (variant {req.torch_variant or '-'})"
                )
            else:
                what = (
                    f"compiles {req.template.id}"
                    if req.template and req.ngc_policy == "replace"
                    else "keeps NGC's"
                )
                click.echo(f"  NGC {req.ngc.release if req.ngc else '?'} policy {req.ngc_policy}: {what}")
            click.echo(
                f"  torch {spec.torch}, {spec.toolkit}, arches {','.join(spec.arches)}, profile {spec.profile}"
            )
        click.echo(
            f"pip: index {pip_plan.index_url}; extra {pip_plan.extra_index_urls}; local "
            f"{[str(p) for p in pip_plan.local.find_links + pip_plan.local.simple_roots]}"
        )
        click.echo(f"secrets: pip_conf{', ca_bundle' if ca else ''}{', pip_netrc' if netrc else ''}")
        return
    dk = Docker()
    ngc_reqs = [r for r in requests if r.spec.kind == "ngc"]
    if ngc_reqs:
        facts_of: dict[str, Any] = {}
        for req in ngc_reqs:
            if req.ngc_image in facts_of:
                continue
            if ngc_standin and req.ngc is not None:
                res = ensure_standin(
                    req.ngc.release,
                    plan=pip_plan,
                    ca_bundle=ca,
                    netrc=netrc,
                    torch_requirement=standin_torch,
                    docker=dk,
                    log=_log,
                )
                _log(f"{res.tag}: {'built' if res.created else 'present'} ({res.image_id[:19]})")
            facts_of[req.ngc_image] = probe_base(dk, req.ngc_image)
        requests = [
            apply_ngc_facts(r, facts_of[r.ngc_image], project, _log) if r.spec.kind == "ngc" else r
            for r in requests
        ]
    opts = BuildOptions(
        repository=repository,
        out_dir=wheels_dir,
        ca_bundle=ca,
        netrc=netrc,
        torch_index=torch_index,
        extra_index_urls=list(extra_index),
        pip_options=options,
        flex_cache=flex_cache,
        source=ngc_source(project, requests, source),
        max_jobs=max_jobs,
        smoke=not no_smoke,
        strict_bases=strict_bases,
        allow_unpinned=allow_unpinned_base,
        revision=git_revision(project.root),
    )
    image_set = build_set(requests, opts, log=_log)
    for img in image_set.images:
        aka = f" (+ {', '.join(img.aliases)})" if img.aliases else ""
        smoke = "smoke ok" if img.smoke.get("ok") else "smoke skipped"
        click.echo(f"{image_set.local_ref(img.tag)}{aka}  {img.image_id[:19]}  {smoke}  {img.seconds:.0f} s")
    click.echo(f"recorded {wheels_dir / 'images.json'}")
    if push_to and creds is not None:
        report = push_set(image_set, push_to, username=creds.username, password=creds.password, log=_log)
        for line in report.lines():
            click.echo(line)


@command.command("push")
@click.option("--registry", default=None, metavar="HOST:PORT", help="Registry to push to.")
@click.option(
    "--to", "dest_name", default=None, help="A `kind: registry` destination of matrix.yaml instead."
)
@click.option(
    "--repository", default=None, help="Remote repository (default: the local one, attnforge/flash-attn)."
)
@click.option(
    "--record",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The image set to push (default: <wheels>/images.json of the last build).",
)
@cred_options
@click.pass_obj
def push_cmd(
    project: Any,
    registry: str | None,
    dest_name: str | None,
    repository: str | None,
    record: Path | None,
    username: str | None,
    password_env: str | None,
    password_file: Path | None,
) -> None:
    """Push every tag of the last built image set, or nothing: a failure rolls back what was pushed (exit 7)."""
    from attnforge.images.credentials import resolve_credentials
    from attnforge.images.push import push_set
    from attnforge.images.record import read_record

    if dest_name:
        matrix = project.matrix
        dest = matrix.destinations.get(dest_name)
        if dest is None or dest.kind != "registry":
            raise ConfigurationError(f"no destination '{dest_name}' of kind registry in the matrix")
        registry = registry or dest.url
        username = username or (os.environ.get(dest.username_env) if dest.username_env else None)
        password_env = password_env or dest.password_env
        if password_file is None and dest.password_file:
            password_file = project.path(dest.password_file)
    if not registry:
        raise ConfigurationError("give --registry HOST:PORT or --to DESTINATION")
    creds = resolve_credentials(username, password_env, password_file)
    image_set = read_record(record or _wheels_dir(project, None) / "images.json")
    unsmoked = [i.tag for i in image_set.images if not i.smoke.get("ok")]
    if unsmoked:
        raise ConfigurationError(f"images without a passed smoke test: {', '.join(unsmoked)} (rebuild them)")
    report = push_set(
        image_set, registry, username=creds.username, password=creds.password, repository=repository, log=_log
    )
    for line in report.lines():
        click.echo(line)


@command.command("smoke")
@click.argument("image")
@click.option(
    "--gpu/--no-gpu", default=None, help="Run with --gpus all (default: when the engine has a GPU)."
)
def smoke_cmd(image: str, gpu: bool | None) -> None:
    """Run the smoke test inside IMAGE, with the expectations its labels state (exit 6 on failure)."""
    from attnforge.core.docker_cli import Docker
    from attnforge.core.errors import TestFailure
    from attnforge.images.image_smoke import engine_has_gpu, expect_from_labels, run_smoke

    dk = Docker()
    expect = expect_from_labels(dk.labels(image))
    report = run_smoke(dk, image, expect, gpu=engine_has_gpu(dk) if gpu is None else gpu, log=click.echo)
    if not report["ok"]:
        raise TestFailure(
            f"smoke test of {image} failed: {'; '.join(report.get('failures') or []) or report.get('output')}"
        )
    click.echo(
        f"{image}: smoke ok (torch {report.get('torch')}, flash-attn {report.get('flash_attn')}, "
        f"arches {','.join(report.get('arches') or [])}, {report.get('gpu')})"
    )


@command.command("standin")
@click.option("--release", required=True, help="The NGC release it stands in for, e.g. 25.06.")
@click.option("--torch", "torch_req", default=cpu_torch(), show_default=True, help="torch to preinstall.")
@click.option(
    "--bundled", default="2.7.4+standin", show_default=True, help="Version of the fake bundled flash-attn."
)
@click.option(
    "--torch-version-as",
    default=None,
    help="Version its torch reports, NGC-shaped (default: <release>a0+standin; '' keeps the wheel's own).",
)
@click.option(
    "--torch-index", default=None, help="The index pip uses (default: this machine's pip configuration)."
)
@click.option("--force", is_flag=True, help="Rebuild even when it exists.")
@click.pass_obj
def standin_cmd(
    project: Any,
    release: str,
    torch_req: str,
    bundled: str,
    torch_version_as: str | None,
    torch_index: str | None,
    force: bool,
) -> None:
    """Make attnforge-standin/ngc-pytorch:RELEASE, a local stand-in for nvcr.io/nvidia/pytorch:RELEASE-py3."""
    from attnforge.images.pipplan import plan_pip
    from attnforge.images.standin import ensure_standin

    plan = plan_pip(torch_index=torch_index, options=_pip_options(project, True))
    res = ensure_standin(
        release,
        plan=plan,
        ca_bundle=_ca_bundle(project, None, False),
        torch_requirement=torch_req,
        bundled_flash_attn=bundled,
        torch_version_as=torch_version_as,
        force=force,
        log=_log,
    )
    click.echo(f"{res.tag} {'built' if res.created else 'exists'} {res.image_id}")


@command.command("bases")
@click.option("--update", "update", multiple=True, metavar="NAME", help="Re-pin this base (repeatable).")
@click.option("--update-local", is_flag=True, help="Re-pin every local base that exists on this machine.")
def bases_cmd(update: tuple[str, ...], update_local: bool) -> None:
    """Show docker/bases.toml against this machine; --update rewrites pins (registry bases are pulled)."""
    from attnforge.core.docker_cli import Docker
    from attnforge.engine.base_images import BaseRecord, current_pin, is_local_name, load_bases, write_bases
    from attnforge.images.runtime_image import docker_dir

    path = docker_dir() / "bases.toml"
    bases = load_bases(path)
    dk = Docker()
    names = list(update)
    if update_local:
        names += [b.name for b in bases.values() if b.kind == "local" and dk.image_id(b.name)]
    for name in names:
        rec = bases.get(name) or BaseRecord(name, "local" if is_local_name(name) else "registry")
        rec.pin = current_pin(dk, name, rec.kind)
        bases[name] = rec
        click.echo(f"pinned {name} {rec.pin}")
    if names:
        write_bases(path, bases)
    for b in sorted(bases.values(), key=lambda b: (b.kind, b.name)):
        here = dk.image_id(b.name) if b.kind == "local" else None
        state = (
            "unpinned"
            if not b.pin
            else (
                "pinned"
                if b.kind == "registry" or here == b.pin
                else "differs here"
                if here
                else "absent here"
            )
        )
        click.echo(f"{b.kind:8} {b.name:48} {b.pin[:19] or '-':19} {state}")


@command.command("registry")
@click.option("--port", type=int, default=5005, show_default=True)
@click.option("--username", required=True, help="The one user (password from --password-env).")
@click.option("--password-env", default="ATTNFORGE_REGISTRY_PASSWORD", show_default=True, metavar="VAR")
def registry_cmd(port: int, username: str, password_env: str) -> None:
    """Run a throwaway authenticated registry (Debian's docker-registry) on 127.0.0.1 until Ctrl-C."""
    import time

    from attnforge.images.localregistry import LocalRegistry

    password = os.environ.get(password_env)
    if not password:
        raise ConfigurationError(f"set ${password_env} to the password")
    with LocalRegistry({username: password}, port=port) as reg:
        click.echo(f"registry on {reg.host} (user {username}, deletes enabled); Ctrl-C stops it")
        while True:
            time.sleep(3600)
