"""`attnforge which`: the exact wheel of an index that fits this environment, or why none does.

The index is read through its PEP 691 JSON (`<url>/all/simple/flash-attn/`, `Accept:
application/vnd.pypi.simple.v1+json`; a static server without negotiation is asked for `index.json`; a server
with PEP 503 HTML only, such as pypiserver, is read from its links).
Each wheel is compared with the environment axis by axis: Python, platform, torch release family (a
stable-ABI wheel, `+cu130sm90atorch2.9abi3`: any torch from its floor on), accelerator (CUDA/ROCm version of
the torch build; a stable-ABI wheel also runs on a newer CUDA minor of the same major), C++ ABI, profile, and with a GPU its compute
capability (from the wheel's manifest in the index) and the driver's CUDA version. A yanked wheel (PEP 592) is
never a candidate: the explanation names it and its reason. The Python axis takes
the interpreter/ABI tags pip accepts on that CPython (`packaging.tags`): `cp311-cp311`, `abi3`, and the
pure-Python `py3`/`py3X` + `none` of a ROCm Triton wheel (`...-py3-none-any.whl`, which also fits any
platform). The answer is printed as a pip command or as uv's pyproject entries (`publish.install_commands`).

Reading the index is bounded (`index_fetch`: a few seconds to connect, a total budget) and every failure is
named with its URL: connection refused, timeout, HTTP status (exit 5), a corrupt page (exit 5), no project
page at all (exit 2). Entries of the page that are not wheels attnforge can read are counted and reported.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from attnforge.client.index_fetch import IndexFault, IndexReader
from attnforge.client.interpreter import Inspected
from attnforge.client.kernel_needs import Needs
from attnforge.client.records_location import records_base
from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.engine.environment import Env, interpreter_abis
from attnforge.matrix.arch_policy import wheel_runs_on
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import CompatData
from attnforge.names import cuda_of_variant, cuda_variant, cuda_version, toolkit_of_variant
from attnforge.publish.index import ALL, JSON_TYPE
from attnforge.publish.install_commands import pip_command, uv_config
from attnforge.publish.simple_html import read_simple_html
from attnforge.wheels.naming import PROJECT, LocalParts, parse_local


def _platform_ok(platform_tag: str, env: Env) -> bool:
    if platform_tag == "any":  # pure Python: every platform
        return True
    if not platform_tag.endswith(env.machine):
        return False
    if platform_tag.startswith("linux_"):
        return True
    if platform_tag.startswith("manylinux_"):
        major, minor = platform_tag.split("_")[1:3]
        return env.glibc is not None and (int(major), int(minor)) <= env.glibc
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    prefix = platform_tag.split("_", 1)[0]
    return prefix in legacy and env.glibc is not None and legacy[prefix] <= env.glibc


# ---------------------------------------------------------------- index


@dataclass
class Candidate:
    """A wheel listed by the index."""

    filename: str
    url: str
    version: str  # as spelled in the file name
    local: LocalParts | None
    python_tags: set[str]
    abi_tags: set[str]
    platforms: set[str]
    manifest: dict[str, Any] | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (axis, why)
    reader: IndexReader | None = field(default=None, repr=False, compare=False)  # what read its page
    # an index server's records folder, where its manifest is (records_location)
    records_url: str | None = None

    @property
    def variant(self) -> str | None:
        if self.manifest and self.manifest.get("variant"):
            return str(self.manifest["variant"])
        return self.local.variant if self.local else None


def _is_local(url: str) -> bool:
    return url.startswith("file://") or "://" not in url


def _as_url(url: str) -> str:
    if "://" in url:
        return url.rstrip("/") + "/"
    return Path(os.path.abspath(url)).as_uri() + "/"  # not resolve(): the index symlink must stay in the URL


def fetch_project(
    index_url: str, project: str = PROJECT, reader: IndexReader | None = None
) -> tuple[str, dict[str, Any]]:
    """(URL of the project page, its PEP 691 JSON) from an attnforge index root or a simple/ URL.

    A host that cannot be talked to (refused, timeout, unknown) or that answers with an HTTP error other
    than 404 stops the search: EnvironmentProblem naming the URL and what happened. A page that is there but
    is not PEP 691 JSON is a corrupt index (EnvironmentProblem) unless another candidate page works; when no
    page exists, ConfigurationError listing each URL tried and its answer."""
    reader = reader or IndexReader()
    base = _as_url(index_url)
    tried: list[str] = []
    corrupt: list[str] = []
    html_only: tuple[str, dict[str, Any]] | None = None  # a PEP 503 page, when no JSON is found (pypiserver)
    for page in (urljoin(base, f"{ALL}/simple/{project}/"), urljoin(base, f"{project}/")):
        targets = [page + "index.json"] if _is_local(base) else [page, page + "index.json"]
        for target in targets:
            try:
                body, ctype = reader.get(target, f"{JSON_TYPE}, application/json;q=0.5")
            except IndexFault as fault:
                if fault.kind != "not-found":
                    raise EnvironmentProblem(f"cannot read the index: {fault}") from None
                tried.append(f"{target} ({fault.detail})")
                continue
            if "json" not in ctype and not target.endswith(".json"):
                tried.append(f"{target} ({ctype or 'no Content-Type'}, not JSON)")
                listed = read_simple_html(body.decode("utf-8", errors="replace")) if "html" in ctype else None
                if listed and listed["files"] and html_only is None:
                    html_only = (page, listed)
                continue  # an HTML-only server: ask for the JSON file itself
            try:
                data = json.loads(body)
            except json.JSONDecodeError as exc:
                corrupt.append(f"{target}: not valid JSON ({exc.msg}: line {exc.lineno}, column {exc.colno})")
                continue
            except UnicodeDecodeError:
                corrupt.append(f"{target}: not UTF-8 text")
                continue
            if not (isinstance(data, dict) and isinstance(data.get("files"), list)):
                corrupt.append(f"{target}: JSON without a 'files' list (not a PEP 691 project page)")
                continue
            version = str((data.get("meta") or {}).get("api-version", "1.0"))
            if not version.startswith("1."):
                raise ConfigurationError(f"{target}: PEP 691 api-version {version} is not supported")
            return page, data
    if html_only is not None:  # a PEP 503-only server (pypiserver): its links, as PEP 691 would list them
        return html_only
    if corrupt:
        raise EnvironmentProblem(f"corrupt index page: {corrupt[0]}")
    raise ConfigurationError(
        f"no PEP 691 project page for {project} at {index_url} (tried {', '.join(tried)})"
    )


def yanked_files(data: dict[str, Any]) -> dict[str, str]:
    """filename -> reason of every file a PEP 691 project page marks yanked (PEP 592; "" without a reason).
    Entries that are not objects with a file name are left out (`candidates` counts them as malformed)."""
    out = {}
    for f in data["files"]:
        if not isinstance(f, dict):
            continue
        filename, yanked = f.get("filename"), f.get("yanked")
        if isinstance(filename, str) and filename and yanked:
            out[filename] = yanked if isinstance(yanked, str) else ""
    return out


def candidates(
    page: str, data: dict[str, Any], reader: IndexReader | None = None, malformed: list[str] | None = None
) -> list[Candidate]:
    """The wheels a PEP 691 project page lists (yanked files and other files skipped); an entry that is not
    a readable wheel entry (no file name, a bad wheel name or version, a URL that is not text) is left out
    and, when `malformed` is given, described there."""

    def bad(why: str) -> None:
        if malformed is not None:
            malformed.append(why)

    out = []
    for i, f in enumerate(data["files"]):
        if not isinstance(f, dict):
            bad(f"files[{i}]: not an object")
            continue
        filename = f.get("filename")
        if not isinstance(filename, str) or not filename:
            bad(f"files[{i}]: no file name")
            continue
        if not filename.endswith(".whl") or f.get("yanked"):
            continue
        if not isinstance(f.get("url", filename), str):
            bad(f"{filename}: its url is not text")
            continue
        try:
            _, version, _, tags = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion) as exc:
            bad(f"{filename}: {exc}")
            continue
        out.append(
            Candidate(
                filename=filename,
                url=urljoin(page, str(f.get("url") or filename)),
                version=filename.split("-")[1],
                local=parse_local(version.local or ""),
                python_tags={t.interpreter for t in tags},
                abi_tags={t.abi for t in tags},
                platforms={t.platform for t in tags},
                reader=reader,
            )
        )
    return out


def load_manifest(c: Candidate) -> dict[str, Any] | None:
    """The manifest the index keeps beside the wheel, or its records folder holds (``c.records_url``); None when
    there is none, or it cannot be read: then the reader's notes say why."""
    if c.manifest is None:
        reader = c.reader or IndexReader()
        url = records_base(c.url, c.filename, c.records_url) + ".manifest.json"
        try:
            body, _ = reader.get(url)
        except IndexFault as fault:
            if fault.kind != "not-found":
                reader.notes.append(f"manifest of {c.filename} not read: {fault}")
            return None
        try:
            manifest = json.loads(body)
        except ValueError:
            reader.notes.append(f"manifest of {c.filename} is not valid JSON ({url})")
            return None
        if not isinstance(manifest, dict):
            reader.notes.append(f"manifest of {c.filename} is not a JSON object ({url})")
            return None
        c.manifest = manifest
    return c.manifest


