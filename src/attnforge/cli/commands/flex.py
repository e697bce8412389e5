"""`attnforge flex`: FlexAttention kernels compiled ahead of time and shipped as a wheel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from attnforge.core.errors import BuildError, ConfigurationError, NothingToDoError
from attnforge.matrix.project import Project


def declared_variants(project: Project, variants_file: Path | None, defaults: bool) -> list[Any]:
    """--variants FILE, else matrix.yaml's `flex` section (`variants` and expanded `clients`), else (with
    --defaults) the built-in set."""
    import yaml

    from attnforge.flex.flex_spec import DEFAULT_VARIANTS, load_variants, parse_variants  # start-up cost

    if variants_file is not None:
        return load_variants(variants_file)
    if defaults:
        return parse_variants(DEFAULT_VARIANTS, "built-in defaults")
    try:
        raw = yaml.safe_load(project.matrix_path.read_text(encoding="utf-8")) or {}
    except OSError:
        raw = {}
    flex = raw.get("flex") if isinstance(raw, dict) else None
    if not flex:
        raise ConfigurationError(
            f"{project.matrix_path}: no `flex.variants` or `flex.clients` declared",
            hint="declare them in matrix.yaml (`attnforge docs flex`), pass --variants FILE, or --defaults",
        )
    return parse_variants(flex, f"{project.matrix_path}: flex")


@click.group("flex")
def command() -> None:
    """Compile FlexAttention variants ahead of time (Mega-Cache, precompiled function, AOTInductor) and
    package them.

    The wheel `attnforge-flex-kernels` holds the artifacts and the `attnforge_flex` loader
    (`attnforge docs flex`).
    """


@command.command("build")
@click.option(
    "--variants",
    "variants_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML/JSON with `flex.variants` (default: matrix.yaml).",
)
@click.option("--defaults", is_flag=True, help="Build the built-in variant set.")
@click.option("--only", multiple=True, help="Build only these variant names (repeatable).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), help="Only variants for this device.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("wheels/flex"), show_default=True)
@click.option("--family", default="default", show_default=True, help="Named in the wheel's local version.")
@click.option("--wheel/--no-wheel", "make_wheel", default=True, show_default=True)
@click.option(
    "--aoti/--no-aoti",
    default=True,
    show_default=True,
    help="Also build AOTInductor packages (static variants; fwd+bwd GPU variants: a forward and a backward package).",
)
@click.option(
    "--precompile/--no-precompile",
    default=True,
    show_default=True,
    help="Also save a precompiled function (torch.compile(...).aot_compile, fwd+bwd; torch >= 2.10).",
)
@click.option("--aoti-retry", is_flag=True, help="After one package crashed on load, still try the others.")
@click.option("--jobs", type=int, default=2, show_default=True, help="Variants compiled in parallel.")
@click.option(
    "--cache-key-log",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the Mega-Cache step's cache keys per variant here (<name>.build.jsonl; "
    "compare with `python -m attnforge.flex.cachekeys diff`).",
)
@click.pass_obj
def build(
    project: Project,
    variants_file: Path | None,
    defaults: bool,
    only: tuple[str, ...],
    device: str | None,
    out: Path,
    family: str,
    make_wheel: bool,
    aoti: bool,
    precompile: bool,
    aoti_retry: bool,
    jobs: int,
    cache_key_log: Path | None,
) -> None:
    """Compile each variant on this machine (fresh process and cache each) and package the result."""
    from attnforge.flex.aot_build import BuildOptions, build_and_package, failed  # start-up cost

    vs = [
        v for v in declared_variants(project, variants_file, defaults) if device is None or v.device == device
    ]
    if only:
        missing = set(only) - {v.name for v in vs}
        if missing:
            raise ConfigurationError(f"unknown flex variant(s): {', '.join(sorted(missing))}")
        vs = [v for v in vs if v.name in only]
    if not vs:
        raise NothingToDoError("no flex variant selected")
    opts = BuildOptions(
        out_dir=out,
        family=family,
        aoti=aoti,
        precompile=precompile,
        jobs=jobs,
        aoti_retry=aoti_retry,
        log=click.echo,
        cache_key_log=cache_key_log,
    )
    manifest, wheel = build_and_package([v.as_dict() for v in vs], opts, out / "dist" if make_wheel else None)
    bad = failed(manifest)
    click.echo(
        f"flex: {len(vs) - len(bad)} of {len(vs)} variants built into {out / 'artifacts'}"
        + (f"; wheel {wheel}" if wheel else "")
    )
    if bad:
        reasons = "; ".join(
            f"{e['name']}: {e.get('error')}" for e in manifest["variants"] if e["name"] in bad
        )
        raise BuildError(f"flex variants failed: {reasons}")


@command.command("list")
@click.option("--variants", "variants_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--defaults", is_flag=True)
@click.pass_obj
def list_(project: Project, variants_file: Path | None, defaults: bool) -> None:
    """Show the declared variants."""
    for v in declared_variants(project, variants_file, defaults):
        extra = {"sliding_window": f" window={v.window}", "prefix_lm": f" prefix={v.prefix}"}.get(v.mask, "")
        mod = "" if v.score_mod == "none" else f" {v.score_mod}" + (f"={v.softcap:g}" if v.softcap else "")
        lens = f"s{v.pad_from}-{v.seq_len}" if v.pad_from and v.pad_from < v.seq_len else f"s{v.seq_len}"
        who = f" [{v.client}: {v.group}]" if v.client else ""
        scale = f" scale={v.scale:g}" if v.scale is not None else ""
        click.echo(
            f"{v.name}: {v.device} {v.dtype} {v.mask}{extra}{mod}{scale} h{v.heads_q}/{v.heads_kv} d{v.head_dim} "
            f"{lens} b{v.batch}{' bwd' if v.backward else ''}{' dynamic' if v.dynamic else ''} {v.mode}{who}"
        )


@command.command("check")
@click.argument("artifacts", type=click.Path(exists=True, file_okay=False, path_type=Path))
def check(artifacts: Path) -> None:
    """Whether this machine can use an artifacts folder (torch, Triton, CUDA, GPU, Python must match)."""
    from attnforge.flex.runtime import envkeys, read_manifest  # start-up cost

    try:
        data = read_manifest(artifacts)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{artifacts}: {exc}") from None
    diff = envkeys.mismatches(data["env"], envkeys.collect(str(data["env"].get("device", "cuda"))))
    click.echo(json.dumps({"usable": not diff, "mismatches": diff, "built_for": data["env"]}, indent=1))
    if diff:
        raise ConfigurationError(f"{artifacts}: built for another environment")
