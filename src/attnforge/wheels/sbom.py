"""A CycloneDX SBOM (JSON, spec 1.6, cyclonedx-python-lib) per finalized wheel: what it bundles or pins.

The wheel itself is the BOM's subject (`metadata.component`, with its sha256). Components: the kernel
source it was compiled from (sha256, patches as properties), CUTLASS as the source bundles it (the version,
content hash and commit the build read from the tree, else the commit the compat data records for that
release), libraries auditwheel grafted into the wheel (`*.libs/`, each
with its sha256), the CUDA (or ROCm) runtime it links but does not ship, and torch, which it pins
(`Requires-Dist`). Same wheel and manifest, same bytes: the serial number derives from the wheel's sha256
and the timestamp from finalize's SOURCE_DATE_EPOCH.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
import zipfile
from pathlib import Path
from typing import Any

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentScope, ComponentType
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from attnforge import __version__
from attnforge.matrix.cell import Toolkit
from attnforge.matrix.compat import load_compat

PROP = "attnforge"


def _sha(hexdigest: str) -> list[HashType]:
    return [HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)]


def _props(**values: object) -> list[Property]:
    return [Property(name=f"{PROP}:{k}", value=str(v)) for k, v in values.items() if v not in (None, "", [])]


def cutlass_commit(kernel: str, version: str) -> str | None:
    """The CUTLASS commit a kernel release's source bundles, where the compat data records it."""
    release = load_compat().kernel_release(kernel, version)
    commit = getattr(release, "cutlass_commit", None) if release is not None else None
    return str(commit) if commit else None


def cutlass_component(
    manifest: dict[str, Any], kernel: str, kversion: str, bundled_in: str | None
) -> Component:
    """CUTLASS as the source vendors it: the build's own reading of the tree (`manifest["vendored"]`: version
    from `include/cutlass/version.h`, a content hash, the commit where the tree knows it), else the commit the
    compat data records for the release; a commit nobody knows is said to be unknown, with why."""
    seen = dict((manifest.get("vendored") or {}).get("cutlass") or {})
    commit = seen.get("commit") or cutlass_commit(kernel, kversion)
    if seen.get("commit"):
        commit_from = f"the source tree ({seen.get('commit_from')})"
    elif commit:
        commit_from = "the compat data for this release"
    elif seen:
        commit_from = f"unknown: the source vendors {seen.get('path')} without git metadata"
    else:
        commit_from = "unknown: not recorded in the compat data for this release"
    version = str(seen.get("version") or commit or "unknown")
    return Component(
        type=ComponentType.LIBRARY,
        name="cutlass",
        version=version,
        bom_ref="cutlass",
        description="NVIDIA CUTLASS headers bundled in the kernel source, compiled into the extension",
        purl=PackageURL("github", namespace="NVIDIA", name="cutlass", version=commit) if commit else None,
        properties=_props(
            commit=commit or "unknown",
            commit_from=commit_from,
            version_from="include/cutlass/version.h" if seen.get("version") else None,
            tree_sha256=seen.get("tree_sha256"),
            tree_files=seen.get("files"),
            tree_hash="sha256 of the sorted 'path NUL sha256(file) LF' lines"
            if seen.get("tree_sha256")
            else None,
            path=seen.get("path"),
            bundled_in=bundled_in,
        ),
    )


def grafted_libraries(wheel: Path) -> list[tuple[str, str]]:
    """(member, sha256) of the shared libraries auditwheel grafted into the wheel (`<pkg>.libs/`)."""
    out = []
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            top = name.split("/", 1)[0]
            if top.endswith(".libs") and ".so" in name.rsplit("/", 1)[-1]:
                out.append((name, hashlib.sha256(zf.read(name)).hexdigest()))
    return out


def make_sbom(wheel: Path, manifest: dict[str, Any]) -> bytes:
    """The SBOM's JSON bytes (see the module docstring)."""
    inputs = manifest.get("inputs") or {}
    finalize = manifest.get("finalize") or {}
    kernel, kversion = str(manifest.get("kernel") or "flash-attn"), str(manifest.get("kernel_version"))
    version = wheel.name.split("-")[1]
    digest = str(manifest.get("sha256"))
    subject = Component(
        type=ComponentType.LIBRARY,
        name=kernel,
        version=version,
        bom_ref=wheel.name,
        purl=PackageURL("pypi", name=kernel, version=version, qualifiers={"file_name": wheel.name}),
        hashes=_sha(digest),
        properties=_props(variant=manifest.get("variant"), cell=manifest.get("cell_id")),
    )
    components: list[Component] = []
    source = Component(
        type=ComponentType.LIBRARY,
        name=f"{kernel}-source",
        version=kversion,
        bom_ref=f"{kernel}-{kversion}-source",
        scope=ComponentScope.EXCLUDED,
        description="the kernel source the wheel was compiled from",
        purl=PackageURL("pypi", name=kernel, version=kversion)
        if inputs.get("source") == "pypi-sdist"
        else None,
        hashes=_sha(str(inputs["source_sha256"])) if inputs.get("source_sha256") else [],
        properties=_props(source_kind=inputs.get("source"), patches=",".join(inputs.get("patches") or [])),
    )
    components.append(source)
    cutlass = cutlass_component(manifest, kernel, kversion, source.bom_ref.value)
    components.append(cutlass)
    for member, sha in grafted_libraries(wheel):
        components.append(
            Component(
                type=ComponentType.FILE,
                name=member.rsplit("/", 1)[-1],
                bom_ref=member,
                hashes=_sha(sha),
                description="grafted into the wheel by auditwheel",
                properties=_props(path=member),
            )
        )
    dependencies = [source, cutlass]
    if inputs.get("toolkit"):
        kit = Toolkit.parse(str(inputs["toolkit"]))
        runtime = Component(
            type=ComponentType.LIBRARY,
            name="cuda-runtime" if kit.kind == "cuda" else "rocm-runtime",
            version=kit.version,
            bom_ref="accelerator-runtime",
            scope=ComponentScope.REQUIRED,
            description="linked, not shipped: torch's own dependencies provide it",
            purl=PackageURL(
                "generic", name="cuda-runtime" if kit.kind == "cuda" else "rocm", version=kit.version
            ),
            properties=_props(not_bundled=",".join(finalize.get("excluded_libs") or [])),
        )
        components.append(runtime)
        dependencies.append(runtime)
    if inputs.get("torch"):
        torch = Component(
            type=ComponentType.FRAMEWORK,
            name="torch",
            version=str(inputs["torch"]),
            bom_ref="torch",
            scope=ComponentScope.REQUIRED,
            description="pinned by the wheel's Requires-Dist; compiled against this release",
            purl=PackageURL("pypi", name="torch", version=str(inputs["torch"])),
            properties=_props(
                requirement=finalize.get("torch_requirement"),
                variant=inputs.get("torch_variant"),
                built_with=(manifest.get("toolchain") or {}).get("torch"),
            ),
        )
        components.append(torch)
        dependencies.append(torch)
    epoch = finalize.get("source_date_epoch")
    stamp = dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc) if epoch else None
    tool = Component(type=ComponentType.APPLICATION, name="attnforge", version=__version__)
    bom = Bom(
        serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"urn:attnforge:sbom:{digest}"),
        metadata=BomMetaData(component=subject, timestamp=stamp, tools=ToolRepository(components=[tool])),
        components=components,
    )
    bom.register_dependency(subject, dependencies)
    return (JsonV1Dot6(bom).output_as_string(indent=2) + "\n").encode("utf-8")
