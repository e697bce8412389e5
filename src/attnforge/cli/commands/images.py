"""`attnforge images`: build, smoke-test and push prebuilt images (runtime and NGC-based)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from attnforge.cli.options import requested_settings
from attnforge.core.docker_cli import Docker
from attnforge.core.errors import ConfigurationError, NothingToDoError, TestFailure
from attnforge.core.package_files import DOCKER_DIR_ENV, inside_installed_package
from attnforge.core.pins import cpu_torch
from attnforge.engine.backends.pipplan import plan_pip
from attnforge.engine.base_images import BaseRecord, current_pin, is_local_name, load_bases, write_bases
from attnforge.matrix.project import Project


def _log(msg: str) -> None:
    click.echo(msg, err=True)


@dataclass(frozen=True)
class ImageBuildOptions:
    """The options of `images build`, as click parses them (one field per option, same names)."""

    target: str | None
    wheels: Path | None
    kind: str
    repository: str
    runtime_base: str | None
    torch_index: str | None
    extra_index: tuple[str, ...]
    no_host_pip: bool
    ca_bundle: Path | None
    no_ca_bundle: bool
    netrc: Path | None
    flex_cache: Path | None
    source: Path | None
    ngc_release: str | None
    ngc_standin: bool
    standin_torch: str
    ngc_policy: str
    max_jobs: int | None
    no_smoke: bool
    strict_bases: bool
    allow_unpinned_base: bool
    push_to: str | None
    username: str | None
    password_env: str | None
    password_file: Path | None
    dry_run: bool


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


def cred_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The registry credential options (`--username-env`, `--password-env`, ...) on a command."""
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
@click.option(
    "--max-jobs",
    type=click.IntRange(1),
    envvar="MAX_JOBS",
    help="MAX_JOBS of the NGC compile (env MAX_JOBS) [default: build.resources, else from cores and memory].",
)
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
def build_cmd(project: Project, /, **options: Any) -> None:
    """Build the images of finished wheels (runtime) and/or of a target's cells on NGC bases; smoke-test each.

    The set is recorded in <wheels>/images.json; `--push` (or `images push`) pushes all of it or nothing.
    """
    from attnforge.images.build_inputs import (  # start-up cost
        ca_bundle_of,
        dry_run_lines,
        gather_requests,
        ngc_source,
        pip_netrc_of,
        pip_options_of,
        prepare_ngc_bases,
        wheels_dir_of,
    )
    from attnforge.images.credentials import resolve_credentials  # start-up cost
    from attnforge.images.ngc import NGC_IMAGE_TEMPLATE, STANDIN_TEMPLATE  # start-up cost
    from attnforge.images.project_data import optional_matrix  # start-up cost
    from attnforge.images.push import push_set  # start-up cost
    from attnforge.images.runtime_image import BuildOptions, build_set, git_revision  # start-up cost

    o = ImageBuildOptions(**options)
    creds = resolve_credentials(o.username, o.password_env, o.password_file) if o.push_to else None
    if o.push_to and o.no_smoke:
        raise ConfigurationError("--push needs the smoke test: drop --no-smoke")
    wheels_dir = wheels_dir_of(project, o.wheels, _log)
    requests, skipped = gather_requests(
        project,
        target=o.target,
        wheels_dir=wheels_dir,
        kind=o.kind,
        runtime_base=o.runtime_base,
        ngc_release=o.ngc_release,
        ngc_template=STANDIN_TEMPLATE if o.ngc_standin else NGC_IMAGE_TEMPLATE,
        ngc_policy=o.ngc_policy,
        log=_log,
    )
    for s in skipped:
        _log(f"skipped {s.what}: {s.why}")
    if not requests:
        raise NothingToDoError(f"no image to build (wheels folder {wheels_dir}, kind {o.kind})")
    ca = ca_bundle_of(project, o.ca_bundle, o.no_ca_bundle, _log)
    pip_options = pip_options_of(project, not o.no_host_pip, _log)
    pip_plan = plan_pip(torch_index=o.torch_index, options=pip_options, extra_index_urls=list(o.extra_index))
    netrc_file = pip_netrc_of(pip_options, o.netrc)  # kept for the command: its private copy goes with it
    netrc = netrc_file.path()  # the BuildKit secret pip_netrc
    requested = requested_settings(click.get_current_context(), o.max_jobs, None)
    matrix = optional_matrix(project, lambda _note: None)  # gather_requests said what is missing
    resources = matrix.build.resources if matrix else None
    if o.dry_run:
        lines = dry_run_lines(
            requests,
            repository=o.repository,
            pip_plan=pip_plan,
            ca_bundle=ca,
            netrc=netrc,
            requested=requested,
            resources=resources,
        )
        for line in lines:
            click.echo(line)
        return
    dk = Docker()
    requests = prepare_ngc_bases(
        project,
        requests,
        docker=dk,
        standin=o.ngc_standin,
        pip_plan=pip_plan,
        ca_bundle=ca,
        netrc=netrc,
        standin_torch=o.standin_torch,
        log=_log,
    )
    build = BuildOptions(
        repository=o.repository,
        out_dir=wheels_dir,
        ca_bundle=ca,
        netrc=netrc,
        torch_index=o.torch_index,
        extra_index_urls=list(o.extra_index),
        pip_options=pip_options,
        flex_cache=o.flex_cache,
        source=ngc_source(project, requests, o.source),
        requested=requested,
        resources=resources,
        smoke=not o.no_smoke,
        strict_bases=o.strict_bases,
        allow_unpinned=o.allow_unpinned_base,
        revision=git_revision(project.root),
    )
    image_set = build_set(requests, build, log=_log)
    for img in image_set.images:
        aka = f" (+ {', '.join(img.aliases)})" if img.aliases else ""
        smoke = "smoke ok" if img.smoke.get("ok") else "smoke skipped"
        click.echo(f"{image_set.local_ref(img.tag)}{aka}  {img.image_id[:19]}  {smoke}  {img.seconds:.0f} s")
    click.echo(f"recorded {wheels_dir / 'images.json'}")
    if o.push_to and creds is not None:
        report = push_set(image_set, o.push_to, username=creds.username, password=creds.password, log=_log)
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
    project: Project,
    registry: str | None,
    dest_name: str | None,
    repository: str | None,
    record: Path | None,
    username: str | None,
    password_env: str | None,
    password_file: Path | None,
) -> None:
    """Push every tag of the last built image set, or nothing: a failure rolls back what was pushed (exit 7)."""
    from attnforge.images.build_inputs import wheels_dir_of  # start-up cost
    from attnforge.images.credentials import resolve_credentials  # start-up cost
    from attnforge.images.push import push_set  # start-up cost
    from attnforge.images.record import read_record  # start-up cost

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
    image_set = read_record(record or wheels_dir_of(project, None, _log) / "images.json")
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
    from attnforge.images.image_smoke import engine_has_gpu, expect_from_labels, run_smoke  # start-up cost

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
    project: Project,
    release: str,
    torch_req: str,
    bundled: str,
    torch_version_as: str | None,
    torch_index: str | None,
    force: bool,
) -> None:
    """Make attnforge-standin/ngc-pytorch:RELEASE, a local stand-in for nvcr.io/nvidia/pytorch:RELEASE-py3."""
    from attnforge.images.build_inputs import ca_bundle_of, pip_netrc_of, pip_options_of  # start-up cost
    from attnforge.images.standin import ensure_standin  # start-up cost

    options = pip_options_of(project, True, _log)
    plan = plan_pip(torch_index=torch_index, options=options)
    netrc_file = pip_netrc_of(options, None)  # kept for the command: its private copy goes with it
    res = ensure_standin(
        release,
        plan=plan,
        ca_bundle=ca_bundle_of(project, None, False, _log),
        netrc=netrc_file.path(),
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
    from attnforge.images.runtime_image import docker_dir  # start-up cost

    path = docker_dir() / "bases.toml"
    bases = load_bases(path)
    dk = Docker()
    names = list(update)
    if (update or update_local) and not os.environ.get(DOCKER_DIR_ENV) and inside_installed_package(path):
        raise click.ClickException(
            f"{path} belongs to the installed attnforge package: pins written there are lost on upgrade and "
            f"shared by every project of this installation. Copy the folder ({path.parent}) into your "
            f"repository, set {DOCKER_DIR_ENV} to the copy and run this again"
        )
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
    from attnforge.images.localregistry import LocalRegistry  # start-up cost

    password = os.environ.get(password_env)
    if not password:
        raise ConfigurationError(f"set ${password_env} to the password")
    with LocalRegistry({username: password}, port=port) as reg:
        click.echo(f"registry on {reg.host} (user {username}, deletes enabled); Ctrl-C stops it")
        while True:
            time.sleep(3600)
