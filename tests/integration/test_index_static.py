"""Finalize real wheels, publish them to a static index, serve it, and let pip install (or refuse) them."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.integration.wheelfactory")

from tests.integration.wheelfactory import (  # noqa: E402
    Served,
    TorchEnv,
    attnforge_serve,
    cli,
    copy_wheel,
    fresh_env,
    pip_install,
    run,
    write_matrix,
)

pytest_plugins = ["tests.integration.wheelfactory"]

JSON = "application/vnd.pypi.simple.v1+json"
V214 = "2.8.3+cu130torch2.14cxx11abiTRUE"
V213 = "2.8.3+cu130torch2.13cxx11abiTRUE"
SMOKE = (
    "import torch, flash_attn_2_cuda, flash_attn; "
    "print(flash_attn.build_info(), flash_attn.add_one(torch.zeros(2)).tolist())"
)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under the index (symlink followed) with its hash, plus where the symlink points."""
    out = {"<target>": os.readlink(root) if root.is_symlink() else "<dir>"}
    for path in sorted(root.resolve().rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root.resolve()))] = sha256(path.read_bytes())
    return out


def get(url: str, accept: str | None = None) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def make_project(root: Path, *wheels: Path) -> Path:
    """A project folder: matrix.yaml with a `local` static destination and the wheels in wheels/."""
    root.mkdir(parents=True)
    write_matrix(root, local={"kind": "static", "path": "wheels/index", "require_parity": False})
    (
        root / "wheels"
    ).mkdir()  # the build's output folder, which the index goes into (publish makes only the last level)
    for w in wheels:
        copy_wheel(w, root / "wheels")
    return root


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, wheel214: Path, wheel213: Path) -> Path:
    project = make_project(tmp_path_factory.mktemp("static") / "proj", wheel214, wheel213)
    proc = cli("publish", "--to", "local", cwd=project)
    assert proc.stderr.count("added ") == 2, proc.stderr
    return project


@pytest.fixture(scope="module")
def server(published: Path) -> Iterator[Served]:
    with attnforge_serve(published / "wheels" / "index", published / "serve.log") as served:
        yield served


# ---------------------------------------------------------------- finalize


def test_finalize_names_pins_and_verifies(wheel214: Path, wheel213: Path, tmp_path: Path) -> None:
    assert re.fullmatch(
        rf"flash_attn-{re.escape(V214)}-cp311-cp311-manylinux_2_\d+_x86_64\.whl", wheel214.name
    )
    assert wheel213.name.startswith(f"flash_attn-{V213}-cp311-cp311-")
    for wheel, pin in ((wheel214, "torch==2.14.*"), (wheel213, "torch==2.13.*")):
        with zipfile.ZipFile(wheel) as zf:
            dist_info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            meta = zf.read(f"{dist_info}/METADATA").decode()
            record = json.loads(zf.read(f"{dist_info}/attnforge_build.json"))
            infos = zf.infolist()
        assert dist_info == f"flash_attn-{wheel.name.split('-')[1]}.dist-info"
        assert f"Version: {wheel.name.split('-')[1]}\n" in meta
        assert re.findall(r"^Requires-Dist: (.*)$", meta, re.M) == [pin]
        assert record["torch_requirement"] == pin and record["inputs"]["arches"] == ["sm_90"]
        # reproducible layout: sorted library files, .dist-info last with RECORD at the end, fixed times
        names = [i.filename for i in infos]
        lib = [n for n in names if not n.startswith(dist_info)]
        assert lib == sorted(lib) and names[-1] == f"{dist_info}/RECORD"
        assert {i.date_time for i in infos} == {(2023, 11, 14, 22, 13, 20)}  # SOURCE_DATE_EPOCH=1700000000
        # RECORD hashes: `wheel unpack` verifies every file
        run([sys.executable, "-m", "wheel", "unpack", "-d", tmp_path / wheel.name, wheel])
        top = sorted({n.split("/")[0] for n in lib})
        proc = run(
            [sys.executable, "-m", "check_wheel_contents", "--no-config", "--toplevel", ",".join(top), wheel]
        )
        assert "OK" in proc.stdout
        manifest = json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text())
        assert manifest["wheel"] == wheel.name
        assert manifest["sha256"] == sha256(wheel.read_bytes()) and manifest["size"] == wheel.stat().st_size
        assert manifest["platform_tag"]["tag"] in wheel.name and manifest["platform_tag"]["reason"]
        assert "libc10.so" in manifest["finalize"]["excluded_libs"]
    changes214 = json.loads(wheel214.with_name(wheel214.name + ".manifest.json").read_text())["finalize"][
        "changes"
    ]
    assert "local version: added +cu130torch2.14cxx11abiTRUE" in changes214
    changes213 = json.loads(wheel213.with_name(wheel213.name + ".manifest.json").read_text())["finalize"][
        "changes"
    ]
    assert not any(c.startswith("local version") for c in changes213)  # the build had set it right


