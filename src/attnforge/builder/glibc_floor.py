"""Keeping a built extension inside the glibc floor of the torch it pins (torch's wheels: manylinux_2_28).

Compiled with g++ 12 on Debian bookworm (glibc 2.36), an extension can need three symbols above that floor, all
from the build userland's headers, none from the extension's own code:

- ``__libc_single_threaded`` (GLIBC_2.32): libstdc++ 11+ reads it in ``ext/atomicity.h`` to skip atomic
  reference counts in a one-thread process, whenever ``<sys/single_threaded.h>`` exists (``__has_include``:
  no macro turns it off);
- ``std::__throw_bad_array_new_length()`` (GLIBCXX_3.4.29): ``std::allocator<T>::allocate`` calls it in
  libstdc++ 11+ (where the compiler cannot prove the size small, e.g. at -O0);
- ``dlsym`` (GLIBC_2.34, when glibc moved it from libdl into libc): torch's stable-ABI headers call it.

The builder links hidden definitions of the three into every extension through ``LDFLAGS`` (what RHEL's devtoolset
does with its ``libstdc++_nonshared.a``): the references resolve inside the extension and nothing of them is
exported. ``__libc_single_threaded`` is ``0``, "not known to be single-threaded", so reference counts stay
atomic, as libstdc++ does on glibc < 2.32; the throw helper throws ``std::bad_array_new_length`` as
libstdc++'s does; ``dlsym`` calls glibc's under the architecture's base version (GLIBC_2.2.5 on x86-64,
GLIBC_2.17 on aarch64), which libc defines from 2.34 on and libdl before, and ``libdl.so.2`` is linked so that
an older glibc has it loaded (a caller's RTLD_NEXT stays in the same object). No compile flag changes, so
kernel objects stay reusable. ``wheels.glibc_floor`` checks the finished wheel against the floor read from
torch's own wheel tags, recorded here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .cross import cross_compilers, is_cross
from .exits import EXIT_ENV, BuildFailure
from .spec import BuildSpec

SHIM_SYMBOLS = ("__libc_single_threaded", "_ZSt28__throw_bad_array_new_lengthv", "dlsym")
SHIM_SOURCE = """// attnforge: symbols g++ 12's headers reference above torch's glibc floor, defined hidden in the extension.
#include <new>
// GLIBC_2.32; 0: not known to be single-threaded, reference counts stay atomic
extern "C" { char __libc_single_threaded = 0; }
__asm__(".hidden __libc_single_threaded");
// GLIBCXX_3.4.29: std::allocator<T>::allocate's size check
namespace std { void __throw_bad_array_new_length() { throw bad_array_new_length(); } }
__asm__(".hidden _ZSt28__throw_bad_array_new_lengthv");
// GLIBC_2.34: dlsym moved into libc; its base version is in libc (>= 2.34) and libdl (< 2.34) alike
#if defined(__x86_64__)
#define ATTNFORGE_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define ATTNFORGE_GLIBC_BASE "GLIBC_2.17"
#endif
#ifdef ATTNFORGE_GLIBC_BASE
extern "C" void* attnforge_dlsym_base(void* handle, const char* name);
__asm__(".symver attnforge_dlsym_base, dlsym@" ATTNFORGE_GLIBC_BASE);
extern "C" void* dlsym(void* handle, const char* name) { return attnforge_dlsym_base(handle, name); }
__asm__(".hidden dlsym");
#endif
"""
# libdl.so.2 needed by the extension whatever the linker's --as-needed default: dlsym's home before glibc 2.34
LIBDL = ("-Wl,--push-state,--no-as-needed", "-l:libdl.so.2", "-Wl,--pop-state")


def shim_object(cxx: str | None, build_dir: Path, env: dict[str, str]) -> Path:
    """Compile the hidden definitions with ``cxx`` (the build's C++ compiler, a cross one included) into
    ``build_dir``; BuildFailure(EXIT_ENV) naming the compiler when it cannot."""
    path = env.get("PATH")
    compiler = cxx or shutil.which("c++", path=path) or shutil.which("g++", path=path)
    if not compiler:
        raise BuildFailure(EXIT_ENV, "no C++ compiler (CXX, c++, g++) for the glibc-floor object")
    folder = build_dir / "glibc-floor"
    folder.mkdir(parents=True, exist_ok=True)
    source, obj = folder / "floor_symbols.cpp", folder / "floor_symbols.o"
    source.write_text(SHIM_SOURCE, encoding="utf-8")
    cmd = [*compiler.split(), "-c", "-fPIC", "-O2", str(source), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=300)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise BuildFailure(EXIT_ENV, f"{compiler} could not compile the glibc-floor object: {tail[0]}")
    return obj


def link_shim(env: dict[str, str], obj: Path) -> None:
    """Add the object (and libdl) to every extension's link: setuptools appends ``LDFLAGS`` to its link
    command."""
    flags = env.get("LDFLAGS", "").split()
    if str(obj) not in flags:
        env["LDFLAGS"] = " ".join([*flags, str(obj), *LIBDL])


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
        cxx: str | None = cross_compilers(spec.platform, env)[1]
        site = Path(env["ATTNFORGE_CROSS_TORCH"]).parent
    else:
        cxx, site = env.get("CXX"), Path(torch_site) if torch_site else None
    obj = shim_object(cxx, Path(spec.build_dir), env)
    link_shim(env, obj)
    return {
        "shim": list(SHIM_SYMBOLS),
        "object": str(obj),
        "torch_wheel_tags": wheel_tags(site) if site else [],
    }
