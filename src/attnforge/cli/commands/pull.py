"""`attnforge pull`: choose the registry's image that fits this host, say why, and pull it."""

from __future__ import annotations

import os
from pathlib import Path

import click

from attnforge.cli.commands.images import cred_options
from attnforge.core.docker_cli import Docker
from attnforge.core.errors import ConfigurationError, NothingToDoError, PublishError, TestFailure
from attnforge.matrix.project import Project


@click.command("pull")
@click.option(
    "--registry",
    default=lambda: os.environ.get("ATTNFORGE_REGISTRY"),
    metavar="HOST:PORT",
    help="Registry to read (default: $ATTNFORGE_REGISTRY).",
)
@click.option("--repository", default="attnforge/flash-attn", show_default=True)
@cred_options
@click.option(
    "--gpu", multiple=True, metavar="ARCH", help="Choose for this GPU arch (sm_90) instead of this host's."
)
@click.option(
    "--driver", default=None, help="With --gpu: the driver version of that machine (e.g. 580.65.06)."
)
@click.option("--cuda", "cuda", default=None, help="With --gpu: the newest CUDA that machine's driver runs.")
@click.option("--kind", type=click.Choice(["any", "runtime", "ngc"]), default="any", show_default=True)
@click.option("--python", default=None, help="Only images with this Python (X.Y).")
@click.option(
    "--dry-run", is_flag=True, help="Print the host, every candidate with its verdict, and the choice."
)
@click.option("--smoke", is_flag=True, help="Run the image's smoke test after pulling it.")
@click.pass_obj
def command(
    project: Project,
    registry: str | None,
    repository: str,
    username: str | None,
    password_env: str | None,
    password_file: Path | None,
    gpu: tuple[str, ...],
    driver: str | None,
    cuda: str | None,
    kind: str,
    python: str | None,
    dry_run: bool,
    smoke: bool,
) -> None:
    """List the registry's attnforge images, inspect the host (nvidia-smi) and pull the one that fits.

    Exit 3 when none fits (every candidate's reason is printed), 7 when the registry refuses.
    """
    from attnforge.client.pull import choose, detect_host, host_from_args, why_text  # start-up cost
    from attnforge.images.credentials import resolve_credentials  # start-up cost
    from attnforge.images.image_smoke import engine_has_gpu, expect_from_labels, run_smoke  # start-up cost
    from attnforge.images.project_data import optional_compat  # start-up cost
    from attnforge.images.registry import Registry  # start-up cost

    if not registry:
        raise ConfigurationError("give --registry HOST:PORT (or set $ATTNFORGE_REGISTRY)")
    if (driver or cuda) and not gpu:
        raise ConfigurationError("--driver/--cuda describe another machine: give its --gpu too")
    creds = resolve_credentials(username, password_env, password_file)
    host = host_from_args(gpu, driver, cuda) if gpu else detect_host()
    compat = optional_compat(project, lambda msg: click.echo(msg, err=True))
    reg = Registry(registry, creds.username, creds.password)
    best, cands = choose(
        reg,
        repository,
        host,
        kind=kind,
        python=python,
        drivers=list(compat.driver) if compat is not None else None,
    )
    click.echo(f"host: {host.describe()}")
    for c in sorted(cands, key=lambda c: c.tag):
        verdict = "fits" if c.fits else "no: " + "; ".join(c.reasons)
        click.echo(f"  {c.tag:56} {verdict}")
    if not cands:
        raise NothingToDoError(f"{reg.host}/{repository} has no attnforge image tags")
    if best is None:
        raise NothingToDoError(
            f"no image of {reg.host}/{repository} fits this host ({host.describe()}); reasons above"
            + ("" if host.gpus else "; to choose for another machine give --gpu sm_XY [--driver VER]")
        )
    ref = f"{reg.host}/{repository}:{best.tag}"
    click.echo(f"choice: {ref}")
    click.echo(f"why: {why_text(best, cands)}")
    if dry_run:
        return
    secrets = [creds.password] if creds.password else []
    with Docker(private_config=True, secrets=secrets) as dk:
        if creds.username and creds.password:
            res = dk.login(reg.host, creds.username, creds.password)
            if not res.ok:
                raise PublishError(f"docker login to {reg.host} as {creds.username!r} failed: {res.tail(2)}")
        res = dk.pull(ref)
        if not res.ok:
            raise PublishError(f"docker pull {ref} failed: {res.tail(3)}")
    click.echo(f"pulled {ref}")
    if smoke:
        dk2 = Docker()
        report = run_smoke(dk2, ref, expect_from_labels(best.labels), gpu=engine_has_gpu(dk2), log=click.echo)
        if not report["ok"]:
            raise TestFailure(f"smoke test of {ref} failed: {'; '.join(report.get('failures') or [])}")
        click.echo(f"{ref}: smoke ok")
