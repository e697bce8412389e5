"""`attnforge wheels`: finalize a built wheel, verify a finalized one, write the static index."""

from __future__ import annotations

from pathlib import Path

import click

from attnforge.core.errors import BuildError, ConfigurationError
from attnforge.matrix.project import Project
from attnforge.wheels.finalize import finalize, verify
from attnforge.wheels.manifest import check_matches_wheel, manifest_path_for, read_manifest
from attnforge.wheels.records import write_build_records
from attnforge.wheels.signing_keys import project_signing, short, signing_key


@click.group("wheels")
def command() -> None:
    """Post-process and check wheels (the build runs `finalize` after each cell)."""


@command.command("finalize")
@click.argument("wheel", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--manifest",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The build's manifest (default: WHEEL.manifest.json beside the wheel).",
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the finalized wheel goes (default: beside the input, which it replaces).",
)
@click.option(
    "--exclude", "excludes", multiple=True, help="More sonames to leave out of auditwheel's grafting."
)
@click.option(
    "--keep-input", is_flag=True, help="Keep the input wheel when the finalized one has another name."
)
@click.pass_obj
def finalize_cmd(
    project: Project,
    wheel: Path,
    manifest: Path | None,
    out_dir: Path | None,
    excludes: tuple[str, ...],
    keep_input: bool,
) -> None:
    """Name the variant (+cu130torch2.14cxx11abiTRUE), pin torch, audit and retag, verify, write the manifest,
    then the SBOM and the signed build provenance beside the wheel (`attnforge docs records`).

    The wheel is reproducible: the same input and SOURCE_DATE_EPOCH give the same bytes.
    """
    res = finalize(
        wheel,
        manifest,
        out_dir,
        extra_excludes=excludes,
        keep_input=keep_input,
        log=lambda m: click.echo(m, err=True),
    )
    for change in res.changes:
        click.echo(f"  {change}", err=True)
    click.echo(f"platform tag {res.platform_tag}: {res.platform_reason}", err=True)
    click.echo(f"requires {res.names.torch_requirement}; variant {res.names.variant}", err=True)
    _sign(project, [res.wheel])
    click.echo(str(res.wheel))


def _sign(project: Project, wheels: list[Path]) -> None:
    key = signing_key(project_signing(project), log=lambda m: click.echo(m, err=True))
    assert key is not None
    for wheel in wheels:
        paths = write_build_records(wheel, read_manifest(manifest_path_for(wheel)), key)
        click.echo(f"signed by {short(key.keyid)}: {', '.join(p.name for p in paths)}", err=True)


@command.command("sign")
@click.argument(
    "wheels", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.pass_obj
def sign_cmd(project: Project, wheels: tuple[Path, ...]) -> None:
    """Write the SBOM and the signed build provenance of finalized wheels (one built before records existed).

    The wheel must match its manifest (bytes and names) first: what is signed is what the manifest says.
    """
    from attnforge.wheels import wheel_claims  # start-up cost

    for wheel in wheels:
        data = read_manifest(manifest_path_for(wheel))
        check_matches_wheel(wheel, data)
        wheel_claims.check(wheel, data)
    _sign(project, list(wheels))


@command.command("verify")
@click.argument(
    "wheels", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
def verify_cmd(wheels: tuple[Path, ...]) -> None:
    """Check finalized wheels (RECORD, names, torch pin, manifest, check-wheel-contents); exit 4 on a problem."""
    bad = 0
    for wheel in wheels:
        problems = verify(wheel)
        if problems:
            bad += 1
            for p in problems:
                click.echo(f"FAIL {wheel.name}: {p}")
        else:
            click.echo(f"ok   {wheel.name}")
    if bad:
        raise BuildError(f"{bad} of {len(wheels)} wheel(s) failed verification")


@command.command("index")
@click.argument("sources", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("wheels/index"),
    show_default=True,
    help="The static index (per-variant and `all` PEP 503/691 trees).",
)
@click.pass_obj
def index_cmd(project: Project, sources: tuple[Path, ...], out: Path) -> None:
    """Add finalized wheels (files or folders; default: the build's output folder) to a static index.

    No parity gate here: `attnforge publish --to NAME` applies the destination's rules.
    """
    from attnforge.publish.coverage_page import CoveragePage  # start-up cost
    from attnforge.publish.coverage_plan import snapshot  # start-up cost
    from attnforge.publish.index import StaticIndex  # start-up cost
    from attnforge.publish.release import (  # start-up cost
        check_claims,
        collect_bundles,
        default_sources,
        print_report,
    )

    srcs = list(sources) or default_sources(project)
    if not srcs:
        raise ConfigurationError("no wheels given and no build output folder found")
    bundles = collect_bundles(srcs, exclude=[out])
    check_claims(bundles)
    report = StaticIndex(out, root_page=CoveragePage(snapshot(project))).publish(bundles)
    print_report(report)
