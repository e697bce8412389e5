"""Build an image set: runtime images from finished wheels, NGC images compiled on the NGC base.

For each image: check the base against docker/bases.toml, assemble a small build context, run
`DOCKER_BUILDKIT=1 docker build` with the pip configuration, CA bundle and index credentials as secrets,
smoke-test the result (`smoke_script.py` inside the image), tag the moving aliases, and record the set in
`<output>/images.json` for `images push`. The first failure stops the set (nothing half-built is recorded).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..backends.pip_config import PipOptions
from ..errors import BuildError, ConfigurationError, EnvironmentProblem, TestFailure
from ..kernels import modules
from ..matrix.compat import NgcRelease
from .bases import BaseCheck, check_base, load_bases
from .docker import DOCKER, Docker
from .localindex import LocalIndexServer, Sources
from .naming import ImageSpec, aliases, parity_text, resolve_tags
from .ngc import STANDIN_TEMPLATE, BaseFacts, select_release
from .record import BuiltImage, ImageSet, write_record

Log = Callable[[str], None]
HERE = Path(__file__).resolve().parent
REPO_DOCKER_DIR = Path(__file__).resolve().parents[3] / "docker"
DEFAULT_REPOSITORY = "attnforge/flash-attn"
DEFAULT_RUNTIME_BASE = "local/debian:bookworm"
PYPI = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
_SKIP_SOURCE = shutil.ignore_patterns("build", "dist", "*.egg-info", ".git", "__pycache__", "*.so", "*.o")


def _quiet(_: str) -> None:
    return None


def docker_dir() -> Path:
    """docker/ of the source tree (ATTNFORGE_DOCKER_DIR overrides)."""
    override = os.environ.get("ATTNFORGE_DOCKER_DIR")
    path = Path(override) if override else REPO_DOCKER_DIR
    if not (path / "runtime.Dockerfile").exists():
        raise EnvironmentProblem(f"no runtime.Dockerfile under {path}: set ATTNFORGE_DOCKER_DIR")
    return path


# ------------------------------------------------------------------------------------------ requests


@dataclass
class ImageRequest:
    """One image to build and what it is built from."""

    spec: ImageSpec
    wheel: Path | None = None  # runtime: the finished wheel
    extra_wheels: list[Path] = field(default_factory=list)  # runtime: e.g. the Flex kernel wheel
    manifest: dict[str, Any] = field(default_factory=dict)  # copied into the image
    torch_requirement: str = ""  # runtime
    torch_variant: str = ""  # runtime
    ngc: NgcRelease | None = None
    ngc_image: str = ""
    ngc_policy: str = "replace"
    ngc_facts: BaseFacts | None = None
    build_args: dict[str, str] = field(default_factory=dict)
    expect: dict[str, str] = field(default_factory=dict)


@dataclass
class Skipped:
    """A wheel or cell that gets no image, and why."""

    what: str
    why: str


def read_wheel_manifests(wheels_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(wheel, manifest) for every `*.whl.manifest.json` whose wheel is present and matches its bytes."""
    from ..wheels.manifest import check_matches_wheel, read_manifest

    out: list[tuple[Path, dict[str, Any]]] = []
    for mpath in sorted(wheels_dir.glob("*.whl.manifest.json")):
        data = read_manifest(mpath)
        wheel = wheels_dir / str(data.get("wheel") or mpath.name[: -len(".manifest.json")])
        if not wheel.is_file():
            continue
        check_matches_wheel(wheel, data)
        out.append((wheel, data))
    return out


def _local_of(wheel_name: str) -> str:
    """The local version as the file name spells it (packaging would lower-case it)."""
    parts = wheel_name.split("-")
    return parts[1].partition("+")[2] if len(parts) >= 5 else ""


def profile_tag_of(local: str) -> str | None:
    """'cu130torch2.14cxx11abiTRUE.fwd128[.ngc2506]' -> 'fwd128'; None for the full profile."""
    m = re.search(r"cxx11abi(?:true|false)\.(.+)$", local, re.IGNORECASE)
    if not m:
        return None
    parts = [p for p in m.group(1).split(".") if not re.fullmatch(r"ngc\d+", p)]
    return ".".join(parts) or None


def _dist_version(wheel_name: str) -> str:
    """The version as the file name spells it (keeps 'cxx11abiTRUE' as upstream writes it)."""
    return wheel_name.split("-")[1]


