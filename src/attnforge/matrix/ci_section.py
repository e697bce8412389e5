"""matrix.yaml's ``ci`` section (pydantic): how the workflows of ``attnforge ci generate`` install attnforge and
where their release publishes.

    ci:
      attnforge: {version: "0.1.0"}          # or {wheel: URL} or {index_url: URL, version: ...}
      publish_to: internal                   # a destination of `destinations:`

``mode: self`` is for attnforge's own repository: its workflows run its nox sessions from the checkout.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")


class AttnforgeSource(BaseModel):
    """Where the generated jobs install attnforge from: one pinned release, one wheel, or an index."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str | None = Field(
        None,
        pattern=VERSION_RE.pattern,
        description="the attnforge release to install (default: the version that generated the workflows)",
    )
    wheel: str | None = Field(
        None,
        description="URL of an attnforge wheel to install instead of a release (https://... or file:///...)",
    )
    index_url: str | None = Field(
        None,
        description="package index to install attnforge (and its dependencies) from instead of PyPI",
    )

    @model_validator(mode="after")
    def _one_source(self) -> AttnforgeSource:
        if self.wheel is not None:
            if self.version is not None or self.index_url is not None:
                raise ValueError("`wheel` names one file; give it without `version`/`index_url`")
            if not self.wheel.endswith(".whl") or "://" not in self.wheel:
                raise ValueError(f"wheel {self.wheel!r} is not a URL of a .whl file")
        if self.index_url is not None and not self.index_url.startswith(("https://", "http://", "file://")):
            raise ValueError(f"index_url {self.index_url!r} is not an http(s) or file URL")
        return self


class CiSection(BaseModel):
    """The generated workflows' settings that belong to the repository."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["user", "self"] = Field(
        "user",
        description="user: steps install a pinned attnforge and call it; self: attnforge's own repository (nox)",
    )
    attnforge: AttnforgeSource = AttnforgeSource()
    publish_to: str = Field("internal", description="the destination the release workflow publishes to")