# ---------------------------------------------------------------- matching

AXES = ("python", "platform", "torch", "accelerator", "cxx11_abi", "profile", "gpu_arch", "driver")


def check(c: Candidate, env: Env, profile: str | None, needs: Needs | None = None) -> list[tuple[str, str]]:
    """Every axis on which `c` does not fit `env`, as (axis, explanation). With `needs` (kernels the calls
    need) the profile axis takes any profile whose manifest has them (`profile` given: that one only)."""
    problems: list[tuple[str, str]] = []
    wheel_py = ".".join(sorted(c.python_tags))
    accepted = interpreter_abis(env.python)
    # a file name's tags are every interpreter x ABI x platform it lists: one axis at a time is exact
    if not any((py, abi) in accepted for py in c.python_tags for abi in c.abi_tags):
        if any(py == interp for py in c.python_tags for interp, _ in accepted):
            wheel_abi = ".".join(sorted(c.abi_tags))
            why = f"wheel is for {wheel_py} with ABI {wheel_abi}, this is {env.python_tag}"
        else:
            why = f"wheel is for {wheel_py}, this is {env.python_tag}"
        problems.append(("python", why))
    if not any(_platform_ok(p, env) for p in c.platforms):
        glibc = ".".join(map(str, env.glibc)) if env.glibc else "none"
        problems.append(
            ("platform", f"wheel is {'.'.join(sorted(c.platforms))}, this is {env.machine} glibc {glibc}")
        )
    if c.local is None:
        problems.append(("torch", "the version names no torch variant (not an attnforge wheel)"))
        return problems
    if env.torch is None:
        problems.append(("torch", "torch is not installed here"))
    elif torch_why := c.local.torch_problem(env.torch):
        problems.append(("torch", torch_why))
    if env.torch is None:
        pass  # no torch: the torch axis says so; there is no build to compare
    elif env.accel is None:
        problems.append(("accelerator", f"wheel is {c.local.accel}, torch {env.torch} is a CPU-only build"))
    elif accel_why := c.local.accel_problem(env.accel):
        problems.append(("accelerator", accel_why))
    # a stable-ABI wheel passes no C++ object to libtorch (its C shim only): the C++ ABI does not matter
    if env.cxx11_abi is not None and env.cxx11_abi != c.local.cxx11_abi and not c.local.stable_abi:
        want = "TRUE" if c.local.cxx11_abi else "FALSE"
        have = "TRUE" if env.cxx11_abi else "FALSE"
        problems.append(("cxx11_abi", f"wheel is cxx11abi{want}, torch here is cxx11abi{have}"))
    tag = c.local.profile_tag
    if (profile or not needs) and (profile or None) != tag and not (profile == "full" and tag is None):
        problems.append(
            (
                "profile",
                f"wheel is profile {tag or 'full'}, asked for {profile or 'full'} "
                f"(`--profile {tag or 'full'}` accepts it)",
            )
        )
    if needs and not problems and (lacks := needs.problem(load_manifest(c), c.local)):
        problems.append(("profile", lacks))
    if env.gpus and all(axis == "profile" for axis, _ in problems):  # a profile away: is it worth naming?
        manifest = load_manifest(c) or {}
        arches = list((manifest.get("inputs") or {}).get("arches") or [])
        if arches:
            inputs = manifest.get("inputs") or {}
            missing = [g for g in env.gpus if wheel_runs_on(inputs, g) is None]
            if missing:
                problems.append(
                    ("gpu_arch", f"wheel has {', '.join(arches)}, GPU here is {', '.join(missing)}")
                )
        toolkit = str((manifest.get("inputs") or {}).get("toolkit") or "")
        cuda = cuda_version(toolkit)
        if env.driver_cuda and cuda is not None:
            need = Version(cuda)
            if Version(env.driver_cuda) < need:
                problems.append(
                    (
                        "driver",
                        f"wheel needs a driver for CUDA {need}, driver here supports {env.driver_cuda}",
                    )
                )
    return problems


