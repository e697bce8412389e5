"""A throwaway authenticated registry: Debian's `docker-registry` (distribution 2.8) on 127.0.0.1.

For tests and demos: htpasswd (bcrypt) auth, deletes enabled (the rollback of a failed push uses them),
a filesystem root in a temporary folder. The password reaches `htpasswd -iB` on stdin, never argv.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from attnforge.core.errors import EnvironmentProblem

REGISTRY_BIN = "docker-registry"

CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
auth:
  htpasswd:
    realm: attnforge-registry
    path: {htpasswd}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bcrypt_htpasswd(username: str, password: str) -> str:
    """One htpasswd line with a bcrypt hash (apache2-utils' htpasswd, else passlib+bcrypt)."""
    exe = shutil.which("htpasswd")
    if exe:
        proc = subprocess.run(
            [exe, "-niB", username], input=password + "\n", capture_output=True, text=True, check=False
        )
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip().splitlines()[0]
    try:
        from passlib.hash import bcrypt

        return f"{username}:{bcrypt.using(rounds=10).hash(password)}"
    except Exception as exc:
        raise EnvironmentProblem(
            f"cannot make a bcrypt htpasswd line: apt-get install apache2-utils (or pip install bcrypt): {exc}"
        ) from None


class LocalRegistry:
    """`with LocalRegistry({'user': 'pw'}) as reg: reg.host` -> '127.0.0.1:PORT'."""

    def __init__(self, users: dict[str, str], *, port: int | None = None, root: Path | None = None) -> None:
        self.users = users
        self.port = port or free_port()
        self._root = root
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalRegistry:
        exe = shutil.which(REGISTRY_BIN)
        if exe is None:
            raise EnvironmentProblem("docker-registry is not installed (apt-get install docker-registry)")
        self._tmp = Path(tempfile.mkdtemp(prefix="attnforge-registry-"))
        root = self._root or self._tmp / "data"
        root.mkdir(parents=True, exist_ok=True)
        htpasswd = self._tmp / "htpasswd"
        htpasswd.write_text("".join(bcrypt_htpasswd(u, p) + "\n" for u, p in self.users.items()))
        os.chmod(htpasswd, 0o600)
        config = self._tmp / "config.yml"
        config.write_text(CONFIG.format(root=root, port=self.port, htpasswd=htpasswd))
        self.log = self._tmp / "registry.log"
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(
                [exe, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1)
                break
            except urllib.error.HTTPError:
                break  # 401: up
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        if self._proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-800:]
            self.__exit__(None, None, None)
            raise EnvironmentProblem(f"docker-registry did not start: {tail}")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._proc = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
