"""The record of one `images build`: the image set a later `images push` pushes (`<output>/images.json`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnforge.builder.files import atomic_write_text
from attnforge.core.errors import ConfigurationError

RECORD_NAME = "images.json"


@dataclass
class BuiltImage:
    """One image of the set: its local reference, tags, labels and smoke result."""

    tag: str
    kind: str
    image_id: str
    labels: dict[str, str]
    aliases: list[str] = field(default_factory=list)
    smoke: dict[str, Any] = field(default_factory=dict)
    base: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    wheel: str = ""  # the finalized wheel installed (NGC: compiled on the base, kept under <out>/ngc/)


@dataclass
class ImageSet:
    """Every image one build made, under one local repository."""

    repository: str
    images: list[BuiltImage] = field(default_factory=list)
    created: str = ""
    schema: int = 1

    def local_ref(self, tag: str) -> str:
        return f"{self.repository}:{tag}"

    def tags(self) -> list[tuple[str, BuiltImage]]:
        """Every (tag, image): immutable tags first, then the moving aliases."""
        first = [(img.tag, img) for img in self.images]
        return first + [(a, img) for img in self.images for a in img.aliases]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "repository": self.repository,
            "created": self.created,
            "images": [asdict(i) for i in self.images],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImageSet:
        return cls(
            repository=data["repository"],
            images=[BuiltImage(**i) for i in data.get("images", [])],
            created=data.get("created", ""),
            schema=int(data.get("schema", 1)),
        )


def write_record(path: Path, images: ImageSet) -> None:
    """Write the record atomically (a reader sees the old or the new one)."""
    atomic_write_text(path, json.dumps(images.to_json(), indent=2, sort_keys=True) + "\n")


def read_record(path: Path) -> ImageSet:
    try:
        return ImageSet.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ConfigurationError(f"no image record {path}: run `attnforge images build` first") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"{path}: not an attnforge image record ({exc})") from None