def test_finalize_is_reproducible_and_repairs_the_local_version(
    factory_root: Path, wheel214: Path, tmp_path: Path
) -> None:
    raw = factory_root / "wheel-torch2.14" / "raw-original.whl"
    outs = []
    for n in (1, 2):
        d = tmp_path / f"run{n}"
        d.mkdir()
        src = d / "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl"
        src.write_bytes(raw.read_bytes())
        data = json.loads(wheel214.with_name(wheel214.name + ".manifest.json").read_text())
        data.update(wheel=src.name, sha256=None, size=None)
        data.pop("finalize")
        src.with_name(src.name + ".manifest.json").write_text(json.dumps(data))
        proc = cli("wheels", "finalize", src, env=dict(os.environ, SOURCE_DATE_EPOCH="1700000000"))
        outs.append(Path(proc.stdout.strip()))
        assert not src.exists()  # replaced by the finalized wheel
    assert outs[0].name == outs[1].name == wheel214.name
    assert outs[0].read_bytes() == outs[1].read_bytes() == wheel214.read_bytes()

    # a wheel whose local version names the wrong profile is repaired (and renamed)
    wrong = copy_wheel(wheel214, tmp_path / "repair")
    data = json.loads(wrong.with_name(wrong.name + ".manifest.json").read_text())
    data["inputs"].update(profile="fwd128", profile_tag="fwd128")
    wrong.with_name(wrong.name + ".manifest.json").write_text(json.dumps(data))
    proc = cli("wheels", "finalize", wrong)
    fixed = Path(proc.stdout.strip())
    assert fixed.name.startswith(
        "flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE.fwd128-cp311-cp311-manylinux_2_"
    )
    assert "replaced +cu130torch2.14cxx11abiTRUE" in proc.stderr
    assert cli("wheels", "verify", fixed).returncode == 0


# ---------------------------------------------------------------- static index over HTTP


def test_pip_installs_from_the_served_index(server: Served, torch214: TorchEnv, tmp_path: Path) -> None:
    py = fresh_env(tmp_path / "env", torch214)
    proc = pip_install(py, "--index-url", f"{server.url}/cu130-torch2.14/simple", f"flash-attn=={V214}")
    assert proc.returncode == 0, proc.stderr
    smoke = run([py, "-c", SMOKE])
    assert smoke.stdout.split()[0] == "cuda" and "[1.0, 1.0]" in smoke.stdout
    log = server.text()
    # pip negotiated the PEP 691 JSON page and fetched the PEP 658 metadata before the wheel
    assert re.search(rf"GET /cu130-torch2.14/simple/flash-attn/ .* 200 .*\[{re.escape(JSON)}\]", log), log
    assert '.whl.metadata HTTP/1.1" 200' in log
    doctor = cli("doctor", "--python", py)
    assert "ok   import flash_attn_2_cuda" in doctor.stdout
    assert "skip GPU arch: no GPU visible; compiled for sm_90" in doctor.stdout


