"""One context-managed class over the docker CLI (cibuildwheel's habit).

Every registry credential goes to `docker login --password-stdin` inside a private, temporary
DOCKER_CONFIG directory that is deleted when the context closes: no password on a command line, in a
log, or left in ~/.docker/config.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from attnforge.core.errors import EnvironmentProblem
from attnforge.core.secrets import check_secret, redact

DOCKER_ENV = "ATTNFORGE_DOCKER"
DEFAULT_DOCKER = "/usr/bin/docker"

# The host's CA bundle, handed to image builds as a BuildKit secret (never a layer) where a build downloads.
DEFAULT_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def docker_executable(default: str = DEFAULT_DOCKER) -> str:
    """The docker CLI every attnforge command runs: $ATTNFORGE_DOCKER, else `default` (read at each call, so
    a later environment change counts). The one definition: backends, images, cache and runner ask it."""
    return os.environ.get(DOCKER_ENV) or default


@dataclass
class Result:
    """A finished docker command: exit code and combined output (already redacted)."""

    argv: list[str]
    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


@dataclass
class Docker:
    """The docker CLI with an optional private config directory (for registry logins)."""

    docker: str = field(default_factory=docker_executable)
    private_config: bool = False
    secrets: list[str] = field(default_factory=list)
    _config_dir: Path | None = None

    def __enter__(self) -> Docker:
        if self.private_config:
            self._config_dir = Path(tempfile.mkdtemp(prefix="attnforge-docker-config-"))
            os.chmod(self._config_dir, 0o700)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._config_dir is not None:
            shutil.rmtree(self._config_dir, ignore_errors=True)
            self._config_dir = None

    # ---- plumbing ----
    def argv(self, *args: str) -> list[str]:
        base = [self.docker]
        if self._config_dir is not None:
            base += ["--config", str(self._config_dir)]
        return base + list(args)

    def env(self, buildkit: bool = False) -> dict[str, str]:
        env = dict(os.environ)
        if buildkit:
            env["DOCKER_BUILDKIT"] = "1"
        return env

    def run(
        self,
        *args: str,
        stdin: str | None = None,
        buildkit: bool = False,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> Result:
        """Run `docker ARGS`; output is redacted; on_line streams each (redacted) line."""
        argv = self.argv(*args)
        if not Path(self.docker).exists() and shutil.which(self.docker) is None:
            raise EnvironmentProblem(f"docker CLI {self.docker} not found (apt-get install docker.io)")
        if on_line is None:
            done = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                env=self.env(buildkit),
                check=False,
                timeout=timeout,
            )
            out = redact(done.stdout + done.stderr, self.secrets)
            return Result(argv, done.returncode, out)
        lines: list[str] = []
        with subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=self.env(buildkit),
        ) as proc:
            if stdin is not None and proc.stdin is not None:
                proc.stdin.write(stdin)
                proc.stdin.close()
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = redact(raw.rstrip("\n"), self.secrets)
                lines.append(line)
                on_line(line)
            code = proc.wait()
        return Result(argv, code, "\n".join(lines))

    def check_engine(self) -> None:
        """EnvironmentProblem unless an engine answers."""
        res = self.run("version", "--format", "{{.Server.Version}}")
        if not res.ok:
            raise EnvironmentProblem(f"no Docker engine answers ({res.tail(3)}); start dockerd")

    # ---- images ----
    def build(
        self,
        context: Path,
        dockerfile: Path,
        tags: Sequence[str],
        *,
        build_args: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        secrets: dict[str, Path] | None = None,
        target: str | None = None,
        network: str | None = "host",
        output: Path | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> Result:
        """`DOCKER_BUILDKIT=1 docker build` (progress plain) with build args, labels and file secrets;
        `output`: export the target's files into that folder (`--output type=local`) instead of an image."""
        args = ["build", "--progress", "plain", "-f", str(dockerfile)]
        for k, v in sorted((build_args or {}).items()):
            args += ["--build-arg", f"{k}={v}"]
        for k, v in sorted((labels or {}).items()):
            args += ["--label", f"{k}={v}"]
        for sid, path in sorted((secrets or {}).items()):
            args += ["--secret", f"id={sid},src={path}"]
        if target:
            args += ["--target", target]
        if network:
            args += ["--network", network]
        if output is not None:
            args += ["--output", f"type=local,dest={output}"]
        for t in tags:
            args += ["-t", t]
        args.append(str(context))
        return self.run(*args, buildkit=True, on_line=on_line)

    def image_id(self, ref: str) -> str | None:
        res = self.run("image", "inspect", "--format", "{{.Id}}", ref)
        return res.output.strip() if res.ok else None

    def inspect(self, ref: str) -> dict[str, Any]:
        res = self.run("image", "inspect", ref)
        if not res.ok:
            raise EnvironmentProblem(f"no local image {ref}: {res.tail(2)}")
        data = json.loads(res.output)
        return dict(data[0])

    def labels(self, ref: str) -> dict[str, str]:
        cfg = self.inspect(ref).get("Config") or {}
        return dict(cfg.get("Labels") or {})

    def history(self, ref: str) -> str:
        return self.run("history", "--no-trunc", "--format", "{{.CreatedBy}}", ref).output

    def tag(self, src: str, dst: str) -> Result:
        return self.run("tag", src, dst)

    def rmi(self, *refs: str) -> Result:
        return self.run("rmi", *refs)

    def save(self, ref: str, out: IO[bytes]) -> int:
        """`docker save REF` streamed into out; returns the exit code."""
        proc = subprocess.run(self.argv("save", ref), stdout=out, stderr=subprocess.PIPE, check=False)
        return proc.returncode

    # ---- registries ----
    def login(self, registry: str, username: str, password: str) -> Result:
        """`docker login --password-stdin` into the private config (no password on the command line)."""
        if self._config_dir is None:
            raise RuntimeError("login needs Docker(private_config=True) used as a context manager")
        check_secret(password, f"the password for {registry}")
        if password not in self.secrets:
            self.secrets.append(password)
        return self.run("login", "--username", username, "--password-stdin", registry, stdin=password + "\n")

    def push(self, ref: str, on_line: Callable[[str], None] | None = None) -> Result:
        return self.run("push", ref, on_line=on_line)

    def pull(self, ref: str, on_line: Callable[[str], None] | None = None) -> Result:
        return self.run("pull", ref, on_line=on_line)


def pushed_digest(output: str) -> str | None:
    """The manifest digest `docker push` printed ('...: digest: sha256:... size: N')."""
    for line in reversed(output.splitlines()):
        if "digest: sha256:" in line:
            return "sha256:" + line.split("digest: sha256:", 1)[1].split()[0]
    return None
