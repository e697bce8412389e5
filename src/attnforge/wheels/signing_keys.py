"""The site's signing key and the keys records are trusted from (ed25519, PEM files; docs/records.md).

Signing key, first found: `$ATTNFORGE_SIGNING_KEY`, matrix.yaml `signing.key`, else this machine's local
key (`signing-key.pem` in attnforge's configuration folder: `$ATTNFORGE_CONFIG_DIR`, else
`$XDG_CONFIG_HOME/attnforge`, else `~/.config/attnforge`; made on first use, saying where). Trusted keys, first found:
`$ATTNFORGE_TRUSTED_KEYS` (paths separated by `:`), matrix.yaml `signing.trusted_keys`, else the public half
of the signing key. A key's id is securesystemslib's default key id (sha256 of its canonical public form).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)
from securesystemslib.signer import CryptoSigner, SSlibKey

from attnforge.builder.files import atomic_write_bytes
from attnforge.core.errors import ConfigurationError
from attnforge.matrix.project import Project

KEY_ENV = "ATTNFORGE_SIGNING_KEY"
TRUSTED_ENV = "ATTNFORGE_TRUSTED_KEYS"
LOCAL_KEY_NAME = "signing-key.pem"
CONFIG_DIR_ENV = "ATTNFORGE_CONFIG_DIR"

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class SigningConfig:
    """What matrix.yaml's `signing:` names (paths already resolved against the matrix's folder)."""

    key: Path | None = None
    trusted_keys: tuple[Path, ...] = ()


@dataclass(frozen=True)
class SiteKey:
    """A private key that signs records, and where it came from (for messages)."""

    signer: CryptoSigner
    path: Path
    origin: str

    @property
    def keyid(self) -> str:
        return str(self.signer.public_key.keyid)


@dataclass(frozen=True)
class TrustedKey:
    """A public key records may be signed with, and where it came from."""

    key: SSlibKey
    origin: str

    @property
    def keyid(self) -> str:
        return str(self.key.keyid)


def project_signing(project: Project | None) -> SigningConfig:
    """matrix.yaml's `signing:` (nothing when there is no matrix.yaml: commands that work without one)."""
    if project is None or not project.matrix_path.is_file():
        return SigningConfig()
    spec = project.matrix.signing
    return SigningConfig(
        key=project.path(spec.key) if spec.key else None,
        trusted_keys=tuple(project.path(p) for p in spec.trusted_keys),
    )


def config_dir() -> Path:
    """attnforge's own configuration folder: `$ATTNFORGE_CONFIG_DIR`, else `$XDG_CONFIG_HOME/attnforge`, else
    `~/.config/attnforge` (a test run, a CI job or a container points the variable at a folder of its own)."""
    own = os.environ.get(CONFIG_DIR_ENV)
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "attnforge"


def local_key_path() -> Path:
    """This machine's own key: `signing-key.pem` in `config_dir()`."""
    return config_dir() / LOCAL_KEY_NAME


def public_path_for(private: Path) -> Path:
    """`site.pem` -> `site.pub` (the public half written beside a generated key)."""
    return private.with_suffix(".pub")


def short(keyid: str) -> str:
    """The first 16 hex digits of a key id, as messages print it."""
    return keyid[:16]


def _public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)


def generate_key(path: Path, *, overwrite: bool = False) -> SiteKey:
    """A new ed25519 key: private PEM (PKCS#8, mode 0600) at `path`, public PEM at `public_path_for(path)`."""
    if path.exists() and not overwrite:
        raise ConfigurationError(f"{path} exists: refusing to replace a signing key (remove it first)")
    signer = CryptoSigner.generate_ed25519()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(signer.private_bytes)
    public = load_pem_private_key(signer.private_bytes, password=None).public_key()
    assert isinstance(public, Ed25519PublicKey)
    atomic_write_bytes(public_path_for(path), _public_pem(public))
    return SiteKey(signer, path, f"generated at {path}")


def load_signer(path: Path, origin: str) -> SiteKey:
    """The ed25519 private key in `path` (PEM); ConfigurationError naming the file and `origin`."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"signing key {path} ({origin}): {exc.strerror or exc}") from None
    try:
        private = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"signing key {path} ({origin}) is not an unencrypted PEM private key: {exc}",
            hint="make one with `attnforge keys generate PATH`",
        ) from None
    if not isinstance(private, Ed25519PrivateKey):
        raise ConfigurationError(f"signing key {path} ({origin}) is not an ed25519 key")
    return SiteKey(CryptoSigner(private), path, origin)


def load_public(path: Path, origin: str) -> TrustedKey:
    """A trusted key from a PEM public key (or the public half of a PEM private key)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"trusted key {path} ({origin}): {exc.strerror or exc}") from None
    public: object
    try:
        public = load_pem_public_key(data)
    except ValueError:
        try:
            public = load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError):
            raise ConfigurationError(f"trusted key {path} ({origin}) is not a PEM ed25519 key") from None
    if not isinstance(public, Ed25519PublicKey):
        raise ConfigurationError(f"trusted key {path} ({origin}) is not an ed25519 key")
    return TrustedKey(SSlibKey.from_crypto(public), f"{path} ({origin})")


def signing_key(config: SigningConfig, *, create: bool = True, log: Log = _quiet) -> SiteKey | None:
    """The key records are signed with (module docstring); the local key is made on first use when
    `create`, else None when there is none."""
    env = os.environ.get(KEY_ENV)
    if env:
        return load_signer(Path(env).expanduser(), f"${KEY_ENV}")
    if config.key is not None:
        return load_signer(config.key, "matrix.yaml signing.key")
    local = local_key_path()
    if local.is_file():
        return load_signer(local, "this machine's local key")
    if not create:
        return None
    made = generate_key(local)
    log(
        f"signing: no signing key configured (${KEY_ENV}, matrix.yaml signing.key): created this machine's "
        f"local key {short(made.keyid)} at {local} (public half {public_path_for(local)}; the folder is "
        f"${CONFIG_DIR_ENV}, else $XDG_CONFIG_HOME/attnforge, else ~/.config/attnforge); records it signs are "
        "trusted here only: configure signing.key for a site key (`attnforge docs records`)"
    )
    return SiteKey(made.signer, local, "this machine's local key")


def trusted_keys(config: SigningConfig, extra: Sequence[Path] = ()) -> list[TrustedKey]:
    """The keys records are accepted from (module docstring); `extra`: keys given on the command line,
    which replace the rest. Empty when none is configured and no signing key exists here."""
    if extra:
        return [load_public(p, "--trusted-key") for p in extra]
    env = os.environ.get(TRUSTED_ENV)
    if env:
        return [load_public(Path(p).expanduser(), f"${TRUSTED_ENV}") for p in env.split(os.pathsep) if p]
    if config.trusted_keys:
        return [load_public(p, "matrix.yaml signing.trusted_keys") for p in config.trusted_keys]
    own = signing_key(config, create=False)
    if own is None:
        return []
    return [TrustedKey(own.signer.public_key, f"{own.path} ({own.origin})")]


def describe(keys: Sequence[TrustedKey]) -> str:
    """`ab12... (path (origin)), ...` for messages."""
    return ", ".join(f"{short(k.keyid)} ({k.origin})" for k in keys) or "none"