@dataclass
class Resolution:
    """The answer of `which`."""

    env: Env
    index_url: str
    choice: Candidate | None
    command: str | None
    candidates: list[Candidate]
    explanation: list[str]
    build_cell: str | None
    uv: str | None = None  # pyproject.toml entries for uv (an attnforge index only)
    yanked: dict[str, str] = field(default_factory=dict)  # files skipped as yanked, with their reasons
    malformed: list[str] = field(default_factory=list)  # index entries left out, and why
    inspected: Inspected | None = None  # the interpreter whose environment was probed
    next_step: str | None = None  # what to type next when no wheel fits (an option, a command)

    def to_json(self) -> dict[str, Any]:
        return {
            "interpreter": self.inspected.to_json() if self.inspected else None,
            "environment": self.env.__dict__,
            "wheel": self.choice.filename if self.choice else None,
            "variant": self.choice.variant if self.choice else None,
            "command": self.command,
            "uv": self.uv,
            "explanation": self.explanation,
            "build_cell": self.build_cell,
            "rejected": {c.filename: dict(c.problems) for c in self.candidates if c.problems},
            "yanked": self.yanked,
            "malformed": self.malformed,
            "next_step": self.next_step,
        }


def _attnforge_root(index_url: str, page: str) -> str | None:
    """The index root when `page` is the `all/` tree of an attnforge index, else None (a plain simple index)."""
    root = _as_url(index_url)
    return root if page.startswith(urljoin(root, f"{ALL}/simple/")) else None


