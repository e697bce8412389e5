"""The glibc floor of a wheel: no compiled file in it may need a glibc, libstdc++, libgcc or CXXABI symbol version
newer than the manylinux policy of the torch wheel it pins allows (PyPI's torch: `manylinux_2_28`), or the wheel
refuses machines that run that torch. The floor is read from torch's own wheel tags (recorded by the builder,
`builder/glibc_floor.py`); the symbol versions and the policies are auditwheel's.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnforge.core.errors import BuildError, EnvironmentProblem
from attnforge.wheels.wheelio import WheelContents

_ELF_NAME_RE = re.compile(r"\.so(\.\d+)*$")


@dataclass(frozen=True)
class Need:
    """One symbol version a compiled file needs from a library."""

    member: str
    library: str
    version: str
    symbols: tuple[str, ...] = ()


@dataclass(frozen=True)
class FloorCheck:
    """What the check found: the floor and where it came from, the highest version needed per family."""

    floor: str | None
    source: str
    highest: dict[str, str] = field(default_factory=dict)
    over: tuple[Need, ...] = ()

    def record(self) -> dict[str, Any]:
        """The manifest's `finalize.glibc_floor`."""
        return {"floor": self.floor, "from": self.source, "highest": self.highest}


def _auditwheel() -> tuple[Any, Any, Any, Any]:
    try:
        from auditwheel.architecture import Architecture
        from auditwheel.elfutils import elf_file_filter, elf_find_versioned_symbols
        from auditwheel.libc import Libc
        from auditwheel.policy import WheelPolicies
    except ImportError:
        raise EnvironmentProblem(
            "auditwheel is not installed", hint="pip install 'attnforge[build]'"
        ) from None
    return Architecture, Libc, WheelPolicies, (elf_file_filter, elf_find_versioned_symbols)


def _policies(arch: str) -> Any:
    architecture, libc, wheel_policies, _ = _auditwheel()
    try:
        return wheel_policies(libc=libc.GLIBC, arch=architecture(arch))
    except ValueError:
        raise BuildError(f"no manylinux policy for the architecture {arch}") from None


def floor_policy(tags: Sequence[str], arch: str) -> Any | None:
    """The most compatible manylinux policy among wheel ``tags`` (``cp311-cp311-manylinux_2_28_x86_64``) for
    ``arch``: where a wheel with those tags installs; None when no tag is a manylinux one."""
    policies = _policies(arch)
    best = None
    for tag in tags:
        for plat in tag.rsplit("-", 1)[-1].split("."):
            if not plat.startswith("manylinux") or not plat.endswith("_" + arch):
                continue
            try:
                policy = policies.get_policy_by_name(plat)
            except LookupError:
                continue
            if best is None or policy.priority > best.priority:  # higher priority: an older glibc
                best = policy
    return best


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def _symbols_of(elf: Any, version: str) -> tuple[str, ...]:
    """The undefined dynamic symbols of ``elf`` bound to ``version`` (read through the ELF object auditwheel
    opened: .gnu.version_r names the version indices, .gnu.version gives each .dynsym entry's index)."""
    verneed, versym, dynsym = (
        elf.get_section_by_name(n) for n in (".gnu.version_r", ".gnu.version", ".dynsym")
    )
    if verneed is None or versym is None or dynsym is None:
        return ()
    indices = {
        aux["vna_other"] for _, auxes in verneed.iter_versions() for aux in auxes if aux.name == version
    }
    found = []
    for i, sym in enumerate(dynsym.iter_symbols()):
        if sym["st_shndx"] == "SHN_UNDEF" and versym.get_symbol(i)["ndx"] in indices:
            found.append(sym.name)
    return tuple(sorted(found))


def needed_versions(files: Iterable[tuple[str, Path]]) -> list[Need]:
    """(member, path) of compiled files -> every (library, symbol version) each needs (auditwheel's reading)."""
    *_, (elf_file_filter, elf_find_versioned_symbols) = _auditwheel()
    names = {path: member for member, path in files}
    needs: list[Need] = []
    for path, elf in elf_file_filter(list(names)):
        for library, version in sorted(set(elf_find_versioned_symbols(elf))):
            needs.append(Need(names[path], library, version, _symbols_of(elf, version)))
    return needs


def above_floor(needs: Iterable[Need], policy: Any) -> list[Need]:
    """The needs the policy does not allow (families it names: GLIBC, GLIBCXX, CXXABI, GCC, ...)."""
    allowed: dict[str, frozenset[str]] = dict(policy.symbol_versions)
    over = []
    for need in needs:
        family, _, number = need.version.partition("_")
        if family in allowed and number not in allowed[family]:
            over.append(need)
    return over


def highest(needs: Iterable[Need]) -> dict[str, str]:
    """The newest version needed per family: {"GLIBC": "2.14", "GLIBCXX": "3.4.21", ...}."""
    best: dict[str, str] = {}
    for need in needs:
        family, _, number = need.version.partition("_")
        if number and (family not in best or _version_key(number) > _version_key(best[family])):
            best[family] = number
    return dict(sorted(best.items()))


def check_contents(
    contents: WheelContents, torch_tags: Sequence[str], arch: str, name: str | None = None
) -> FloorCheck:
    """Check a wheel's compiled members against the floor of ``torch_tags``; BuildError naming the wheel
    (``name``, default its file name), the first symbol above the floor, its version and the member."""
    policy = floor_policy(torch_tags, arch)
    elf_members = [m for m in contents.members if _ELF_NAME_RE.search(m)]
    with tempfile.TemporaryDirectory(prefix="attnforge-elf-") as tmp:
        files = []
        for i, member in enumerate(elf_members):
            path = Path(tmp) / f"{i}.so"
            path.write_bytes(contents.members[member].data)
            files.append((member, path))
        needs = needed_versions(files)
    if policy is None:
        why = (
            "torch's wheel tags are unknown"
            if not torch_tags
            else f"no manylinux tag in {', '.join(torch_tags)}"
        )
        return FloorCheck(None, f"not checked: {why}", highest(needs))
    source = f"torch's wheel tag {policy.name}"
    over = above_floor(needs, policy)
    if over:
        first = over[0]
        symbol = first.symbols[0] if first.symbols else "a symbol"
        more = f" (and {len(over) - 1} more above it)" if len(over) > 1 else ""
        raise BuildError(
            f"{name or contents.filename}: {first.member} needs {symbol}@{first.version} from {first.library}, "
            f"above {policy.name}, the floor of the torch wheel it pins{more}"
        )
    return FloorCheck(policy.name, source, highest(needs))
