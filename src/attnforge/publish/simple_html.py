"""PEP 503 project pages read back as PEP 691 JSON would list them: each anchor's file name, URL (its
`#sha256=` fragment moved into `hashes`), PEP 592 yank and `requires-python`. `publish.upload` reads an index
server's page with it; `which` and `--verify` read an index that serves only HTML (pypiserver) with it."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urlsplit


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        attr = dict(attrs)
        href = attr.get("href") or ""
        path, _, fragment = href.partition("#")
        name = unquote(urlsplit(path).path.rsplit("/", 1)[-1])
        if not name:
            return
        algo, _, digest = fragment.partition("=")
        entry: dict[str, Any] = {"filename": name, "url": path, "hashes": {algo: digest} if digest else {}}
        if "data-yanked" in attr:  # PEP 592: the attribute's presence yanks, its text is the reason
            entry["yanked"] = attr["data-yanked"] or True
        if attr.get("data-requires-python"):
            entry["requires-python"] = attr["data-requires-python"]
        self.files.append(entry)


def read_simple_html(text: str) -> dict[str, Any]:
    """`{"meta": {"api-version": "1.0"}, "files": [...]}` from a PEP 503 project page's HTML."""
    parser = _Anchors()
    parser.feed(text)
    return {"meta": {"api-version": "1.0"}, "files": parser.files}


def sha256_by_name(text: str) -> dict[str, str]:
    """filename -> the sha256 the page lists for it ("" when it lists none)."""
    return {f["filename"]: str(f["hashes"].get("sha256", "")) for f in read_simple_html(text)["files"]}
