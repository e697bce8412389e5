"""`attnforge serve`: the static wheel index over HTTP on 127.0.0.1 (PEP 691 content negotiation)."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

import click

from attnforge.matrix.project import Project


def _default_dir(project: Project) -> Path:
    try:
        dest = project.matrix.destinations.get("local")
        if dest is not None and dest.kind == "static" and dest.path:
            return Path(project.path(dest.path))
    except Exception:  # no matrix here: fall back to the conventional place
        pass
    return Path("wheels/index")


@click.command("serve")
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="TCP port (0 = any free port).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds a connection may stay silent (between requests or inside one) before it is closed.",
)
@click.pass_obj
def command(project: Project, directory: Path | None, port: int, host: str, idle_timeout: float) -> None:
    """Serve a static index (default: the `local` destination, else wheels/index) until Ctrl-C.

    Only a folder `attnforge publish` wrote is served, and only what lies inside it (symlinks out: 404).

    \b
    Install from it:
      pip install flash-attn --index-url http://127.0.0.1:PORT/<variant>/simple
    The first line printed is `serving DIR at URL`, for scripts that start it with --port 0.
    """
    from attnforge.publish.index_server import index_root, make_server  # start-up cost

    root = index_root(directory or _default_dir(project))
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.secho(
            f"warning: serving on {host}: reachable beyond this machine, without authentication", err=True
        )
    server = make_server(root, host, port, idle_timeout)

    def _stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    bound_host, bound_port = server.server_address[:2]
    click.echo(f"serving {root} at http://{bound_host!s}:{bound_port}/", nl=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