def torch_requirement(torch: str, torch_variant: str, pypi_variant: str | None) -> str:
    """torch==X.Y.Z for PyPI's default build of a release, torch==X.Y.Z+variant otherwise."""
    public, _, local = torch.partition("+")
    variant = local or torch_variant
    if not variant or variant == pypi_variant:
        return f"torch=={public}"
    return f"torch=={public}+{variant}"


def runtime_request(
    wheel: Path, manifest: dict[str, Any], *, base: str, pypi_variant: str | None = None
) -> ImageRequest:
    """The runtime image of one finished wheel."""
    inputs = manifest.get("inputs") or {}
    tag = profile_tag_of(_local_of(wheel.name))
    torch_built = str((manifest.get("toolchain") or {}).get("torch") or inputs.get("torch") or "")
    variant = str(inputs.get("torch_variant") or "")
    spec = ImageSpec(
        kind="runtime",
        kernel=str(manifest.get("kernel", "flash-attn")),
        kernel_version=str(manifest["kernel_version"]),
        dist_version=_dist_version(wheel.name),
        variant=str(manifest.get("variant") or ""),
        python=str(inputs["python"]),
        toolkit=str(inputs["toolkit"]),
        torch=torch_built,
        arches=tuple(inputs.get("arches") or ()),
        profile=str(inputs.get("profile", "full")),
        profile_tag=tag,
        cxx11_abi=bool(inputs.get("cxx11_abi", True)),
        parity=parity_text(manifest.get("parity")),
        base_image=base,
    )
    if not spec.variant:
        raise ConfigurationError(f"{wheel.name}: its manifest names no variant")
    return ImageRequest(
        spec=spec,
        wheel=wheel,
        manifest=manifest,
        torch_requirement=torch_requirement(torch_built, variant, pypi_variant),
        torch_variant=variant,
        expect={
            "torch": torch_built,
            "flash_attn": spec.dist_version,
            "kind": "runtime",
            **modules(spec.kernel),
        },
    )


FLEX_DIST = "attnforge_flex_kernels"


def flex_wheels_for(req: ImageRequest, wheels_dir: Path) -> list[Path]:
    """The FlexAttention kernel wheels (helper `attnforge.flex`) built for this image's torch and toolkit."""
    spec = req.spec
    family = ".".join(spec.torch.split("+")[0].split(".")[:2])
    toolkit = spec.toolkit
    short = f"cu{toolkit[4:].replace('.', '')}" if toolkit.startswith("cuda") else toolkit
    out = []
    for wheel in sorted(wheels_dir.glob(f"{FLEX_DIST}-*.whl")):
        local = _local_of(wheel.name)
        has_torch = re.search(rf"(^|\.)torch{re.escape(family)}(\.|$)", local)
        if has_torch and re.search(rf"(^|\.){re.escape(short)}(\.|$)", local):
            out.append(wheel)
    return out


def with_flex(req: ImageRequest, wheels: list[Path]) -> ImageRequest:
    """The request with Flex kernel wheels added (and said so in a label)."""
    if not wheels:
        return replace(
            req, spec=replace(req.spec, extra_labels={**req.spec.extra_labels, "io.attnforge.flex": "none"})
        )
    names = ", ".join(_dist_version(w.name) for w in wheels)
    spec = replace(
        req.spec,
        extra_labels={**req.spec.extra_labels, "io.attnforge.flex": f"attnforge-flex-kernels {names}"},
    )
    return replace(req, spec=spec, extra_wheels=[*req.extra_wheels, *wheels])


