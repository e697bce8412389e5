"""Package built Flex artifacts as the ``attnforge-flex-kernels`` wheel (setuptools via ``pip wheel``).

The wheel holds the ``attnforge_flex`` package (the loader, ``attnforge.flex.runtime`` copied verbatim), its
``artifacts/`` folder (the manifest and each variant's Mega-Cache, precompiled function and AOTInductor
package, where built) and ``attnforge_flex.pth`` (enables the clients at their import when
``ATTNFORGE_FLEX_AUTO`` is set: ``runtime/_auto.py``). Its local version names torch, toolkit and arch (``0.1.0+torch2.11.cu130.sm90``);
a family other than ``default`` is prepended (``+swa.torch2.11.cu130.sm90``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from attnforge import names
from attnforge.core.errors import BuildError
from attnforge.flex.runtime import MANIFEST

DIST_NAME = "attnforge-flex-kernels"
IMPORT_NAME = "attnforge_flex"
BASE_VERSION = "0.1.0"

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
description = "FlexAttention kernels compiled ahead of time by attnforge ({family}: {variants})"
readme = "README.md"
requires-python = ">=3.9"
dependencies = ["torch"]

[tool.setuptools]
packages = ["{pkg}"]
include-package-data = false

[tool.setuptools.package-data]
{pkg} = ["artifacts/*", "py.typed"]
"""

# the wheel's site-packages hook: only with ATTNFORGE_FLEX_AUTO set does it import anything (runtime/_auto.py)
PTH = 'import os; os.environ.get("ATTNFORGE_FLEX_AUTO") and __import__("attnforge_flex._auto")\n'
PTH_NAME = "attnforge_flex.pth"

SETUP_PY = """\
# puts attnforge_flex.pth at the top of site-packages (next to the package), where site.py reads it
import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file("{pth}", os.path.join(self.build_lib, "{pth}"))


setup(cmdclass={{"build_py": BuildWithPth}})
"""

README = """\
# {name} {version}

FlexAttention variants compiled ahead of time by attnforge for {env_line}.

```python
import attnforge_flex
attnforge_flex.enable()                   # transformers' flex_attention and diffusers' flex backend run the
                                          # built variants at their declared shapes (others compile)
flex = attnforge_flex.flex_attention      # a plain script's torch.compile(flex_attention), served
attnforge_flex.load()                     # or: Mega-Cache artifacts into torch's compile caches
fn = attnforge_flex.attention("{first}")  # one variant by name, at its built shape
```

With `ATTNFORGE_FLEX_AUTO=1` in the environment, `enable()` happens by itself when transformers or diffusers
is imported (no line in the client).

Variants: {variants}. Built {created}. In another environment `load()` warns once and loads nothing.
"""


def wheel_version(manifest: dict[str, Any]) -> str:
    """``0.1.0+torch2.11.cu130.sm90`` (family prepended to the local part unless ``default``)."""
    local = names.flex_local(manifest["env"], str(manifest.get("family", "default")))
    return f"{BASE_VERSION}+{local.local_version}"


def write_project(artifacts: Path, project: Path) -> dict[str, Any]:
    """Lay out the wheel's source tree; returns the artifacts' manifest."""
    manifest: dict[str, Any] = json.loads((artifacts / MANIFEST).read_text(encoding="utf-8"))
    good = [e for e in manifest["variants"] if e.get("megacache")]
    if not good:
        raise BuildError(f"{artifacts}: no variant has a Mega-Cache artifact; nothing to package")
    pkg = project / IMPORT_NAME
    runtime = Path(__file__).resolve().parent / "runtime"
    pkg.mkdir(parents=True)
    for src in sorted(runtime.glob("*.py")):
        shutil.copy2(src, pkg / src.name)
    (pkg / "py.typed").write_text("", encoding="utf-8")
    dest = pkg / "artifacts"
    dest.mkdir()
    files = {MANIFEST}
    for e in manifest["variants"]:
        for key in ("megacache", "precompiled", "aoti"):
            f = (e.get(key) or {}).get("file")
            if f:
                files.add(f)
        if (e.get("aoti") or {}).get("file") and e["aoti"].get("backward_file"):
            files.add(e["aoti"]["backward_file"])
    for f in sorted(files):
        shutil.copy2(artifacts / f, dest / f)
    names = ", ".join(e["name"] for e in good)
    version = wheel_version(manifest)
    env = manifest["env"]
    env_line = (
        f"torch {env.get('torch')}, Triton {env.get('triton')}, CUDA {env.get('cuda')}, "
        f"{env.get('gpu')} (sm {env.get('capability')}), Python {env.get('python')}"
        if env.get("device") == "cuda"
        else f"torch {env.get('torch')} on CPU ({env.get('cpu_capability')}), Python {env.get('python')}"
    )
    fmt = {
        "name": DIST_NAME,
        "version": version,
        "family": manifest.get("family", "default"),
        "variants": names,
        "pkg": IMPORT_NAME,
        "first": good[0]["name"],
        "env_line": env_line,
        "created": manifest.get("created"),
    }
    (project / "pyproject.toml").write_text(PYPROJECT.format(**fmt), encoding="utf-8")
    (project / "setup.py").write_text(SETUP_PY.format(pth=PTH_NAME), encoding="utf-8")
    (project / PTH_NAME).write_text(PTH, encoding="utf-8")
    (project / "README.md").write_text(README.format(**fmt), encoding="utf-8")
    return manifest


def build_wheel(artifacts: Path, dist: Path, python: str = sys.executable) -> Path:
    """``pip wheel --no-build-isolation`` the project (offline: setuptools must be importable by ``python``)."""
    dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="attnforge-flex-wheel-") as tmp:
        project = Path(tmp) / "project"
        manifest = write_project(artifacts, project)
        out = Path(tmp) / "dist"
        cmd = [
            python,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(project),
        ]
        p = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(out.glob("*.whl"))
        if p.returncode != 0 or len(wheels) != 1:
            raise BuildError(
                f"pip wheel failed for {DIST_NAME} (exit {p.returncode}): {(p.stderr or p.stdout)[-800:]}",
                hint="the building Python needs setuptools (pip wheel runs without build isolation, offline)",
            )
        target = dist / wheels[0].name
        shutil.copy2(wheels[0], target)
    _ = manifest
    return target
