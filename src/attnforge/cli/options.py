"""Click options that several commands share, declared once."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from attnforge.builder.settings import FROM_COMMAND_LINE, FROM_ENVIRONMENT
from attnforge.core.index_urls import split_auth
from attnforge.engine.settings import Given, Requested

F = TypeVar("F", bound=Callable[..., Any])


def trusted_key_option(help_text: str) -> Callable[[F], F]:
    """`--trusted-key PEM` (repeatable): a public key the signed records may be signed with."""
    return click.option(
        "--trusted-key",
        "trusted_key",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=help_text,
    )


static_destination_option = click.option(
    "--to",
    "target",
    default="local",
    show_default=True,
    help="The static destination of matrix.yaml (or a folder) that holds the wheel.",
)


records_url_option = click.option(
    "--records-url",
    callback=lambda ctx, param, value: index_url_checked(ctx, param, value),
    default=lambda: os.environ.get("ATTNFORGE_RECORDS_URL"),
    show_default="$ATTNFORGE_RECORDS_URL",
    help="Where the wheels' signed records and manifests are, as <URL>/<project>/<wheel><suffix> (the served "
    "`records` folder of a pypiserver destination): --verify checks the records there, and `which` reads each "
    "candidate's manifest there (its variant and GPU arches); default: beside the wheel in the index.",
)


user_python_option = click.option(
    "--python",
    "python",
    help="Inspect this interpreter's environment (a path, a command on PATH, or a venv folder). Default: the "
    "active venv ($VIRTUAL_ENV), else the active conda environment ($CONDA_PREFIX), else the first python3 on "
    "PATH; the report names the one inspected.",
)


def requested_settings(ctx: click.Context, max_jobs: int | None, nvcc_threads: int | None) -> Requested:
    """--max-jobs/--nvcc-threads as given, each labelled with where click found it: on the command line or in
    the environment (MAX_JOBS/NVCC_THREADS); the resolver asks the matrix, then measures, for the others."""

    def given(name: str, value: int | None) -> Given | None:
        if value is None:
            return None
        from_env = ctx.get_parameter_source(name) == click.core.ParameterSource.ENVIRONMENT
        return Given(value, FROM_ENVIRONMENT if from_env else FROM_COMMAND_LINE)

    return Requested(given("max_jobs", max_jobs), given("nvcc_threads", nvcc_threads))


_URL_ENV = {"index_url": "ATTNFORGE_INDEX_URL", "records_url": "ATTNFORGE_RECORDS_URL"}


def index_url_checked(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An index URL option (or its environment variable) as given, once `core.index_urls` found no secret
    it cannot keep out of messages (a query-string token: ConfigurationError naming the option, never the
    value)."""

    if value:
        name = param.name or "index_url"
        env = f" (or ${_URL_ENV[name]})" if name in _URL_ENV else ""
        split_auth(value, f"--{name.replace('_', '-')}{env}")
    return value
