"""How pip inside an image build (the cuda-builder image's CUDA wheels, a runtime image's torch) reaches its
indexes: the plan (index, extra indexes, local mirrors served over 127.0.0.1) and the BuildKit secrets made from
it (pip.conf, CA bundle, netrc), so no index address or credential lands in a layer or in `docker history`."""

from __future__ import annotations

import os
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.engine.backends.localindex import LocalIndexServer, Sources
from attnforge.engine.backends.pip_config import PipOptions

PYPI = "https://pypi.org/simple"


def _userinfo(url: str) -> bool:
    parsed = urllib.parse.urlparse(url)
    return bool(parsed.username or parsed.password)


@dataclass
class PipPlan:
    """How pip inside a build reaches its indexes: the pip.conf secret and the other secrets."""

    index_url: str
    extra_index_urls: list[str]
    local: Sources
    notes: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)  # remote find-links pages


def plan_pip(
    *, torch_index: str | None, options: PipOptions | None, extra_index_urls: list[str] | None = None
) -> PipPlan:
    """Decide the indexes: --torch-index alone, or the matrix/host pip options with local paths served."""
    extras = list(extra_index_urls or [])
    for url in [torch_index or "", *extras]:
        if url and _userinfo(url):
            raise ConfigurationError(
                "an index URL carries credentials: give them as a netrc file (--netrc), which reaches pip "
                "as a BuildKit secret, never in the URL (it would land in docker history)"
            )
    local = Sources()
    notes: list[str] = []
    if torch_index:
        return PipPlan(torch_index, extras, local, notes)
    index = PYPI
    links: list[str] = []
    args = list(options.args if options else [])
    for flag, value in zip(args[::2], args[1::2], strict=False):
        parsed = urllib.parse.urlparse(value)
        path = (
            Path(parsed.path) if parsed.scheme == "file" else Path(value) if value.startswith("/") else None
        )
        if flag == "--constraint":
            notes.append(f"pip constraint {value} not applied inside images (torch is pinned exactly)")
        elif path is not None:
            if not path.exists():
                notes.append(f"pip source {value} does not exist; skipped")
            elif flag == "--find-links":
                local.find_links.append(path)
            else:
                local.simple_roots.append(path)
        elif flag == "--index-url":
            index = value
        elif flag in ("--extra-index-url", "--find-links"):
            if _userinfo(value):
                raise ConfigurationError(f"pip option {flag} carries credentials: use --netrc")
            (extras if flag == "--extra-index-url" else links).append(value)
    return PipPlan(index, extras, local, notes, links)


@contextmanager
def pip_secrets(plan: PipPlan, *, ca_bundle: Path | None, netrc: Path | None) -> Iterator[dict[str, Path]]:
    """Serve local sources for the duration and yield the BuildKit secrets (id -> file)."""
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attnforge-pip-")))
        extras = list(plan.extra_index_urls)
        if plan.local.find_links or plan.local.simple_roots:
            server = stack.enter_context(LocalIndexServer(plan.local))
            extras.append(server.url)
        conf = tmp / "pip.conf"
        lines = ["[global]", f"index-url = {plan.index_url}"]
        if extras:
            lines.append("extra-index-url = " + " ".join(extras))
        if plan.find_links:
            lines.append("find-links = " + " ".join(plan.find_links))
        lines += ["timeout = 120", "retries = 2"]
        conf.write_text("\n".join(lines) + "\n")
        os.chmod(conf, 0o600)
        secrets = {"pip_conf": conf}
        if ca_bundle is not None:
            if not ca_bundle.is_file():
                raise EnvironmentProblem(f"CA bundle {ca_bundle} does not exist")
            secrets["ca_bundle"] = ca_bundle
        if netrc is not None:
            if not netrc.is_file():
                raise EnvironmentProblem(f"netrc {netrc} does not exist")
            secrets["pip_netrc"] = netrc
        yield secrets