def ngc_request(
    manifest: dict[str, Any],
    rows: list[NgcRelease],
    *,
    template: str,
    policy: str,
    release: str | None = None,
) -> ImageRequest | Skipped:
    """The NGC image for a cell (given by its manifest or a manifest-shaped dict of its inputs)."""
    inputs = manifest.get("inputs") or {}
    what = str(manifest.get("cell_id") or manifest.get("wheel") or "cell")
    row, why = select_release(
        rows,
        torch=str(inputs["torch"]),
        toolkit=str(inputs["toolkit"]),
        cxx11_abi=bool(inputs.get("cxx11_abi", True)),
        release=release,
    )
    if row is None:
        return Skipped(what, why)
    if inputs.get("head_dims") or inputs.get("dtypes"):
        return Skipped(
            what,
            f"profile {inputs.get('profile')} subsets head dims/dtypes, which needs attnforge's source patches "
            "(the docker build backend); NGC images take profiles made of arches and DISABLE flags only",
        )
    local = str(manifest.get("local_version") or _local_of(str(manifest.get("wheel") or "")) or "")
    local = f"{local}.ngc{row.release.replace('.', '')}" if local else f"ngc{row.release.replace('.', '')}"
    profile_tag = profile_tag_of(local)
    arches = tuple(inputs.get("arches") or ())
    flags = [str(f) for f in inputs.get("profile_flags") or []]
    spec = ImageSpec(
        kind="ngc",
        kernel=str(manifest.get("kernel", "flash-attn")),
        kernel_version=str(manifest["kernel_version"]),
        dist_version=f"{manifest['kernel_version']}+{local}",
        variant=f"ngc{row.release}",
        python=row.python,
        toolkit=f"cuda{row.cuda}",
        torch=row.torch,
        arches=arches,
        profile=str(inputs.get("profile", "full")),
        profile_tag=profile_tag,
        cxx11_abi=row.cxx11_abi,
        parity="not run",
        base_image=template.format(release=row.release),
    )
    return ImageRequest(
        spec=spec,
        manifest={**manifest, "ngc": {"release": row.release, "policy": policy}},
        ngc=row,
        ngc_image=spec.base_image,
        ngc_policy=policy,
        build_args={
            "FLASH_ATTN_CUDA_ARCHS": ";".join(a[3:] for a in arches if a.startswith("sm_")),
            "FLASH_ATTN_LOCAL_VERSION": local,
            "NVCC_APPEND_FLAGS": " ".join(flags),
        },
    )


def apply_ngc_facts(req: ImageRequest, facts: BaseFacts, log: Log) -> ImageRequest:
    """Make the spec say what the NGC (or stand-in) base really holds; keep-policy images name NGC's build."""
    spec = req.spec
    if req.ngc and facts.torch.split("+")[0] != req.ngc.torch.split("+")[0] and not facts.standin:
        log(f"note: {req.ngc_image} has torch {facts.torch}, the compat data says {req.ngc.torch}")
    extra = {
        "io.attnforge.ngc.release": req.ngc.release if req.ngc else "",
        "io.attnforge.ngc.base": req.ngc_image,
        "io.attnforge.ngc.flash-attn-policy": req.ngc_policy,
        "io.attnforge.ngc.bundled-flash-attn": facts.flash_attn or "none",
        "io.attnforge.ngc.constraint": (
            f"{facts.constraint}: flash-attn re-pinned to ours (NGC's original kept as {facts.constraint}.ngc)"
            if req.ngc_policy == "replace" and facts.constraint
            else f"{facts.constraint or 'none'}: unchanged"
        ),
    }
    if facts.standin:
        extra["io.attnforge.standin"] = "true (base is attnforge's local stand-in for NGC, not NGC)"
    spec = replace(spec, torch=facts.torch, python=facts.python, extra_labels=extra)
    expect = {
        "torch": facts.torch,
        "policy": req.ngc_policy,
        "bundled": facts.flash_attn or "",
        "kind": "ngc",
    }
    if req.ngc_policy == "keep":
        if not facts.flash_attn:
            raise BuildError(f"{req.ngc_image} bundles no flash-attn: policy 'keep' has nothing to keep")
        public = facts.flash_attn.split("+")[0]
        spec = replace(
            spec, kernel_version=public, dist_version=facts.flash_attn, profile_tag="bundled", arches=()
        )
        expect["flash_attn"] = facts.flash_attn
        manifest: dict[str, Any] = {
            "kind": "ngc-bundled",
            "ngc": req.manifest.get("ngc"),
            "flash_attn": facts.flash_attn,
            "inputs": {"arches": []},
            "note": "NGC's own flash-attn build: attnforge did not build it",
        }
        return replace(req, spec=spec, ngc_facts=facts, expect=expect, manifest=manifest)
    else:
        expect["flash_attn"] = spec.dist_version
    return replace(req, spec=spec, ngc_facts=facts, expect=expect)


# ------------------------------------------------------------------------------------------ pip setup


def _userinfo(url: str) -> bool:
    parsed = urllib.parse.urlparse(url)
    return bool(parsed.username or parsed.password)


@dataclass
class PipPlan:
    """How pip inside a build reaches its indexes: the pip.conf secret and the other secrets."""

    index_url: str
    extra_index_urls: list[str]
    local: Sources
    notes: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)  # remote find-links pages


