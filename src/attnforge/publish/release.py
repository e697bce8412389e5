"""`attnforge publish --to NAME`: finalized wheels to a static index or an index server, behind gates.

Gates, in order, before anything is written: every wheel has its manifest and matches it byte for
byte; the wheel's own names (file name, METADATA) agree with the manifest (`wheels.wheel_claims`); its
signed build provenance and SBOM hold (`record_gate`; none at all only with `--allow-unsigned`); the
destination's parity rule (`require_parity: true` needs a signed parity record about these bytes that
says passed, unless `--skip-parity-gate`, which is logged loudly and recorded); no file name or version
slot already published with other bytes (identical bytes are a no-op). A static index gets the coverage
page at its root (`publish.coverage`), with the plan of the matrix next to which the publish runs; an index
server's wheels get their records in the destination's `records` folder (`publish.record_site`).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from attnforge.core.errors import AttnforgeError, ConfigurationError, PublishError
from attnforge.matrix.destinations import Destination, ad_hoc, resolve_credentials
from attnforge.matrix.project import Project
from attnforge.publish.coverage_page import CoveragePage
from attnforge.publish.coverage_plan import PlanSnapshot
from attnforge.publish.index import Bundle, PublishReport, StaticIndex, check_conflicts
from attnforge.publish.record_gate import attach_torch_checks, check_build_records, parity_verdicts
from attnforge.publish.record_site import write_records
from attnforge.publish.server_deadline import Deadline
from attnforge.publish.upload import publish_to_server
from attnforge.wheels import wheel_claims
from attnforge.wheels.manifest import MANIFEST_SUFFIX, check_matches_wheel, manifest_path_for, read_manifest
from attnforge.wheels.signing_keys import TrustedKey

Log = Callable[[str], None]


def _echo(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _bundle(wheel: Path) -> Bundle:
    mpath = manifest_path_for(wheel)
    if not mpath.is_file():
        raise PublishError(
            f"{wheel.name}: no {mpath.name} beside it", hint="run `attnforge wheels finalize` first"
        )
    try:
        data = read_manifest(mpath)
    except AttnforgeError as exc:
        raise PublishError(str(exc)) from None
    if "finalize" not in data:
        raise PublishError(f"{wheel.name}: not finalized", hint="run `attnforge wheels finalize` first")
    check_matches_wheel(wheel, data)
    if not data.get("variant"):
        raise PublishError(f"{wheel.name}: manifest has no variant")
    return Bundle(wheel=wheel, manifest=data)


def check_claims(bundles: Sequence[Bundle]) -> None:
    """The wheels' own names (file name, METADATA) agree with their manifests (`wheels.wheel_claims`).
    Called after the record gates: nothing inside an archive is inflated before its signature held, and
    then only within `zip_limits`' cap."""
    for b in bundles:
        wheel_claims.check(b.wheel, b.manifest)


def _regular_file(path: Path) -> None:
    """Refuse a FIFO, socket or device named *.whl: opening one would wait for a writer forever."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise PublishError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise PublishError(f"{path}: not a regular file (a FIFO, socket or device named like a wheel)")


def collect_bundles(sources: Iterable[Path], exclude: Sequence[Path] = ()) -> list[Bundle]:
    """Wheels named directly, or found under folders (skipping hidden folders and the index itself)."""
    skip = [Path(os.path.abspath(p)) for p in exclude]
    wheels: list[Path] = []
    unfinalized: list[Path] = []  # wheels found without a manifest beside them
    for src in sources:
        if src.is_file():
            wheels.append(src)
            continue
        if src.exists() and not src.is_dir():
            _regular_file(src)
        if not src.is_dir():
            raise ConfigurationError(f"{src}: no such wheel or folder")
        for root, dirs, files in os.walk(src):
            here = Path(os.path.abspath(root))
            dirs[:] = sorted(
                d for d in dirs if not d.startswith(".") and not any((here / d) == s for s in skip)
            )
            for f in sorted(files):
                if f.endswith(".whl"):
                    _regular_file(here / f)
                    finalized = (here / (f + MANIFEST_SUFFIX)).is_file()
                    (wheels if finalized else unfinalized).append(here / f)
    seen: set[Path] = set()
    bundles = []
    for w in wheels:
        key = Path(os.path.abspath(w))
        if key not in seen:
            seen.add(key)
            bundles.append(_bundle(w))
    if not bundles:
        where = ", ".join(str(s) for s in sources)
        if unfinalized:
            names = ", ".join(w.name for w in unfinalized[:3]) + (" ..." if len(unfinalized) > 3 else "")
            raise PublishError(
                f"no finalized wheels found in {where}: {names} ha{'s' if len(unfinalized) == 1 else 've'} no "
                f"manifest (<wheel>{MANIFEST_SUFFIX}) beside it; finalize first: "
                f"attnforge wheels finalize {unfinalized[0]}"
            )
        raise PublishError(f"no finalized wheels found in {where}")
    return bundles


def default_sources(project: Project) -> list[Path]:
    """The matrix's build output folder (`build.output_dir`, default `wheels/`)."""
    try:
        return [project.path(project.matrix.build.output_dir)]
    except (AttributeError, AttnforgeError):
        return [Path("wheels")] if Path("wheels").is_dir() else []


def resolve_destination(project: Project, target: str) -> tuple[Destination, Path]:
    """(destination, base folder for its relative paths) for `--to NAME | PATH | URL`."""
    matrix_error: AttnforgeError | None = None
    try:
        configured = dict(project.matrix.destinations)
        base = Path(project.root)
    except AttnforgeError as exc:
        configured, base, matrix_error = {}, Path.cwd(), exc
    if target in configured:
        raw = configured[target]
        dest = raw if isinstance(raw, Destination) else Destination.model_validate(raw.model_dump())
        return dest, base
    adhoc = ad_hoc(target)
    if adhoc is not None:
        return adhoc, Path.cwd()
    if matrix_error is not None:
        raise ConfigurationError(f"--to {target}: {matrix_error}")
    known = ", ".join(sorted(configured)) or "none defined"
    raise ConfigurationError(f"--to {target}: no such destination in matrix.yaml (known: {known})")