def test_which_prints_the_command_that_installs(server: Served, torch214: TorchEnv, tmp_path: Path) -> None:
    probe_env = fresh_env(tmp_path / "probe", torch214)
    proc = cli("which", "--index-url", server.url, "--python", probe_env)
    command = proc.stdout.strip()
    assert command == f"pip install flash-attn=={V214} --index-url {server.url}/cu130-torch2.14/simple"
    target = fresh_env(tmp_path / "target", torch214)
    args = command.split()[2:]
    assert pip_install(target, *args).returncode == 0
    assert run([target, "-c", SMOKE]).stdout.startswith("cuda")


def test_which_verify_checks_the_chosen_wheels_records(
    server: Served, torch214: TorchEnv, tmp_path: Path
) -> None:
    """The records publish served beside the wheel (signed by the wheel factory's key at finalize)."""
    probe_env = fresh_env(tmp_path / "probe", torch214)
    proc = cli("which", "--index-url", server.url, "--python", probe_env, "--verify")
    assert (
        proc.stdout.strip()
        == f"pip install flash-attn=={V214} --index-url {server.url}/cu130-torch2.14/simple"
    )
    assert "ok   provenance: signed by " in proc.stderr and "ok   sbom: " in proc.stderr
    assert "warn parity: no signed parity record beside the wheel" in proc.stderr
    # trusting only a key the records were not signed with: exit 7, no command
    other = tmp_path / "other.pem"
    cli("keys", "generate", other)
    proc = cli(
        "which", "--index-url", server.url, "--python", probe_env, "--verify",
        "--trusted-key", other.with_suffix(".pub"), check=False,
    )  # fmt: skip
    assert proc.returncode == 7 and proc.stdout == ""
    assert "provenance.intoto.json: signed by " in proc.stderr and "not a trusted key" in proc.stderr


def test_json_api_is_valid_and_negotiated(server: Served, published: Path) -> None:
    status, ctype, body = get(f"{server.url}/all/simple/flash-attn/", JSON)
    assert status == 200 and ctype == JSON
    page = json.loads(body)
    assert page["meta"] == {"api-version": "1.1"} and page["name"] == "flash-attn"
    assert set(page["versions"]) == {V213, V214}
    assert len(page["files"]) == 2
    for f in page["files"]:
        assert set(f) >= {
            "filename",
            "url",
            "hashes",
            "requires-python",
            "core-metadata",
            "size",
            "upload-time",
        }
        _, _, wheel = get(f"{server.url}/all/simple/flash-attn/{f['url']}")
        assert sha256(wheel) == f["hashes"]["sha256"] and len(wheel) == f["size"]
        _, _, metadata = get(f"{server.url}/all/simple/flash-attn/{f['url']}.metadata")
        assert sha256(metadata) == f["core-metadata"]["sha256"] == f["dist-info-metadata"]["sha256"]
        assert f"Version: {f['filename'].split('-')[1]}" in metadata.decode()
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", f["upload-time"])
        _, _, manifest = get(f"{server.url}/all/simple/flash-attn/{f['url']}.manifest.json")
        assert json.loads(manifest)["sha256"] == f["hashes"]["sha256"]
    # per-variant pages hold only their variant
    _, _, one = get(f"{server.url}/cu130-torch2.13/simple/flash-attn/", JSON)
    assert [f["filename"].split("-")[1] for f in json.loads(one)["files"]] == [V213]
    # HTML for browsers and old clients, with PEP 658/714 attributes; 406 for what we cannot serve
    status, ctype, html = get(f"{server.url}/all/simple/flash-attn/")
    assert status == 200 and ctype.startswith("text/html")
    assert html.count(b'data-core-metadata="sha256=') == 2 and b'data-requires-python="&gt;=3.9"' in html
    assert get(f"{server.url}/all/simple/flash-attn/", "application/vnd.pypi.simple.v1+html")[1].endswith(
        "+html"
    )
    assert get(f"{server.url}/all/simple/", JSON)[2].startswith(b"{")
    assert get(f"{server.url}/all/simple/flash-attn/", "application/xml")[0] == 406
    # the static files themselves, for servers that cannot negotiate
    files = published / "wheels" / "index" / "all" / "simple" / "flash-attn"
    assert json.loads((files / "index.json").read_text()) == page