def plan_pip(
    *, torch_index: str | None, options: PipOptions | None, extra_index_urls: list[str] | None = None
) -> PipPlan:
    """Decide the indexes: --torch-index alone, or the matrix/host pip options with local paths served."""
    extras = list(extra_index_urls or [])
    for url in [torch_index or "", *extras]:
        if url and _userinfo(url):
            raise ConfigurationError(
                "an index URL carries credentials: give them as a netrc file (--netrc), which reaches pip "
                "as a BuildKit secret, never in the URL (it would land in docker history)"
            )
    local = Sources()
    notes: list[str] = []
    if torch_index:
        return PipPlan(torch_index, extras, local, notes)
    index = PYPI
    links: list[str] = []
    args = list(options.args if options else [])
    for flag, value in zip(args[::2], args[1::2], strict=False):
        parsed = urllib.parse.urlparse(value)
        path = (
            Path(parsed.path) if parsed.scheme == "file" else Path(value) if value.startswith("/") else None
        )
        if flag == "--constraint":
            notes.append(f"pip constraint {value} not applied inside images (torch is pinned exactly)")
        elif path is not None:
            if not path.exists():
                notes.append(f"pip source {value} does not exist; skipped")
            elif flag == "--find-links":
                local.find_links.append(path)
            else:
                local.simple_roots.append(path)
        elif flag == "--index-url":
            index = value
        elif flag in ("--extra-index-url", "--find-links"):
            if _userinfo(value):
                raise ConfigurationError(f"pip option {flag} carries credentials: use --netrc")
            (extras if flag == "--extra-index-url" else links).append(value)
    return PipPlan(index, extras, local, notes, links)


@contextmanager
def pip_secrets(plan: PipPlan, *, ca_bundle: Path | None, netrc: Path | None) -> Iterator[dict[str, Path]]:
    """Serve local sources for the duration and yield the BuildKit secrets (id -> file)."""
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attnforge-pip-")))
        extras = list(plan.extra_index_urls)
        if plan.local.find_links or plan.local.simple_roots:
            server = stack.enter_context(LocalIndexServer(plan.local))
            extras.append(server.url)
        conf = tmp / "pip.conf"
        lines = ["[global]", f"index-url = {plan.index_url}"]
        if extras:
            lines.append("extra-index-url = " + " ".join(extras))
        if plan.find_links:
            lines.append("find-links = " + " ".join(plan.find_links))
        lines += ["timeout = 120", "retries = 2"]
        conf.write_text("\n".join(lines) + "\n")
        os.chmod(conf, 0o600)
        secrets = {"pip_conf": conf}
        if ca_bundle is not None:
            if not ca_bundle.is_file():
                raise EnvironmentProblem(f"CA bundle {ca_bundle} does not exist")
            secrets["ca_bundle"] = ca_bundle
        if netrc is not None:
            if not netrc.is_file():
                raise EnvironmentProblem(f"netrc {netrc} does not exist")
            secrets["pip_netrc"] = netrc
        yield secrets


# ------------------------------------------------------------------------------------------ building


@dataclass
class BuildOptions:
    """Everything `images build` decides besides the requests."""

    repository: str = DEFAULT_REPOSITORY
    out_dir: Path = Path("wheels")
    ca_bundle: Path | None = None
    netrc: Path | None = None
    torch_index: str | None = None
    extra_index_urls: list[str] = field(default_factory=list)
    pip_options: PipOptions | None = None
    flex_cache: Path | None = None
    source: Path | None = None
    max_jobs: int = 2
    smoke: bool = True
    strict_bases: bool = False
    allow_unpinned: bool = False
    revision: str = ""
    source_url: str = ""
    docker: str | None = None
    gpu: bool | None = None  # None: use a GPU for the smoke test when the engine has one