def install_commands(index_url: str, page: str, project: str, c: Candidate) -> tuple[str, str | None]:
    """(pip command, uv pyproject entries or None) for candidate `c`: the ones the coverage page shows."""
    root = _attnforge_root(index_url, page)
    if root is None or not c.variant:
        return f"pip install {project}=={c.version} --index-url {index_url.rstrip('/')}", None
    return (
        pip_command(project, c.version, root, c.variant),
        uv_config(project, c.version, c.filename, root, c.variant),
    )


def build_cell_for(
    env: Env, near: Candidate | None, kernel_version: str, kernel: str = PROJECT
) -> str | None:
    """The cell id that would build a wheel for this environment (`attnforge build --cell ID`)."""
    if env.torch is None or env.accel is None or env.cxx11_abi is None:
        return None
    toolkit = Toolkit.parse(toolkit_of_variant(env.accel) or env.accel)
    arches: tuple[str, ...] = tuple(sorted(set(env.gpus)))
    if near is not None and near.local is not None and near.local.stable_abi:
        arches = ()  # a fixed-arch kernel (FA3: sm_90a for an sm_90 GPU): take the nearest wheel's
    if not arches and near is not None:
        arches = tuple((load_manifest(near) or {}).get("inputs", {}).get("arches") or ())
    cell = Cell(
        kernel=kernel,
        kernel_version=kernel_version,
        toolkit=toolkit,
        torch=env.torch.split("+")[0],
        python=env.python,
        cxx11_abi=env.cxx11_abi,
        arches=arches or ("sm_80", "sm_90"),
        profile="full",
        platform=env.machine or "x86_64",
    )
    return cell.id