# ---------------------------------------------------------------- pip refuses a torch mismatch


def test_pip_refuses_a_wheel_built_for_another_torch(
    server: Served, torch213: TorchEnv, tmp_path: Path
) -> None:
    py = fresh_env(tmp_path / "env213", torch213)
    # only our index: torch 2.14 cannot be had, so pip refuses instead of installing a broken combination
    proc = pip_install(py, "--index-url", f"{server.url}/cu130-torch2.14/simple", f"flash-attn=={V214}")
    assert proc.returncode != 0
    assert "No matching distribution found for torch==2.14.* (from flash-attn)" in proc.stderr, proc.stderr
    # the user pins the torch they have: the resolver names the conflict
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch==2.13.0+cpu\n")
    proc = pip_install(
        py, "--index-url", f"{server.url}/all/simple", "-c", constraints, f"flash-attn=={V214}"
    )
    assert proc.returncode != 0
    assert "ResolutionImpossible" in proc.stderr and "conflicting dependencies" in proc.stderr, proc.stderr
    assert "depends on torch==2.14.*" in proc.stdout and "torch==2.13.0+cpu" in proc.stdout, proc.stdout
    assert run([py, "-c", "import flash_attn"], check=False).returncode != 0  # nothing was installed
    # unpinned from the combined index, pip backtracks to the wheel for the torch it has
    proc = pip_install(py, "--index-url", f"{server.url}/all/simple", "flash-attn")
    assert proc.returncode == 0, proc.stderr
    assert run([py, "-c", SMOKE]).stdout.startswith("cpu [1.0, 1.0]")


def test_doctor_and_which_explain_a_mismatch(
    server: Served, torch213: TorchEnv, wheel214: Path, tmp_path: Path
) -> None:
    py = fresh_env(tmp_path / "forced", torch213)
    # forced past pip's check, the upstream failure mode: doctor must say why
    assert pip_install(py, "--no-deps", wheel214).returncode == 0
    doctor = cli("doctor", "--python", py, check=False)
    assert doctor.returncode == 5, doctor
    assert "fail torch requirement: wheel requires torch==2.14.*, installed 2.13.0+cpu" in doctor.stdout
    assert "fail accelerator: built with cuda13.0, torch here is a CPU-only build" in doctor.stdout
    assert re.search(
        r"fail import flash_attn_2_cuda: ImportError: .*(libc10_cuda|undefined symbol)", doctor.stdout
    )
    which = cli("which", "--index-url", server.url, "--python", py, check=False)
    assert which.returncode == 3 and which.stdout == ""
    # the 2.13 wheel is nearest (only the accelerator differs); the 2.14 one also fails on torch
    assert f"nearest: flash_attn-{V213}-" in which.stderr
    assert "accelerator: wheel is cu130, torch 2.13.0+cpu is a CPU-only build" in which.stderr
    assert (
        "  torch: 1 wheel(s) rejected" in which.stderr
        and "  accelerator: 2 wheel(s) rejected" in which.stderr
    )
    assert "install a CUDA or ROCm build of torch" in which.stderr


# ---------------------------------------------------------------- publish rules and atomicity


def test_republish_same_bytes_is_noop_other_bytes_refused(
    published: Path, wheel214: Path, tmp_path: Path
) -> None:
    index = published / "wheels" / "index"
    before = tree_digest(index)
    again = cli("publish", "--to", "local", cwd=published)
    assert again.stderr.count("unchanged ") == 2 and "nothing new" in again.stderr
    assert tree_digest(index) == before
    # same file name, other bytes (finalized with another SOURCE_DATE_EPOCH)
    other = copy_wheel(wheel214, tmp_path / "other")
    cli("wheels", "finalize", other, env=dict(os.environ, SOURCE_DATE_EPOCH="1700000100"))
    assert other.read_bytes() != wheel214.read_bytes()
    refused = cli("publish", "--to", "local", other, cwd=published, check=False)
    assert refused.returncode == 7, refused
    assert "already published with other bytes" in refused.stderr
    assert tree_digest(index) == before