def _created() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = datetime.fromtimestamp(int(epoch), timezone.utc) if epoch else datetime.now(timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def git_revision(root: Path) -> str:
    proc = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _copy_source(src: Path, dest: Path) -> None:
    """A source folder or sdist into dest (sdist: its single top folder)."""
    if src.is_dir():
        shutil.copytree(src, dest, ignore=_SKIP_SOURCE)
        return
    if src.name.endswith((".tar.gz", ".tgz")):
        tmp = dest.parent / "_unpack"
        with tarfile.open(src) as tf:
            tf.extractall(tmp, filter="data")
        tops = [p for p in tmp.iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise ConfigurationError(f"{src}: expected one top folder in the sdist, found {len(tops)}")
        tops[0].rename(dest)
        shutil.rmtree(tmp)
        return
    raise ConfigurationError(f"--source {src}: give a source folder or an sdist (.tar.gz)")


def assemble_context(req: ImageRequest, ctx: Path, opts: BuildOptions) -> None:
    """The build context of one image: wheels/ or src/, manifest.json, smoke.py, flex-cache/."""
    ctx.mkdir(parents=True, exist_ok=True)
    shutil.copy2(HERE / "smoke_script.py", ctx / "smoke.py")
    (ctx / "manifest.json").write_text(json.dumps(req.manifest, indent=2, sort_keys=True) + "\n")
    if req.spec.kind == "runtime":
        assert req.wheel is not None
        (ctx / "wheels").mkdir()
        for wheel in [req.wheel, *req.extra_wheels]:
            shutil.copy2(wheel, ctx / "wheels" / wheel.name)
        flex = ctx / "flex-cache"
        if opts.flex_cache and opts.flex_cache.is_dir():
            shutil.copytree(opts.flex_cache, flex)
        else:
            flex.mkdir()
    elif req.ngc_policy == "replace":
        if opts.source is None:
            raise ConfigurationError(
                "NGC images compile flash-attn on the NGC base: give --source (folder or sdist)"
            )
        _copy_source(opts.source, ctx / "src")


def engine_has_gpu(dk: Docker) -> bool:
    """nvidia-smi on the host and an nvidia runtime in the engine."""
    if shutil.which("nvidia-smi") is None:
        return False
    res = dk.run("info", "--format", "{{json .Runtimes}}")
    return res.ok and "nvidia" in res.output


def run_smoke(
    dk: Docker, ref: str, expect: dict[str, str], *, gpu: bool, log: Log = _quiet
) -> dict[str, Any]:
    """Run the in-image smoke test; the parsed report (ok False with the output tail when it broke)."""
    args = ["run", "--rm", "--network", "none"]
    if gpu:
        args += ["--gpus", "all"]
    args += [ref, "python", "/opt/attnforge/smoke.py", "--expect", json.dumps(expect, sort_keys=True)]
    res = dk.run(*args)
    for line in res.output.splitlines():
        if line.startswith(("ok ", "FAIL ")):
            log(f"  smoke {line}")
    report: dict[str, Any] = {"ok": False, "output": res.tail(20)}
    for line in reversed(res.output.splitlines()):
        if line.startswith("@@attnforge-smoke "):
            report = json.loads(line[len("@@attnforge-smoke ") :])
            break
    report["exit_code"] = res.returncode
    report["ok"] = bool(report.get("ok")) and res.returncode == 0
    return report


def build_one(
    dk: Docker,
    req: ImageRequest,
    *,
    base: BaseCheck,
    secrets: dict[str, Path],
    opts: BuildOptions,
    created: str,
    log: Log,
) -> BuiltImage:
    """Build, label and smoke-test one image; BuildError / TestFailure on failure."""
    spec = req.spec
    ref = f"{opts.repository}:{spec.tag}"
    labels = spec.labels(created=created, revision=opts.revision, source=opts.source_url)
    logs = opts.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"image-{spec.tag}.log"
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="attnforge-image-") as tmp, log_path.open("w") as fh:
        ctx = Path(tmp) / "context"
        assemble_context(req, ctx, opts)

        seen: set[str] = set()

        def on_line(line: str) -> None:
            fh.write(line + "\n")
            parts = line.split(" ", 2)
            if (
                len(parts) == 3
                and parts[0].startswith("#")
                and parts[1].startswith("[")
                and parts[0] not in seen
            ):
                seen.add(parts[0])
                log("  " + line[:120])

        if spec.kind == "runtime":
            args = {
                "BASE_IMAGE": base.ref,
                "PYTHON_VERSION": spec.python,
                "TORCH_REQUIREMENT": req.torch_requirement,
            }
            res = dk.build(
                ctx,
                docker_dir() / "runtime.Dockerfile",
                [ref],
                build_args=args,
                labels=labels,
                secrets=secrets,
                target="runtime",
                on_line=on_line,
            )
        else:
            args = {"NGC_IMAGE": base.ref, "MAX_JOBS": str(opts.max_jobs), **req.build_args}
            res = dk.build(
                ctx,
                docker_dir() / "ngc.Dockerfile",
                [ref],
                build_args=args,
                labels=labels,
                target=req.ngc_policy,
                on_line=on_line,
            )
    if not res.ok:
        hint = None
        if "Unable to locate package python" in res.output:
            hint = f"the base {base.name} packages no python{spec.python}: choose a base that does (--runtime-base)"
        raise BuildError(f"image {spec.tag} did not build (log {log_path}):\n{res.tail(12)}", hint=hint)
    log(f"built {ref} in {time.monotonic() - start:.0f} s")
    smoke: dict[str, Any] = {"ok": None, "skipped": True}
    if opts.smoke:
        gpu = engine_has_gpu(dk) if opts.gpu is None else opts.gpu
        smoke = run_smoke(dk, ref, req.expect, gpu=gpu, log=log)
        if not smoke["ok"]:
            why = "; ".join(smoke.get("failures") or []) or smoke.get("output", "")
            raise TestFailure(f"smoke test of {ref} failed: {why}")
    image_id = dk.image_id(ref) or ""
    return BuiltImage(
        tag=spec.tag,
        kind=spec.kind,
        image_id=image_id,
        labels=labels,
        smoke=smoke,
        base={"name": base.name, "ref": base.ref, "digest": base.digest, "pin": base.status},
        seconds=round(time.monotonic() - start, 1),
    )


def build_set(requests: list[ImageRequest], opts: BuildOptions, *, log: Log = _quiet) -> ImageSet:
    """Build every request (stopping at the first failure), tag aliases, write `<out_dir>/images.json`."""
    if not requests:
        raise ConfigurationError("no image to build")
    dk = Docker(opts.docker or DOCKER)
    dk.check_engine()
    bases = load_bases(docker_dir() / "bases.toml")
    specs = resolve_tags([r.spec for r in requests])
    requests = [replace(r, spec=s) for r, s in zip(requests, specs, strict=True)]
    alias_of = aliases(specs)
    created = _created()
    image_set = ImageSet(repository=opts.repository, created=created)
    runtime = [r for r in requests if r.spec.kind == "runtime"]
    plan = plan_pip(
        torch_index=opts.torch_index, options=opts.pip_options, extra_index_urls=opts.extra_index_urls
    )
    for note in plan.notes:
        log(f"note: {note}")
    with pip_secrets(plan, ca_bundle=opts.ca_bundle, netrc=opts.netrc) as secrets:
        if runtime:
            log(
                f"pip inside the builds: index {plan.index_url}, extra {plan.extra_index_urls or '-'}"
                + (
                    ", local mirrors served read-only over 127.0.0.1"
                    if plan.local.find_links or plan.local.simple_roots
                    else ""
                )
            )
        for req in requests:
            base_name = req.spec.base_image
            check = check_base(
                dk, base_name, bases, strict=opts.strict_bases, allow_unpinned=opts.allow_unpinned
            )
            if check.message:
                log(f"note: {check.message}")
            spec = replace(req.spec, base_digest=check.digest)
            req = replace(req, spec=spec)
            log(f"building {opts.repository}:{spec.tag} ({spec.kind}, base {base_name})")
            built = build_one(dk, req, base=check, secrets=secrets, opts=opts, created=created, log=log)
            image_set.images.append(built)
    for alias, tag in alias_of.items():
        res = dk.tag(image_set.local_ref(tag), image_set.local_ref(alias))
        if not res.ok:
            raise BuildError(f"cannot tag {alias}: {res.tail(2)}")
        next(i for i in image_set.images if i.tag == tag).aliases.append(alias)
    write_record(opts.out_dir / "images.json", image_set)
    return image_set


def standin_image(release: str) -> str:
    return STANDIN_TEMPLATE.format(release=release)


def expect_from_labels(labels: dict[str, str]) -> dict[str, str]:
    """What the smoke test should find in an image, from the image's own labels."""
    p = "io.attnforge."
    expect = {
        "torch": labels.get(p + "torch", ""),
        "flash_attn": labels.get(p + "flash-attn", ""),
        "kind": labels.get(p + "kind", ""),
    }
    policy = labels.get(p + "ngc.flash-attn-policy")
    if policy:
        expect["policy"] = policy
        expect["bundled"] = labels.get(p + "ngc.bundled-flash-attn", "")
    return {k: v for k, v in expect.items() if v}