def open_static(dest: Destination, base: Path, plan: PlanSnapshot | None = None) -> StaticIndex:
    """The static index a destination names (its path relative to `base`), writing the coverage page;
    `plan` None keeps the plan the index shows already."""
    assert dest.kind == "static" and dest.path is not None
    root = Path(dest.path)
    return StaticIndex(root if root.is_absolute() else base / root, root_page=CoveragePage(plan))


def check_static_root(index: StaticIndex, target: str, log: Log) -> None:
    """A static index's folder may be new, its parent may not: the index keeps its lock and generations
    beside itself, and a mistyped parent would otherwise grow a tree somewhere unintended."""
    root = index.root
    if root.is_dir():
        return
    if root.exists():
        raise ConfigurationError(f"--to {target}: {root} exists and is not a folder")
    if not root.parent.is_dir():
        raise ConfigurationError(
            f"--to {target}: {root.parent} does not exist; publish creates only the index folder itself "
            f"({root.name}): create {root.parent} first or correct the path"
        )
    log(f"publish: {root} does not exist yet: it will be created as a new index")


def apply_parity_gate(
    bundles: Sequence[Bundle],
    dest: Destination,
    label: str,
    skip: bool,
    log: Log,
    warn: Log | None = None,
    trusted: Sequence[TrustedKey] = (),
) -> None:
    """Mark each bundle's gate outcome from its signed parity record (`record_gate.parity_verdicts`);
    refuse the whole publish when one fails and the gate is on.

    Skipping a failing gate is announced through `warn` (default: `log`), which the CLI shows loudly."""
    failing = []
    verdicts = parity_verdicts(bundles, trusted)
    for b in bundles:
        if dest.require_parity and verdicts.get(b.filename, "") is None:
            b.gate = "passed"
        elif dest.require_parity:
            failing.append(b)
            b.gate = "skipped"
        else:
            b.gate = "passed" if verdicts.get(b.filename, "") is None else "not-required"
    if not failing:
        return
    names = ", ".join(b.filename for b in failing)
    if not skip:
        reasons = "; ".join(str(verdicts[b.filename]) for b in failing)
        raise PublishError(
            f"destination '{label}' requires a passed GPU parity run, signed: {reasons}; nothing was published",
            hint="run `attnforge parity run --wheel WHEEL` on a GPU (it signs the outcome), or --skip-parity-gate",
        )
    say = warn or log
    banner = "!" * 78
    say(banner)
    say(
        f"WARNING: --skip-parity-gate: publishing {len(failing)} wheel(s) to '{label}' WITHOUT a passed "
        f"GPU parity run: {names}"
    )
    say(banner)


def publish(
    bundles: Sequence[Bundle],
    dest: Destination,
    label: str,
    base: Path,
    *,
    skip_parity_gate: bool = False,
    dry_run: bool = False,
    log: Log = _echo,
    warn: Log | None = None,
    plan: PlanSnapshot | None = None,
    trusted: Sequence[TrustedKey] = (),
    allow_unsigned: bool = False,
    deadline: Deadline | None = None,
) -> PublishReport:
    """Publish finalized wheels to one destination (see the module docstring); `warn` as in
    `apply_parity_gate`; `plan` is what the coverage page of a static index shows as planned; `trusted`:
    the keys records are accepted from (`signing_keys.trusted_keys`); `deadline`: the total time an index
    server may take (`server_deadline`)."""
    check_build_records(bundles, trusted, allow_unsigned, log, warn or log)
    attach_torch_checks(bundles)
    apply_parity_gate(bundles, dest, label, skip_parity_gate, log, warn, trusted)
    check_claims(bundles)
    if dest.kind == "static":
        index = open_static(dest, base, plan)
        if dry_run:
            current = {f: r.sha256 for f, r in index.records().items()}
            new, unchanged = check_conflicts(current, [(b.filename, b.sha256) for b in bundles])
            report = PublishReport(destination=str(index.root), unchanged=unchanged)
            report.notes.append("dry run: would add " + (", ".join(new) or "nothing"))
            return report
        return index.publish(bundles)
    if dest.kind == "pypiserver":
        assert dest.url is not None
        creds = resolve_credentials(dest, base)
        report = publish_to_server(dest.url, creds, bundles, log, dry_run=dry_run, deadline=deadline)
        if dry_run:
            return report
        if dest.records:  # the server keeps packages only: the records go where consumers can read them
            root = Path(dest.records)
            done = [*report.added, *report.unchanged]
            report.notes.append(write_records(bundles, root if root.is_absolute() else base / root, done))
        else:
            report.notes.append(
                f"records: not published ('{label}' names no records folder), so `which --verify` and "
                f"`doctor --verify` cannot check these wheels from {dest.url}: give the destination a "
                "`records:` folder (`attnforge docs records`)"
            )
        return report
    raise ConfigurationError(f"destination '{label}' is a {dest.kind}: wheels go to 'static' or 'pypiserver'")


def print_report(report: PublishReport, log: Log = _echo) -> None:
    """One line per wheel, then a summary."""
    for f in report.added:
        extra = "  (parity gate SKIPPED)" if f in report.skipped_gate else ""
        log(f"added      {f}{extra}")
    for f in report.unchanged:
        log(f"unchanged  {f}")
    for n in report.notes:
        log(n)
    log(f"{report.destination}: {len(report.added)} added, {len(report.unchanged)} already there")
