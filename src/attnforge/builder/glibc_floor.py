"""Keeping a built extension inside the glibc floor of the torch it pins (torch's wheels: manylinux_2_28).

libstdc++ 11 and newer read glibc's ``__libc_single_threaded`` (GLIBC_2.32) in ``ext/atomicity.h`` to skip
atomic reference counts while a process has one thread. The header takes that path whenever
``<sys/single_threaded.h>`` exists (``__has_include``; no macro turns it off), so an extension compiled on a
userland with glibc >= 2.32 (Debian bookworm: 2.36) needs glibc 2.32 for that one symbol, above torch's floor.

The builder links a hidden definition of the symbol, ``0`` ("not known to be single-threaded": the atomic
path, what libstdc++ does on glibc < 2.32 too), into every extension through ``LDFLAGS``: the reference
resolves inside the extension, nothing of it is exported, and no compile flag changes (kernel objects stay
reusable). ``wheels.glibc_floor`` checks the finished wheel against the floor read from torch's wheel tags.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .cross import cross_compilers, is_cross
from .exits import EXIT_ENV, BuildFailure
from .spec import BuildSpec

SHIM_SYMBOL = "__libc_single_threaded"
SHIM_SOURCE = (
    "/* attnforge: libstdc++'s reference to glibc's __libc_single_threaded (GLIBC_2.32) resolved inside the\n"
    "   extension: 0 means 'not known to be single-threaded', so reference counts stay atomic. */\n"
    f'__attribute__((visibility("hidden"))) char {SHIM_SYMBOL} = 0;\n'
)


def shim_object(cc: str | None, build_dir: Path, env: dict[str, str]) -> Path:
    """Compile the hidden definition with ``cc`` (the C compiler of the build, a cross one included) into
    ``build_dir``; BuildFailure(EXIT_ENV) naming the compiler when it cannot."""
    compiler = cc or shutil.which("cc", path=env.get("PATH")) or shutil.which("gcc", path=env.get("PATH"))
    if not compiler:
        raise BuildFailure(EXIT_ENV, "no C compiler (CC, cc, gcc) for the glibc-floor object")
    folder = build_dir / "glibc-floor"
    folder.mkdir(parents=True, exist_ok=True)
    source, obj = folder / "single_threaded.c", folder / "single_threaded.o"
    source.write_text(SHIM_SOURCE, encoding="utf-8")
    cmd = [*compiler.split(), "-c", "-fPIC", "-O2", str(source), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=300)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise BuildFailure(EXIT_ENV, f"{compiler} could not compile the glibc-floor object: {tail[0]}")
    return obj


def link_shim(env: dict[str, str], obj: Path) -> None:
    """Add the object to every extension's link: setuptools appends ``LDFLAGS`` to its link command."""
    flags = env.get("LDFLAGS", "").split()
    if str(obj) not in flags:
        env["LDFLAGS"] = " ".join([*flags, str(obj)])


def wheel_tags(site: Path, project: str = "torch") -> list[str]:
    """The ``Tag:`` lines of ``project``'s installed WHEEL file under ``site`` (an unpacked wheel or a
    site-packages folder); empty when there is none (a torch built from source)."""
    for dist_info in sorted(site.glob(f"{project}-*.dist-info")):
        try:
            text = (dist_info / "WHEEL").read_text(encoding="utf-8")
        except OSError:
            continue
        return [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Tag:")]
    return []


def prepare(spec: BuildSpec, env: dict[str, str], torch_site: str | None) -> dict[str, object]:
    """Link the shim into this build (``env``'s ``LDFLAGS``) and say what the floor is read from: the tags of
    the torch wheel the extension links (the target's own wheel in a cross build)."""
    site: Path | None
    if is_cross(spec):
        cc: str | None = cross_compilers(spec.platform, env)[0]
        site = Path(env["ATTNFORGE_CROSS_TORCH"]).parent
    else:
        cc, site = env.get("CC"), Path(torch_site) if torch_site else None
    obj = shim_object(cc, Path(spec.build_dir), env)
    link_shim(env, obj)
    return {"shim": SHIM_SYMBOL, "object": str(obj), "torch_wheel_tags": wheel_tags(site) if site else []}