def with_torch(env: Env, torch: str, data: CompatData | None = None) -> Env:
    """`env` as if it had torch `torch` (`2.13`, `2.13.0`, or `2.13.0+cu128` for another build). Without a
    build: the build `pip install torch==X` gives on this platform (compat `pypi_cuda`, e.g. cu132 for 2.15)
    where `data` knows the release and this environment is not ROCm; else this environment's accelerator
    (where no torch is installed, the build must then be named)."""
    release, _, build = torch.partition("+")
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", release):
        raise ConfigurationError(f"--torch {torch}: expected a torch release such as 2.13 or 2.13.0+cu128")
    accel = env.accel
    row = data.torch_release(release) if data is not None and not build else None
    if row is not None and not (accel or "").startswith("rocm"):
        pypi = row.pypi_cuda if env.machine != "aarch64" else (row.model_extra or {}).get("pypi_aarch64_cuda")
        accel = cuda_variant(str(pypi)) if pypi else accel
    if not build and env.torch is None and accel == env.accel:
        raise ConfigurationError(
            f"--torch {torch}: no torch is installed here to take the CUDA/ROCm build from; "
            f"name it: --torch {release}+cu130 (or +cuXYZ, +rocmX.Y)"
        )
    if build:
        if cuda_of_variant(build) is None and not re.fullmatch(r"rocm\d+\.\d+", build):
            raise ConfigurationError(f"--torch {torch}: the build after '+' must be cuXYZ or rocmX.Y")
        accel = build
    return dataclasses.replace(env, torch=torch, accel=accel)


