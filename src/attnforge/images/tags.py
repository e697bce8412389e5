"""What an image is (ImageSpec), its tags and its OCI + attnforge labels.

Tags: `flash-attn<ver>-<variant>[-<profile tag>][-<arches>]-py<X.Y>`, immutable by convention, plus one
moving alias per variant family, `<variant>[-<profile tag>][-<arches>]-latest`, on the newest
(kernel version, Python) of the set. The arch suffix appears only where two images of one set would
otherwise share a tag (the image with the most arches keeps the plain tag).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.version import InvalidVersion, Version

from attnforge.core.errors import ConfigurationError
from attnforge.names import ALIAS_SUFFIX, image_family, image_tag, parse_image_tag

LABEL_PREFIX = "io.attnforge."
OCI = "org.opencontainers.image."
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class ImageSpec:
    """One image to build: which wheel (or source), on which base, for which torch/toolkit/arches."""

    kind: str  # "runtime" | "ngc"
    kernel: str  # "flash-attn"
    kernel_version: str  # "2.8.3" (public)
    dist_version: str  # "2.8.3+cu130torch2.14cxx11abiTRUE.fwd128"
    variant: str  # "cu130-torch2.14" (runtime) | "ngc25.06" (ngc)
    python: str  # "3.11"
    toolkit: str  # "cuda13.0"
    torch: str  # the torch in the image: "2.14.1+cu130" | NGC's "2.8.0a0+5228986c39"
    arches: tuple[str, ...]
    profile: str = "full"
    profile_tag: str | None = None
    cxx11_abi: bool = True
    parity: str = "not run"
    base_image: str = ""
    base_digest: str = ""
    arch_suffix: bool = False
    extra_labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def arch_slug(self) -> str:
        return "-".join(a.replace("_", "") for a in self.arches) or "noarch"

    @property
    def family(self) -> str:
        """The tag's middle part: variant, profile tag, arches where needed (`attnforge.names`)."""
        return image_family(self.variant, self.profile_tag, self.arch_slug if self.arch_suffix else None)

    @property
    def tag(self) -> str:
        """`flash-attn2.8.3-<family>-py3.12`; a kernel name ending in a digit gets a dash before the version
        (`flash-attn-3-3.0.0-cu130-sm90a-torch2.9abi3-fa3hd64128-py3.12`)."""
        return image_tag(self.kernel, self.kernel_version, self.family, self.python)

    @property
    def alias(self) -> str:
        return f"{self.family}{ALIAS_SUFFIX}"

    def labels(
        self, *, created: str, revision: str = "", source: str = "", extra: dict[str, str] | None = None
    ) -> dict[str, str]:
        """OCI labels plus attnforge's own (see docs/images.md)."""
        what = "NGC PyTorch" if self.kind == "ngc" else "runtime"
        labels = {
            OCI + "title": f"{self.kernel} {self.dist_version} {what} image ({self.family}, py{self.python})",
            OCI + "description": (
                f"{self.kernel} {self.kernel_version} for torch {self.torch}, {self.toolkit}, "
                f"arches {','.join(self.arches) or '-'}, profile {self.profile}"
            ),
            OCI + "version": self.dist_version,
            OCI + "created": created,
            OCI + "vendor": "attnforge",
            OCI + "licenses": "BSD-3-Clause",
            OCI + "ref.name": self.tag,
            OCI + "base.name": self.base_image,
            OCI + "base.digest": self.base_digest,
            LABEL_PREFIX + "kind": self.kind,
            LABEL_PREFIX + "kernel": self.kernel,
            LABEL_PREFIX + "flash-attn": self.dist_version,
            LABEL_PREFIX + "variant": self.variant,
            LABEL_PREFIX + "torch": self.torch,
            LABEL_PREFIX + "toolkit": self.toolkit,
            LABEL_PREFIX + "arches": ",".join(self.arches),
            LABEL_PREFIX + "profile": self.profile,
            LABEL_PREFIX + "python": self.python,
            LABEL_PREFIX + "cxx11abi": "TRUE" if self.cxx11_abi else "FALSE",
            LABEL_PREFIX + "parity": self.parity,
        }
        if revision:
            labels[OCI + "revision"] = revision
        if source:
            labels[OCI + "source"] = source
        labels.update(self.extra_labels)
        labels.update(extra or {})
        return labels


def parity_text(parity: dict[str, Any] | None) -> str:
    """The manifest's parity block as one label value."""
    if not parity:
        return "not run"
    state = "passed" if parity.get("passed") else "failed"
    where = ", ".join(str(parity[k]) for k in ("device", "date") if parity.get(k))
    return f"{state} ({where})" if where else state


def _version_key(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def resolve_tags(specs: list[ImageSpec]) -> list[ImageSpec]:
    """Give images that would share a tag an arch suffix (all but the one with the most arches)."""
    by_tag: dict[str, list[ImageSpec]] = {}
    for s in specs:
        by_tag.setdefault(s.tag, []).append(s)
    out: list[ImageSpec] = []
    for s in specs:
        group = by_tag[s.tag]
        if len(group) > 1:
            widest = max(group, key=lambda g: (len(g.arches), g.arches))
            if s is not widest:
                s = replace(s, arch_suffix=True)
        out.append(s)
    tags = [s.tag for s in out]
    dupes = sorted({t for t in tags if tags.count(t) > 1})
    if dupes:
        raise ConfigurationError(f"two images of one set would share the tag(s) {', '.join(dupes)}")
    for t in tags:
        if not TAG_RE.match(t):
            raise ConfigurationError(f"'{t}' is not a valid image tag (letters, digits, _ . -, at most 128)")
    return out


def aliases(specs: list[ImageSpec]) -> dict[str, str]:
    """alias -> tag: each family's newest (kernel version, Python)."""
    best: dict[str, ImageSpec] = {}
    for s in specs:
        cur = best.get(s.alias)
        key = (_version_key(s.kernel_version), _version_key(s.python))
        if cur is None or key > (_version_key(cur.kernel_version), _version_key(cur.python)):
            best[s.alias] = s
    return {alias: s.tag for alias, s in sorted(best.items())}


def is_alias(tag: str) -> bool:
    return tag.endswith(ALIAS_SUFFIX)


def parse_tag(tag: str) -> dict[str, str] | None:
    """kernel, version, family, py of an immutable tag (None for aliases and foreign tags)."""
    return parse_image_tag(tag)
