"""What an image set is made of: one request per image (runtime: a finished wheel and the torch it needs;
NGC: a cell compiled on an NGC base), read from the wheels' manifests, plus the Flex kernel wheels that go
beside flash-attn, and the wheels or cells that get no image (with the reason)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnforge import names
from attnforge.core.errors import ConfigurationError
from attnforge.core.kernels import modules
from attnforge.images.ngc import BaseFacts
from attnforge.images.tags import ImageSpec, parity_text
from attnforge.matrix.cell import Cell
from attnforge.matrix.compat import NgcRelease
from attnforge.wheels.manifest import check_matches_wheel, read_manifest
from attnforge.wheels.naming import profile_tag_from_manifest


@dataclass
class ImageRequest:
    """One image to build and what it is built from."""

    spec: ImageSpec
    wheel: Path | None = None  # the finished wheel (ngc: set once compiled on the base and finalized)
    extra_wheels: list[Path] = field(default_factory=list)  # runtime: e.g. the Flex kernel wheel
    manifest: dict[str, Any] = field(default_factory=dict)  # copied into the image
    torch_requirement: str = ""  # runtime
    torch_variant: str = ""  # runtime
    ngc: NgcRelease | None = None
    ngc_image: str = ""
    ngc_policy: str = "replace"
    ngc_facts: BaseFacts | None = None
    template: Cell | None = None  # ngc: the planned cell (kernel, profile, arches) the image compiles
    cell: Cell | None = None  # ngc: that cell aimed at the base's own torch (`apply_ngc_facts`)
    expect: dict[str, str] = field(default_factory=dict)


@dataclass
class Skipped:
    """A wheel or cell that gets no image, and why."""

    what: str
    why: str


def read_wheel_manifests(wheels_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(wheel, manifest) for every `*.whl.manifest.json` whose wheel is present and matches its bytes."""
    out: list[tuple[Path, dict[str, Any]]] = []
    for mpath in sorted(wheels_dir.glob("*.whl.manifest.json")):
        data = read_manifest(mpath)
        wheel = wheels_dir / str(data.get("wheel") or mpath.name[: -len(".manifest.json")])
        if not wheel.is_file():
            continue
        check_matches_wheel(wheel, data)
        out.append((wheel, data))
    return out


def _local_of(wheel_name: str) -> str:
    """The local version as the file name spells it (packaging would lower-case it)."""
    parts = wheel_name.split("-")
    return parts[1].partition("+")[2] if len(parts) >= 5 else ""


def _dist_version(wheel_name: str) -> str:
    """The version as the file name spells it (keeps 'cxx11abiTRUE' as upstream writes it)."""
    return wheel_name.split("-")[1]


def torch_requirement(torch: str, torch_variant: str, pypi_variant: str | None) -> str:
    """torch==X.Y.Z for PyPI's default build of a release, torch==X.Y.Z+variant otherwise."""
    public, _, local = torch.partition("+")
    variant = local or torch_variant
    if not variant or variant == pypi_variant:
        return f"torch=={public}"
    return f"torch=={public}+{variant}"


def runtime_request(
    wheel: Path, manifest: dict[str, Any], *, base: str, pypi_variant: str | None = None
) -> ImageRequest:
    """The runtime image of one finished wheel."""
    inputs = manifest.get("inputs") or {}
    tag = profile_tag_from_manifest(manifest, _local_of(wheel.name))
    torch_built = str((manifest.get("toolchain") or {}).get("torch") or inputs.get("torch") or "")
    variant = str(inputs.get("torch_variant") or "")
    spec = ImageSpec(
        kind="runtime",
        kernel=str(manifest.get("kernel", "flash-attn")),
        kernel_version=str(manifest["kernel_version"]),
        dist_version=_dist_version(wheel.name),
        variant=str(manifest.get("variant") or ""),
        python=str(inputs["python"]),
        toolkit=str(inputs["toolkit"]),
        torch=torch_built,
        arches=tuple(inputs.get("arches") or ()),
        profile=str(inputs.get("profile", "full")),
        profile_tag=tag,
        cxx11_abi=bool(inputs.get("cxx11_abi", True)),
        parity=parity_text(manifest.get("parity")),
        base_image=base,
    )
    if not spec.variant:
        raise ConfigurationError(f"{wheel.name}: its manifest names no variant")
    return ImageRequest(
        spec=spec,
        wheel=wheel,
        manifest=manifest,
        torch_requirement=torch_requirement(torch_built, variant, pypi_variant),
        torch_variant=variant,
        expect={
            "torch": torch_built,
            "flash_attn": spec.dist_version,
            "kind": "runtime",
            **modules(spec.kernel),
        },
    )


FLEX_DIST = "attnforge_flex_kernels"


def flex_wheels_for(req: ImageRequest, wheels_dir: Path) -> list[Path]:
    """The FlexAttention kernel wheels (helper `attnforge.flex`) built for this image's torch and toolkit."""
    spec = req.spec
    family = names.torch_family(spec.torch)
    accel = names.toolkit_variant(spec.toolkit) or spec.toolkit
    out = []
    for wheel in sorted(wheels_dir.glob(f"{FLEX_DIST}-*.whl")):
        parts = names.parse_flex_local(_local_of(wheel.name))
        if parts is not None and parts.torch_family == family and parts.accel == accel:
            out.append(wheel)
    return out


def with_flex(req: ImageRequest, wheels: list[Path]) -> ImageRequest:
    """The request with Flex kernel wheels added (and said so in a label)."""
    if not wheels:
        return replace(
            req, spec=replace(req.spec, extra_labels={**req.spec.extra_labels, "io.attnforge.flex": "none"})
        )
    names = ", ".join(_dist_version(w.name) for w in wheels)
    spec = replace(
        req.spec,
        extra_labels={**req.spec.extra_labels, "io.attnforge.flex": f"attnforge-flex-kernels {names}"},
    )
    return replace(req, spec=spec, extra_wheels=[*req.extra_wheels, *wheels])