def resolve(
    env: Env,
    index_url: str,
    profile: str | None = None,
    project: str = PROJECT,
    reader: IndexReader | None = None,
    records_url: str | None = None,
    inspected: Inspected | None = None,
    needs: Needs | None = None,
) -> Resolution:
    """Pick the wheel for `env` from the index at `index_url`, or explain why none fits. `reader` bounds
    the time spent reading the index (default: index_fetch's connect timeout and total budget);
    `records_url`: where an index server that keeps packages only serves the wheels' manifests;
    `inspected`: the interpreter `env` was read from (named in the explanation, and in what to type next);
    `needs`: kernels the calls need (any profile that has them fits; `kernel_needs`)."""
    reader = reader or IndexReader()
    page, data = fetch_project(index_url, project, reader)
    malformed: list[str] = []
    cands = candidates(page, data, reader, malformed)
    for c in cands:
        c.records_url = records_url
        c.problems = check(c, env, profile, needs)
    fits = [c for c in cands if not c.problems]
    explanation = [f"interpreter: {inspected.describe()}"] if inspected else []
    explanation.append(f"environment: {env.describe()}")
    if needs:
        explanation.append(f"kernels needed: {needs.describe()} (any profile that has them)")
    yanked = yanked_files(data)
    for filename, reason in sorted(yanked.items()):
        explanation.append(f"yanked, never proposed: {filename} ({reason or 'no reason given'})")
    if malformed:
        more = f"; and {len(malformed) - 3} more" if len(malformed) > 3 else ""
        explanation.append(
            f"index: {len(malformed)} malformed entr{'y' if len(malformed) == 1 else 'ies'} of {page} "
            f"skipped: {'; '.join(malformed[:3])}{more}"
        )

    def key(c: Candidate) -> tuple[Version, int]:
        manylinux = max((int(p.split("_")[2]) for p in c.platforms if p.startswith("manylinux_")), default=0)
        return (Version(c.version), manylinux)

    versions = sorted({Version(c.version).public for c in cands}, key=Version)
    kernel_version = versions[-1] if versions else "2.8.3"
    if fits:
        best = max(fits, key=key)
        command, uv = install_commands(index_url, page, project, best)
        res = Resolution(
            env, index_url, best, command, cands, explanation, None, uv, yanked, malformed, inspected
        )
        explanation.append(f"fits: {best.filename} (variant {best.variant})")
        explanation += [f"note: {n}" for n in reader.notes]
        return res
    near: Candidate | None = None
    if not cands:
        explanation.append(f"the index lists no {project} wheels")
    else:
        # the nearest wheel: fewest mismatching axes, then the one that fails latest in AXES order
        def distance(c: Candidate) -> tuple[int, int]:
            return (len(c.problems), -min(AXES.index(a) for a, _ in c.problems))

        near = min(cands, key=distance)
        by_axis: dict[str, set[str]] = {}
        for c in cands:
            for axis, _ in c.problems:
                by_axis.setdefault(axis, set()).add(c.filename)
        explanation.append(f"none of the {len(cands)} wheel(s) fits")
        for axis in AXES:
            if axis in by_axis:
                explanation.append(f"  {axis}: {len(by_axis[axis])} wheel(s) rejected")
        explanation.append(f"nearest: {near.filename}")
        explanation += [f"  {axis}: {why}" for axis, why in near.problems]
        available = sorted({c.variant or "?" for c in cands})
        explanation.append(f"variants in the index: {', '.join(available)}")
    cell = build_cell_for(env, near, kernel_version, project)
    python = inspected.path if inspected else "python"
    step = None if needs else _profile_step(cands, profile)
    next_step = step[0] if step else None
    if step:
        explanation.append(step[1])
    if cell:
        explanation.append(f"a matrix cell would build it: attnforge build --cell {cell}")
    elif env.torch is None:
        explanation.append(
            f"install torch first: {python} -m pip install torch (the wheel is chosen by the torch it runs "
            f"with), or ask for a torch you plan to install: --torch {_planned_torch(_newest_torch(cands, near))}"
        )
        next_step = next_step or f"{python} -m pip install torch, then ask again"
    elif env.accel is None:
        planned = _planned_torch(near, env.torch)
        explanation.append(
            f"torch here is CPU-only: install a CUDA or ROCm build of torch into {python}; no cell builds "
            f"for it (the wheel a CUDA build would get: --torch {planned})"
        )
        next_step = (
            next_step or f"a CUDA build of torch in {python} (ask for its wheel with --torch {planned})"
        )
    explanation += [f"note: {n}" for n in reader.notes]
    return Resolution(
        env, index_url, None, None, cands, explanation, cell, None, yanked, malformed, inspected, next_step
    )


def _profile_step(cands: list[Candidate], profile: str | None) -> tuple[str, str] | None:
    """(option, explanation) when wheels fit on every axis but the profile: `--profile X` for each profile
    they have (the full profile: no --profile); None when no wheel is only a profile away."""
    only_profile = [c for c in cands if c.problems and {a for a, _ in c.problems} == {"profile"}]
    tags = sorted({(c.local.profile_tag if c.local else None) or "full" for c in only_profile})
    if not tags:
        return None
    options = " or ".join(f"--profile {t}" for t in tags)  # `--profile full` selects the full profile
    asked = f"profile {profile}" if profile else "the full profile (no --profile)"
    return options, (
        f"no wheel of {asked} fits, but the index has one for this environment in profile "
        f"{', '.join(tags)}: add {options}"
    )


def _newest_torch(cands: list[Candidate], near: Candidate | None) -> Candidate | None:
    """The wheel for the newest torch among those only torch keeps from fitting (else `near`)."""
    torch_only = [c for c in cands if c.local and {a for a, _ in c.problems} == {"torch"}]
    return max(torch_only, key=lambda c: Version(c.local.torch_family if c.local else "0"), default=near)


def _planned_torch(near: Candidate | None, installed: str | None = None) -> str:
    """A `--torch` value for the nearest wheel's torch and accelerator (`2.13+cu130`), else a sample."""
    if near is None or near.local is None:
        return "X.Y+cuXYZ (e.g. 2.14+cu130)"
    release = (installed or "").split("+")[0] or near.local.torch_family
    return f"{release}+{near.local.accel}"
