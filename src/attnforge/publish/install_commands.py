"""What a user types to install one wheel of an attnforge index: the pip command and the uv configuration.

`attnforge which` prints them for the wheel that fits an environment, and the coverage page shows them for
every published wheel; both come from here, so they are the same text.

- pip: `pip install <project>==<version> --index-url <root>/<variant>/simple`. The local version is pinned
  (PyPI's own flash-attn has a higher public version), the variant's index holds only that variant.
- uv: a `[[tool.uv.index]]` entry for the index's `all/simple` tree, `explicit = true` (only the packages a
  source names come from it), a `[tool.uv.sources]` entry pointing the project at it, and the requirement
  `uv add` writes: the exact version (it names the variant) with the wheel's platform as a marker, so a
  project that also runs elsewhere (a laptop without CUDA) resolves and syncs there without it. The index
  entry is the same for every variant: switching torch means a new pin, nothing else.
"""

from __future__ import annotations

from packaging.utils import canonicalize_name, parse_wheel_filename

from attnforge.publish.index import ALL

# a platform tag's machine suffix -> PEP 508 `platform_machine` on Linux
_MACHINES = ("x86_64", "aarch64", "ppc64le", "s390x", "armv7l", "i686", "riscv64")


def index_root(url: str) -> str:
    """The index root as commands spell it: no trailing slash."""
    return url.rstrip("/")


def variant_index(root: str, variant: str) -> str:
    """`<root>/<variant>/simple`: the per-variant tree pip is pointed at."""
    return f"{index_root(root)}/{variant}/simple"


def pip_command(project: str, version: str, root: str, variant: str) -> str:
    """The one-line pip command for `project==version` from the variant's tree of the index at `root`."""
    return f"pip install {project}=={version} --index-url {variant_index(root, variant)}"


def platform_marker(filename: str) -> str | None:
    """The PEP 508 marker of the platforms a wheel installs on (None: every platform, a `-any` wheel)."""
    platforms = {t.platform for t in parse_wheel_filename(filename)[3]}
    if platforms == {"any"}:
        return None
    machines = sorted({m for p in platforms for m in _MACHINES if p.endswith("_" + m)})
    marker = "sys_platform == 'linux'"
    if len(machines) == 1:
        marker += f" and platform_machine == '{machines[0]}'"
    return marker


def uv_index_name(project: str) -> str:
    """The `[[tool.uv.index]]` name: one per kernel project, whatever its variant (`attnforge-flash-attn`)."""
    return f"attnforge-{canonicalize_name(project)}"


def uv_requirement(project: str, version: str, filename: str) -> str:
    """The dependency `uv add` records: the exact version, with the wheel's platform marker."""
    marker = platform_marker(filename)
    return f"{project}=={version}" + (f"; {marker}" if marker else "")


def uv_config(project: str, version: str, filename: str, root: str, variant: str) -> str:
    """pyproject.toml entries (with the `uv add` to run after merging them) that make uv install this wheel."""
    name = uv_index_name(project)
    requirement = uv_requirement(project, version, filename)
    lines = [
        f"# {project} {version} (variant {variant}) from the attnforge index {index_root(root)}:",
        "# merge these entries into pyproject.toml, then run",
        f'#   uv add "{requirement}"',
        "",
        "[[tool.uv.index]]",
        f'name = "{name}"',
        f'url = "{index_root(root)}/{ALL}/simple"',
        "explicit = true",
        "",
        "[tool.uv.sources]",
        f'{canonicalize_name(project)} = {{ index = "{name}" }}',
    ]
    return "\n".join(lines) + "\n"