def test_failed_publish_leaves_the_old_index_byte_identical(
    wheel214: Path, wheel213: Path, tmp_path: Path
) -> None:
    project = make_project(tmp_path / "proj", wheel214)
    cli("publish", "--to", "local", cwd=project)
    index = project / "wheels" / "index"
    before = tree_digest(index)
    gens_before = sorted(p.name for p in (project / "wheels").iterdir())
    # a real bad input: a truncated wheel whose manifest matches its (broken) bytes, so it passes the
    # manifest checks; its signed provenance (checked before the archive is opened) refuses it
    bad_dir = tmp_path / "bad"
    bad = copy_wheel(wheel213, bad_dir)
    copy_wheel(wheel214, bad_dir / "more")  # an unchanged file in the same run
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    data = json.loads(bad.with_name(bad.name + ".manifest.json").read_text())
    data.update(sha256=sha256(bad.read_bytes()), size=bad.stat().st_size)
    bad.with_name(bad.name + ".manifest.json").write_text(json.dumps(data))
    proc = cli("publish", "--to", "local", bad_dir, cwd=project, check=False)
    assert proc.returncode == 7, proc
    assert "the wheel's bytes changed after it was signed" in proc.stderr
    assert tree_digest(index) == before
    assert sorted(p.name for p in (project / "wheels").iterdir()) == gens_before  # no half-written tree left


def test_concurrent_publishes_both_land(wheel214: Path, wheel213: Path, tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj")
    a = copy_wheel(wheel214, tmp_path / "a")
    b = copy_wheel(wheel213, tmp_path / "b")
    exe = Path(sys.executable).parent / "attnforge"
    procs = [
        subprocess.Popen(
            [exe, "publish", "--to", "local", src], cwd=project, stderr=subprocess.PIPE, text=True
        )
        for src in (a.parent, b.parent)
    ]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    assert [rc for rc, _ in results] == [0, 0], results
    index = project / "wheels" / "index"
    marker = json.loads((index / "attnforge-index.json").read_text())
    assert sorted(marker["files"]) == sorted([a.name, b.name])
    page = json.loads((index / "all" / "simple" / "flash-attn" / "index.json").read_text())
    assert sorted(f["filename"] for f in page["files"]) == sorted([a.name, b.name])
    for wheel in (a, b):
        variant = json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text())["variant"]
        files = index / variant / "simple" / "flash-attn"
        assert sha256((files / wheel.name).read_bytes()) == sha256(wheel.read_bytes())


# ---------------------------------------------------------------- runner smoke from the index


def test_runner_smoke_installs_from_the_served_index(server: Served, torch213: TorchEnv) -> None:
    """`runner check --smoke-index` path for real: a fresh venv over the machine's torch gets flash-attn from
    our served index. The wheel is wheelfactory's stand-in (a real compiled extension, but no
    flash_attn_func), so the run ends at that import, inside the smoke venv, with the wheel's torch pin."""
    from attnforge.runner.gpu_smoke import run_smoke
    from attnforge.runner.host import SystemHost

    res = run_smoke(
        SystemHost(),
        str(torch213.python),
        index_url=f"{server.url}/cu130-torch2.13/simple",
        base_site=[str(torch213.site_packages)],
    )
    assert res.ran and res.failed == 1 and res.source.endswith("/cu130-torch2.13/simple"), res.detail
    assert "cannot import name 'flash_attn_func'" in res.detail and "attnforge-smoke-" in res.detail
    assert res.output.get("torch_requirement") == "torch==2.13.*" and "torch here 2.13.0" in res.detail
    assert re.search(r"GET /cu130-torch2.13/simple/flash-attn/ .* 200", server.text())
