"""A small client of the Docker Registry HTTP API v2: tags, manifests, labels, delete.

Basic auth, and the bearer-token dance registries such as Harbor or GitLab answer with. Plain HTTP for
loopback registries (as docker itself trusts them), HTTPS (with an optional CA bundle) otherwise.
The password is only ever put into an Authorization header.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge.core.errors import EnvironmentProblem, PublishError

MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
)


@dataclass(frozen=True)
class Manifest:
    """A manifest's exact bytes (what a digest is computed over), its media type and digest."""

    body: bytes
    media_type: str
    digest: str

    @property
    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data


class RegistryAuthError(PublishError):
    """The registry refused the credentials (or wants some)."""


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def split_reference(registry: str) -> str:
    """'http://127.0.0.1:5000/' -> '127.0.0.1:5000' (the docker reference form)."""
    parsed = urllib.parse.urlparse(registry if "://" in registry else f"//{registry}")
    if parsed.username or parsed.password:
        raise PublishError("put registry credentials in an env var or file, not in the registry address")
    return parsed.netloc or registry.rstrip("/")


class Registry:
    """`Registry('127.0.0.1:5000', 'user', password)`; methods raise PublishError on refusal."""

    def __init__(
        self,
        host: str,
        username: str | None = None,
        password: str | None = None,
        *,
        scheme: str | None = None,
        ca_bundle: Path | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.host = split_reference(host)
        self.scheme = scheme or ("http" if is_loopback(self.host) else "https")
        self.username = username
        self.password = password
        self.timeout = timeout
        self._ssl = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
        self._token: dict[str, str] = {}

    # ---- transport ----
    def _basic(self) -> str | None:
        if self.username is None or self.password is None:
            return None
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def _open(self, req: urllib.request.Request) -> tuple[int, dict[str, str], bytes]:
        try:
            with urllib.request.urlopen(
                req, timeout=self.timeout, context=self._ssl if self.scheme == "https" else None
            ) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise EnvironmentProblem(f"registry {self.host} unreachable: {exc}") from None

    def _bearer(self, challenge: str, scope: str) -> str:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        if not realm:
            raise RegistryAuthError(f"registry {self.host}: bearer challenge without realm")
        query = {"service": params.get("service", "")}
        if scope:
            query["scope"] = scope
        req = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(query)}")
        basic = self._basic()
        if basic:
            req.add_header("Authorization", basic)
        status, _, body = self._open(req)
        if status != 200:
            raise RegistryAuthError(
                f"registry {self.host} refused a token for user {self.username!r} ({status})"
            )
        data = json.loads(body)
        return str(data.get("token") or data.get("access_token") or "")

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        scope: str = "",
    ) -> tuple[int, dict[str, str], bytes]:
        url = f"{self.scheme}://{self.host}{path}"
        hdrs = dict(headers or {})
        auth = self._token.get(scope) or self._basic()
        for _attempt in range(2):
            req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
            if auth:
                req.add_header("Authorization", auth)
            status, rh, body = self._open(req)
            if status == 401:
                challenge = rh.get("www-authenticate", "")
                if challenge.lower().startswith("bearer") and not (auth or "").startswith("Bearer"):
                    auth = "Bearer " + self._bearer(challenge, scope)
                    self._token[scope] = auth
                    continue
                who = f"user {self.username!r}" if self.username else "anonymous access"
                raise RegistryAuthError(f"registry {self.host} refused {who} (401 on {method} {path})")
            return status, rh, body
        raise RegistryAuthError(f"registry {self.host} refused the token for {method} {path}")

    # ---- API ----
    def ping(self) -> None:
        """GET /v2/: PublishError when the credentials are refused."""
        status, _, body = self.request("GET", "/v2/")
        if status != 200:
            raise PublishError(f"registry {self.host}: GET /v2/ answered {status}: {body[:200]!r}")

    def tags(self, repo: str) -> list[str]:
        out: list[str] = []
        path = f"/v2/{repo}/tags/list?n=1000"
        while path:
            status, rh, body = self.request("GET", path, scope=f"repository:{repo}:pull")
            if status == 404:
                return []
            if status != 200:
                raise PublishError(f"registry {self.host}: tags of {repo}: {status}")
            out += json.loads(body).get("tags") or []
            link = rh.get("link", "")
            m = re.match(r"<([^>]+)>", link)
            path = m.group(1) if m else ""
        return sorted(out)

    def get_manifest(self, repo: str, ref: str) -> Manifest | None:
        status, rh, body = self.request(
            "GET",
            f"/v2/{repo}/manifests/{ref}",
            headers={"Accept": ", ".join(MANIFEST_TYPES)},
            scope=f"repository:{repo}:pull",
        )
        if status == 404:
            return None
        if status != 200:
            raise PublishError(f"registry {self.host}: manifest {repo}:{ref}: {status}")
        digest = rh.get("docker-content-digest") or "sha256:" + hashlib.sha256(body).hexdigest()
        return Manifest(body, rh.get("content-type", MANIFEST_TYPES[0]).split(";")[0], digest)

    def digest(self, repo: str, ref: str) -> str | None:
        m = self.get_manifest(repo, ref)
        return m.digest if m else None

    def put_manifest(self, repo: str, ref: str, manifest: Manifest) -> None:
        status, _, body = self.request(
            "PUT",
            f"/v2/{repo}/manifests/{ref}",
            headers={"Content-Type": manifest.media_type},
            data=manifest.body,
            scope=f"repository:{repo}:pull,push",
        )
        if status not in (200, 201):
            raise PublishError(f"registry {self.host}: PUT manifest {repo}:{ref}: {status} {body[:200]!r}")

    def delete_manifest(self, repo: str, digest: str) -> None:
        status, _, body = self.request(
            "DELETE", f"/v2/{repo}/manifests/{digest}", scope=f"repository:{repo}:delete"
        )
        if status == 405:
            raise PublishError(
                f"registry {self.host} does not allow deletes (storage.delete.enabled: true): {repo}@{digest} stays"
            )
        if status not in (200, 202, 404):
            raise PublishError(f"registry {self.host}: DELETE {repo}@{digest}: {status} {body[:200]!r}")

    def blob(self, repo: str, digest: str) -> bytes:
        status, _, body = self.request("GET", f"/v2/{repo}/blobs/{digest}", scope=f"repository:{repo}:pull")
        if status != 200:
            raise PublishError(f"registry {self.host}: blob {repo}@{digest}: {status}")
        return body

    def labels(self, repo: str, ref: str) -> dict[str, str]:
        """The image config's labels (first platform of an index)."""
        m = self.get_manifest(repo, ref)
        if m is None:
            return {}
        doc = m.json
        if "manifests" in doc:  # an index: take linux/amd64 or the first
            pick = next(
                (x for x in doc["manifests"] if (x.get("platform") or {}).get("architecture") == "amd64"),
                doc["manifests"][0] if doc["manifests"] else None,
            )
            if pick is None:
                return {}
            sub = self.get_manifest(repo, pick["digest"])
            if sub is None:
                return {}
            doc = sub.json
        cfg = json.loads(self.blob(repo, doc["config"]["digest"]))
        return dict((cfg.get("config") or {}).get("Labels") or {})
