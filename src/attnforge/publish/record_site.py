"""The signed records of wheels published to an index server. pypiserver keeps packages only, so each
published wheel's provenance, SBOM, parity record and manifest go to the destination's `records` folder as
`<project>/<wheel><suffix>`, the layout a static index serves beside its wheels; served over HTTP, consumers
read them with `which --verify` / `doctor --verify --records-url URL` (docs/records.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge.builder.files import atomic_write_bytes
from attnforge.publish.index import Bundle
from attnforge.wheels.manifest import manifest_path_for


def record_files(bundle: Bundle) -> list[Path]:
    """What goes beside the wheel: its verified records (publish's gates set `bundle.records`) and manifest."""
    return [*bundle.records, manifest_path_for(bundle.wheel)]


def write_records(bundles: Sequence[Bundle], root: Path, published: Iterable[str]) -> str:
    """Copy the records of the `published` wheels (file names) into `root/<project>/`, each file replaced
    atomically (a parity record signed later reaches consumers on the next publish); a one-line summary."""
    keep = set(published)
    files = 0
    wheels = 0
    for bundle in bundles:
        if bundle.filename not in keep:
            continue
        folder = root / canonicalize_name(parse_wheel_filename(bundle.filename)[0])
        folder.mkdir(parents=True, exist_ok=True)
        for path in record_files(bundle):
            atomic_write_bytes(folder / path.name, path.read_bytes())
            files += 1
        wheels += 1
    return f"records: {files} file(s) of {wheels} wheel(s) in {root} (consumers: --records-url)"
