"""Build an image set: runtime images from finished wheels, NGC images compiled on the NGC base.

For each image: check the base against docker/bases.toml, assemble a small build context, run
`DOCKER_BUILDKIT=1 docker build` with the pip configuration, CA bundle and index credentials as secrets
(runtime images; an NGC image's flash-attn is first compiled on its base by `ngc_image.compile_on_base`),
smoke-test the result (`smoke.run_smoke`), tag the moving aliases, and record the set in
`<output>/images.json` for `images push`. The first failure stops the set (nothing half-built is recorded).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from attnforge.core import log_context
from attnforge.core.docker_cli import Docker, docker_executable
from attnforge.core.errors import BuildError, ConfigurationError, TestFailure
from attnforge.core.package_files import docker_dir as package_docker_dir
from attnforge.core.pins import local_base
from attnforge.engine.backends.pip_config import PipOptions
from attnforge.engine.backends.pipplan import pip_secrets, plan_pip
from attnforge.engine.base_images import BaseCheck, check_base, load_bases
from attnforge.engine.settings import Requested
from attnforge.images.image_smoke import engine_has_gpu, run_smoke
from attnforge.images.ngc_image import compile_on_base
from attnforge.images.record import BuiltImage, ImageSet, write_record
from attnforge.images.requests import ImageRequest
from attnforge.images.tags import aliases, resolve_tags
from attnforge.matrix.schema import ResourcesSpec

Log = Callable[[str], None]
HERE = Path(__file__).resolve().parent
DEFAULT_REPOSITORY = "attnforge/flash-attn"
DEFAULT_RUNTIME_BASE = local_base()
NGC_WHEELS = "ngc"  # <out_dir>/ngc/: the finalized wheels compiled on NGC bases (only for their images)


def _quiet(_: str) -> None:
    return None


def docker_dir() -> Path:
    """attnforge's docker/ folder (package data; ATTNFORGE_DOCKER_DIR overrides): core.package_files."""
    return package_docker_dir("runtime.Dockerfile")


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
    source: Path | None = None  # NGC images: the kernel source (folder or sdist) compiled on the base
    requested: Requested | None = None  # NGC compiles: --max-jobs/--nvcc-threads or the environment
    resources: ResourcesSpec | None = None  # NGC compiles: the matrix's build.resources
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


def assemble_context(req: ImageRequest, ctx: Path, opts: BuildOptions) -> None:
    """The build context of one image: wheels/, manifest.json, smoke.py (runtime: flex-cache/)."""
    ctx.mkdir(parents=True, exist_ok=True)
    shutil.copy2(HERE / "smoke_script.py", ctx / "smoke.py")
    (ctx / "manifest.json").write_text(json.dumps(req.manifest, indent=2, sort_keys=True) + "\n")
    if req.spec.kind == "ngc" and req.ngc_policy == "keep":
        return
    if req.wheel is None:
        raise BuildError(f"image {req.spec.tag}: no wheel to install")
    (ctx / "wheels").mkdir()
    for wheel in [req.wheel, *req.extra_wheels]:
        shutil.copy2(wheel, ctx / "wheels" / wheel.name)
    if req.spec.kind == "runtime":
        flex = ctx / "flex-cache"
        if opts.flex_cache and opts.flex_cache.is_dir():
            shutil.copytree(opts.flex_cache, flex)
        else:
            flex.mkdir()


def build_one(
    dk: Docker,
    req: ImageRequest,
    *,
    base: BaseCheck,
    secrets: dict[str, Path],
    opts: BuildOptions,
    created: str,
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
        seen: set[str] = set()

        def on_line(line: str) -> None:
            fh.write(line + "\n")
            parts = line.split(" ", 2)
            if (
                len(parts) == 3
                and parts[0].startswith("#")
                and parts[1].startswith("[")
                and f"{parts[0]} {parts[1]}" not in seen  # step numbers restart in each docker build
            ):
                seen.add(f"{parts[0]} {parts[1]}")
                log_context.log("  " + line[:120])

        if spec.kind == "runtime":
            ctx = Path(tmp) / "context"
            assemble_context(req, ctx, opts)
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
            if req.ngc_policy == "replace":
                if opts.source is None:
                    raise ConfigurationError("NGC images compile flash-attn on the NGC base: give --source")
                try:
                    req = compile_on_base(
                        dk,
                        req,
                        base_ref=base.ref,
                        dockerfile=docker_dir() / "ngc.Dockerfile",
                        source=opts.source,
                        requested=opts.requested,
                        resources=opts.resources,
                        out_dir=opts.out_dir / NGC_WHEELS,
                        on_line=on_line,
                    )
                except BuildError as exc:
                    raise BuildError(f"{exc.message} (log {log_path})", hint=exc.hint) from None
            ctx = Path(tmp) / "context"
            assemble_context(req, ctx, opts)
            res = dk.build(
                ctx,
                docker_dir() / "ngc.Dockerfile",
                [ref],
                build_args={"NGC_IMAGE": base.ref},
                labels=labels,
                target=req.ngc_policy,
                network="none",
                on_line=on_line,
            )
    if not res.ok:
        hint = None
        if "Unable to locate package python" in res.output:
            hint = f"the base {base.name} packages no python{spec.python}: choose a base that does (--runtime-base)"
        raise BuildError(f"image {spec.tag} did not build (log {log_path}):\n{res.tail(12)}", hint=hint)
    log_context.log(f"built {ref} in {time.monotonic() - start:.0f} s")
    smoke: dict[str, Any] = {"ok": None, "skipped": True}
    if opts.smoke:
        gpu = engine_has_gpu(dk) if opts.gpu is None else opts.gpu
        smoke = run_smoke(dk, ref, req.expect, gpu=gpu, log=log_context.log)
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
        wheel=str(req.wheel or ""),
        seconds=round(time.monotonic() - start, 1),
    )


def build_set(requests: list[ImageRequest], opts: BuildOptions, *, log: Log = _quiet) -> ImageSet:
    """Build every request (stopping at the first failure), tag aliases, write `<out_dir>/images.json`."""
    if not requests:
        raise ConfigurationError("no image to build")
    dk = Docker(opts.docker or docker_executable())
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
            with log_context.logging_to(log):
                built = build_one(dk, req, base=check, secrets=secrets, opts=opts, created=created)
            image_set.images.append(built)
    for alias, tag in alias_of.items():
        res = dk.tag(image_set.local_ref(tag), image_set.local_ref(alias))
        if not res.ok:
            raise BuildError(f"cannot tag {alias}: {res.tail(2)}")
        next(i for i in image_set.images if i.tag == tag).aliases.append(alias)
    write_record(opts.out_dir / "images.json", image_set)
    return image_set
