"""The build's SLSA provenance (v1) predicate, made from what the wheel's manifest records, and the check
that a manifest still says what was signed.

`buildDefinition.externalParameters` is the cell (id, kernel, version, variant, inputs);
`internalParameters` what finalize and the build decided (local version, torch requirement, platform tag,
toolchain, backend and images). Both are copied from the manifest by `signed_facts`, so a publish can
recompute them from the manifest it is given and refuse any difference (`manifest_drift`).
`resolvedDependencies` lists the kernel source (sha256), each patch file (sha256), the builder image (its
id) and base, the CUDA/ROCm toolkit, torch and the host compiler; `byproducts` the SBOM (sha256).
"""

from __future__ import annotations

import hashlib
from typing import Any

from attnforge import __version__
from attnforge.builder.patches import patches_dir
from attnforge.matrix.cell import Toolkit

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:attnforge:wheel-build:v1"
SBOM_MEDIA_TYPE = "application/vnd.cyclonedx+json"

_EXTERNAL = ("cell_id", "kernel", "kernel_version", "variant", "inputs")
_INTERNAL = ("local_version", "kernel_set_key", "input_hash", "toolchain", "platform_tag", "rocm", "vendored")
_BUILD = ("backend", "image", "image_id", "base", "torch_build", "host_compiler", "patches_applied")


def signed_facts(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's keys the provenance carries: {"externalParameters": ..., "internalParameters": ...}."""
    external = {k: manifest[k] for k in _EXTERNAL if manifest.get(k) is not None}
    internal: dict[str, Any] = {k: manifest[k] for k in _INTERNAL if manifest.get(k) is not None}
    finalize = manifest.get("finalize") or {}
    if finalize.get("torch_requirement"):
        internal["torch_requirement"] = finalize["torch_requirement"]
    build = manifest.get("build") or {}
    kept = {k: build[k] for k in _BUILD if build.get(k) is not None}
    if kept:
        internal["build"] = kept
    return {"externalParameters": external, "internalParameters": internal}


def _sha256_prefixed(value: object) -> str | None:
    """`sha256:<hex>` or a bare 64-hex digest -> hex; anything else None."""
    text = str(value or "").rsplit("@", 1)[-1].removeprefix("sha256:")
    return text if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else None


def _patch_digest(name: str) -> str | None:
    path = patches_dir() / f"{name}.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def resolved_dependencies(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """SLSA ResourceDescriptors of what went into the build (see the module docstring)."""
    inputs = manifest.get("inputs") or {}
    toolchain = manifest.get("toolchain") or {}
    build = manifest.get("build") or {}
    deps: list[dict[str, Any]] = []
    source: dict[str, Any] = {
        "name": f"{manifest.get('kernel')}-{manifest.get('kernel_version')} source",
        "annotations": {"kind": inputs.get("source")},
    }
    if inputs.get("source") == "pypi-sdist":
        source["uri"] = f"pkg:pypi/{manifest.get('kernel')}@{manifest.get('kernel_version')}"
    if inputs.get("source_sha256"):
        source["digest"] = {"sha256": inputs["source_sha256"]}
    deps.append(source)
    for name in build.get("patches_applied") or inputs.get("patches") or []:
        patch: dict[str, Any] = {"name": f"patch {name}", "uri": f"urn:attnforge:patch:{name}"}
        if digest := _patch_digest(str(name)):
            patch["digest"] = {"sha256": digest}
        deps.append(patch)
    if build.get("image"):
        image: dict[str, Any] = {"name": "builder image", "uri": f"docker-image:{build['image']}"}
        if digest := _sha256_prefixed(build.get("image_id")):
            image["digest"] = {"sha256": digest}
        deps.append(image)
    if build.get("base"):
        base: dict[str, Any] = {"name": "builder base image", "uri": f"docker-image:{build['base']}"}
        if digest := _sha256_prefixed(build["base"]):
            base["digest"] = {"sha256": digest}
        deps.append(base)
    if inputs.get("toolkit"):
        kit = Toolkit.parse(str(inputs["toolkit"]))
        name = "cuda-toolkit" if kit.kind == "cuda" else "rocm"
        tool = toolchain.get("nvcc") or toolchain.get("hipcc") or kit.version
        deps.append(
            {"name": name, "uri": f"pkg:generic/{name}@{kit.version}", "annotations": {"compiler": tool}}
        )
    if inputs.get("torch"):
        deps.append(
            {
                "name": "torch",
                "uri": f"pkg:pypi/torch@{inputs['torch']}",
                "annotations": {
                    "built_with": toolchain.get("torch") or build.get("torch_build"),
                    "variant": inputs.get("torch_variant"),
                },
            }
        )
    compiler = build.get("host_compiler") or {}
    gcc = toolchain.get("gcc") or compiler.get("version")
    if gcc or compiler:
        deps.append(
            {
                "name": "host compiler",
                "uri": f"pkg:generic/{compiler.get('cxx') or 'g++'}@{gcc or 'unknown'}",
                "annotations": {k: v for k, v in compiler.items() if isinstance(v, (str, int, bool))},
            }
        )
    return deps


def predicate(manifest: dict[str, Any], sbom_name: str, sbom_sha256: str) -> dict[str, Any]:
    """The SLSA provenance v1 predicate of a finalized wheel's build."""
    build = manifest.get("build") or {}
    facts = signed_facts(manifest)
    metadata: dict[str, Any] = {}
    if manifest.get("input_hash"):
        metadata["invocationId"] = str(manifest["input_hash"])
    if build.get("started"):
        metadata["startedOn"] = str(build["started"])
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": facts["externalParameters"],
            "internalParameters": facts["internalParameters"],
            "resolvedDependencies": resolved_dependencies(manifest),
        },
        "runDetails": {
            "builder": {
                "id": f"urn:attnforge:builder:{build.get('backend') or 'unknown'}",
                "version": {"attnforge": __version__},
            },
            "metadata": metadata,
            "byproducts": [
                {"name": sbom_name, "digest": {"sha256": sbom_sha256}, "mediaType": SBOM_MEDIA_TYPE}
            ],
        },
    }


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value


def manifest_drift(manifest: dict[str, Any], signed: dict[str, Any]) -> list[str]:
    """Where the manifest differs from what the provenance signed: `key: manifest X, signed Y` lines."""
    definition = signed.get("buildDefinition") or {}
    have: dict[str, Any] = {}
    want: dict[str, Any] = {}
    facts = signed_facts(manifest)
    for part in ("externalParameters", "internalParameters"):
        _flatten(facts[part], "", have)
        _flatten(definition.get(part) or {}, "", want)
    lines = []
    for key in sorted(set(have) | set(want)):
        if have.get(key) != want.get(key):
            lines.append(f"{key}: manifest {have.get(key)!r}, signed {want.get(key)!r}")
    return lines


def sbom_digest(signed: dict[str, Any], sbom_name: str) -> str | None:
    """The sha256 the provenance records for the SBOM byproduct."""
    for item in (signed.get("runDetails") or {}).get("byproducts") or []:
        if isinstance(item, dict) and item.get("name") == sbom_name:
            return str((item.get("digest") or {}).get("sha256") or "") or None
    return None
