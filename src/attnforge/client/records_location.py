"""Where an index's wheel keeps its records and manifest: beside the wheel (a static attnforge index), or in the
records folder of an index server that keeps packages only (pypiserver: `--records-url`, `publish.record_site`)."""

from __future__ import annotations

from packaging.utils import canonicalize_name, parse_wheel_filename


def records_base(wheel_url: str, filename: str, records_url: str | None) -> str:
    """The URL the record suffixes (``.manifest.json``, ``.provenance.intoto.json``, ...) are appended to:
    the wheel's own URL, or ``<records_url>/<project>/<wheel file name>``."""
    if not records_url:
        return wheel_url
    project = canonicalize_name(parse_wheel_filename(filename)[0])
    return f"{records_url.rstrip('/')}/{project}/{filename}"
