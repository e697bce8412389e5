"""`attnforge ci`: generate (or --check) the GitHub Actions workflows from matrix.yaml; export a cell as a cibuildwheel config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from attnforge.ci.cibuildwheel_config import caveats, cibuildwheel_config, to_toml
from attnforge.ci.sync import compare, write
from attnforge.ci.workflow_spec import CiSettings
from attnforge.ci.workflows import (
    DEFAULT_TARGETS,
    actionlint_config,
    parse_target_options,
    render,
    settings_for,
)
from attnforge.cli.commands.build import cells_to_build
from attnforge.core.errors import ConfigurationError
from attnforge.matrix.project import Project


@click.group("ci")
def command() -> None:
    """Continuous integration: workflows generated from matrix.yaml, cibuildwheel configs for other CIs."""


@command.command("cibuildwheel")
@click.option(
    "--cell", "cell_id", required=True, metavar="ID", help="The cell to export (see `attnforge plan`)."
)
@click.option(
    "--target", "-t", default=None, help="The target holding the cell [default: the first that has it]."
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the TOML here [default: stdout].",
)
@click.pass_obj
def cibuildwheel(project: Project, cell_id: str, target: str | None, output: Path | None) -> None:
    """Export one cell as a `[tool.cibuildwheel]` config for a project whose CI runs cibuildwheel.

    \b
    It builds upstream's sdist with the cell's torch pin, arches, ABI and local version on the stock
    manylinux_2_28 image; the caveats (also in the file) say what only attnforge's builder does: source
    patches, head-dim/dtype subsets, kernel objects shared across Pythons.
      cibuildwheel --platform linux --config-file cibw.toml flash_attn-2.8.3/
    """
    (cell,) = cells_to_build(project, target, [cell_id])
    text = to_toml(cibuildwheel_config(cell), cell)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}")
    for note in caveats(cell):
        click.echo(f"caveat: {note}", err=output is None)


@command.command("generate")
@click.option(
    "--target",
    "-t",
    "targets",
    multiple=True,
    metavar="[ROLE=]TARGET",
    help=(
        "A workflow to generate: ROLE is pr, release, nightly or refresh (default: "
        + ", ".join(f"{r}={t}" for r, t in DEFAULT_TARGETS.items())
        + ", those that exist). A bare TARGET named like a role takes that role, else 'pr'."
    ),
)
@click.option(
    "--output",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the workflows (default: .github/workflows beside matrix.yaml).",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 2 with a diff when the files differ.")
@click.option(
    "--gpu-arch",
    "gpu_arches",
    multiple=True,
    metavar="ARCH",
    help="Self-hosted GPU runner classes that exist (repeatable; default sm_90). Labels: sm90, gfx942.",
)
@click.option(
    "--build-runs-on",
    default="ubuntu-latest",
    show_default=True,
    metavar="LABELS",
    help="Comma-separated runner labels for the build jobs (e.g. self-hosted,linux,x64,build).",
)
@click.option(
    "--actionlint-config",
    "actionlint_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write (or --check) an actionlint config declaring the self-hosted runner labels used.",
)
@click.option(
    "--matrix",
    "matrix_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Matrix file (same as the global --matrix).",
)
@click.pass_obj
def generate(
    project: Project,
    targets: tuple[str, ...],
    output: Path | None,
    check: bool,
    gpu_arches: tuple[str, ...],
    build_runs_on: str,
    actionlint_path: Path | None,
    matrix_path: Path | None,
) -> None:
    """Write one workflow per role: one build job per kernel-set, GPU parity, publish, images, nightly, and a
    weekly compat refresh that opens a pull request.

    \b
    The jobs install attnforge as matrix.yaml's `ci:` section says (default: this attnforge's version from
    PyPI; `ci: {attnforge: {wheel: URL}}` or `{index_url: URL}`) and call it; `ci: {mode: self}` is for
    attnforge's own repository (nox sessions).
    Examples:
      attnforge ci generate                      pr=default, release=release, nightly=nightly, refresh
      attnforge ci generate --check              exit 2 and print a diff when stale
      attnforge ci generate -t pr=default -o /tmp/wf
    """
    if matrix_path is not None:
        project = Project(matrix_path, project.compat_path)
    ci = project.matrix.ci
    roles = parse_target_options(targets, project.matrix.targets, ci.mode)
    if not roles:
        raise ConfigurationError(
            "no workflow to generate: the matrix has none of the targets "
            + ", ".join(dict.fromkeys(DEFAULT_TARGETS.values()))
            + " (name them with --target ROLE=TARGET)"
        )
    if "release" in roles and ci.publish_to not in project.matrix.destinations:
        raise ConfigurationError(
            f"matrix.yaml ci.publish_to: no destination '{ci.publish_to}' in `destinations:` "
            f"({', '.join(project.matrix.destinations) or 'none'}): the release workflow publishes there"
        )
    runs_on = tuple(x.strip() for x in build_runs_on.split(",") if x.strip())
    options = CiSettings(gpu_arches=gpu_arches or CiSettings().gpu_arches, build_runs_on=runs_on)
    base = settings_for(project)
    check_args = [*(f"--target {r}={t}" for r, t in roles.items() if targets)]
    check_args += [f"--gpu-arch {a}" for a in gpu_arches]
    if build_runs_on != "ubuntu-latest":
        check_args.append(f"--build-runs-on {','.join(runs_on)}")
    settings = settings_for(
        project,
        gpu_arches=options.gpu_arches,
        build_runs_on=options.build_runs_on,
        invocation=replace(base.invocation, check_args=tuple(check_args)),
    )
    files = render(project, roles, settings)
    folder = output or project.root / ".github" / "workflows"
    lint_text = actionlint_config(files) if actionlint_path else None
    if check:
        result = compare(files, folder)
        stale = [p.name for p in result.stale + result.orphans]
        if actionlint_path and lint_text is not None:
            old = actionlint_path.read_text(encoding="utf-8") if actionlint_path.exists() else ""
            if old != lint_text:
                stale.append(str(actionlint_path))
        if stale:
            click.echo(result.diff, nl=False)
            names = ", ".join(stale)
            raise ConfigurationError(
                f"workflows in {folder} differ from matrix.yaml ({names})",
                hint="run `attnforge ci generate` and commit the result",
            )
        click.echo(f"{len(files)} workflow(s) in {folder} match matrix.yaml")
        return
    result = write(files, folder)
    if actionlint_path and lint_text is not None:
        actionlint_path.parent.mkdir(parents=True, exist_ok=True)
        actionlint_path.write_text(lint_text, encoding="utf-8")
        click.echo(f"wrote {actionlint_path}")
    for path in result.written:
        click.echo(f"wrote {path}")
    for path in result.orphans:
        click.echo(f"removed {path} (no longer generated)")
    if not result.written and not result.orphans:
        click.echo(f"{len(files)} workflow(s) in {folder} already up to date")
