"""The builder's FlashAttention-3 side on the shared source snapshot: the offline and dispatch-guard patches apply
to it and really neutralise setup.py's downloads, the knobs set every FLASH_ATTENTION_DISABLE_* switch, the
source pin and its missing-archive error. No compile (docs/fa3.md says what was compiled where)."""

from __future__ import annotations

import ast
import json
import os
import tarfile
from pathlib import Path

import pytest

from attnforge.builder.exits import BuildFailure
from attnforge.builder.knobs import FA3_SWITCHES, build_env, fa3_switches
from attnforge.builder.patches import resolve_patches
from attnforge.builder.report import Reporter
from attnforge.builder.source import prepare_tree
from attnforge.builder.spec import BuildSpec, Source
from attnforge.core.errors import BuildError, ConfigurationError
from attnforge.engine.sources import fetch_source, git_snapshot
from attnforge.matrix.file import load_matrix
from attnforge.matrix.schema import SourceSpec
from attnforge.matrix.source_lock import source_path, write_lock

ROOT = Path(__file__).resolve().parents[2]
NAME = "flash-attention-3-0251105a.tar.gz"
SHA = "ce0cca1eaeeac1d1eaaa84c733a4ce9c371c7009b98b7d4aa51d188c5a364f93"
COMMIT = "0251105a2fb19d2957484b7f023cd8c115286ced"


@pytest.fixture(scope="module")
def snapshot() -> Path:
    """The pinned FA3 snapshot, found as matrix.yaml finds it (CI provides it: docs/fa3.md)."""
    folder = Path(os.environ.get("ATTNFORGE_SOURCES") or ROOT.parent / "shared" / "sources")
    path = folder / NAME
    assert path.is_file(), f"the FA3 snapshot {path} is missing: set ATTNFORGE_SOURCES to its folder"
    return path


def spec(tmp: Path, archive: Path, **kw: object) -> BuildSpec:
    base: dict[str, object] = dict(
        cell_id="c",
        kernel="flash-attn-3",
        kernel_version="3.0.0",
        source=Source(str(archive), SHA, subdir="hopper"),
        python="3.12",
        torch="2.11.0",
        build_dir=str(tmp / "b"),
        venv_dir=str(tmp / "v"),
        output_dir=str(tmp / "o"),
        arches=["sm_90a"],
        head_dims=[64, 128],
        dtypes=["bf16", "fp16"],
        disable=["appendkv", "local", "softcap", "packgqa", "cluster"],
        local_version="cu130sm90atorch2.9abi3.fa3hd64128",
    )
    base.update(kw)
    return BuildSpec(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tree(snapshot: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fa3tree")
    s = spec(tmp, snapshot)
    return prepare_tree(s, snapshot, resolve_patches(s), Reporter(tmp / "build.log"))


def _function(tree_: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree_) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_patches_apply_to_the_snapshot_and_say_so(tree: Path) -> None:
    assert tree.name == "hopper" and (tree / "setup.py").is_file()
    log = (tree.parents[3] / "build.log").read_text()
    assert "applied patch fa3-offline: setup.py downloads neutralised" in log
    assert "applied patch fa3-dispatch-guard" in log
    state = json.loads((tree.parents[2] / "attnforge-state.json").read_text())
    assert state["patches"] == ["fa3-offline", "fa3-dispatch-guard"] and state["subdir"] == "hopper"
    assert "built without hdimdiff64" in (tree / "flash_api_stable.cpp").read_text()


def test_no_git_submodule_update_and_no_prebuilt_wheel_lookup(tree: Path) -> None:
    mod = ast.parse((tree / "setup.py").read_text())
    calls = [n for n in ast.walk(mod) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    git = [
        c
        for c in calls
        if c.args
        and isinstance(c.args[0], ast.List)
        and c.args[0].elts
        and isinstance(c.args[0].elts[0], ast.Constant)
        and c.args[0].elts[0].value == "git"
    ]
    assert git == []
    run = next(n for n in ast.walk(mod) if isinstance(n, ast.ClassDef) and n.name == "CachedWheelsCommand")
    body = _function(ast.Module(body=run.body, type_ignores=[]), "run").body
    first_return = next(i for i, st in enumerate(body) if isinstance(st, ast.Return))
    fetches = [i for i, st in enumerate(body) if "urlretrieve" in ast.unparse(st)]
    assert fetches and first_return < min(fetches)  # the wheel lookup is unreachable


def test_the_toolkit_download_raises_instead_of_fetching(tree: Path) -> None:
    fn = _function(ast.parse((tree / "setup.py").read_text()), "download_and_copy")
    ns: dict[str, object] = {
        "platform": __import__("platform"),
        "CUDA_HOME": "/usr/local/cuda",
        "get_cuda_bare_metal_version": lambda home: ("", "12.6"),
    }
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "setup.py", "exec"), ns)
    url_seen: list[str] = []

    def url(system: str, arch: str, version: str) -> str:
        url_seen.append(version)
        return f"https://developer.download.nvidia.com/{version}"

    with pytest.raises(
        RuntimeError, match="attnforge offline build: .* nvcc 12.6.85 .* use CUDA 12.8 or 13.x"
    ):
        ns["download_and_copy"]("nvcc", lambda *a: "x", "bin", "12.6.85", url)  # type: ignore[operator]
    assert url_seen == ["12.6.85"]


def test_a_patch_that_no_longer_fits_fails_loudly(snapshot: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.tar.gz"
    with tarfile.open(snapshot) as src, tarfile.open(broken, "w:gz") as dst:
        for m in src.getmembers():
            f = src.extractfile(m) if m.isfile() else None
            if m.name.endswith("hopper/setup.py") and f is not None:
                data = f.read().replace(b'"git", "submodule"', b'"git", "submodules"')
                m.size = len(data)
                import io

                f = io.BytesIO(data)
            dst.addfile(m, f)
    s = spec(tmp_path, broken)
    with pytest.raises(BuildFailure, match="patch fa3-offline edit 1 .* does not apply to this source"):
        prepare_tree(s, broken, resolve_patches(s), Reporter(None))


def test_knobs_set_every_switch(tmp_path: Path) -> None:
    s = spec(tmp_path, tmp_path / "x.tar.gz")
    env = build_env(s, "/usr/bin/python3", tmp_path, 0, 16, None)
    switches = {
        k.removeprefix("FLASH_ATTENTION_DISABLE_"): v
        for k, v in env.items()
        if k.startswith("FLASH_ATTENTION_DISABLE_")
    }
    assert set(switches) == set(FA3_SWITCHES)
    on = {k for k, v in switches.items() if v == "TRUE"}
    # head dims [64, 128]: 192 is out, so its 192 x 128 variant too; 64 x 256/512 only when `disable` says so
    assert on == {
        "APPENDKV",
        "LOCAL",
        "SOFTCAP",
        "PACKGQA",
        "CLUSTER",
        "FP8",
        "HDIM96",
        "HDIM192",
        "HDIM256",
        "HDIMDIFF192",
        "SM80",
    }
    assert env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE" and env["MAX_JOBS"] == "16"
    assert env["FLASH_ATTN_LOCAL_VERSION"] == "cu130sm90atorch2.9abi3.fa3hd64128"
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0a"
    os.environ["FLASH_ATTENTION_DISABLE_BACKWARD"] = "TRUE"  # a leftover in the caller's environment
    try:
        assert (
            build_env(s, "/usr/bin/python3", tmp_path, 0, 1, None)["FLASH_ATTENTION_DISABLE_BACKWARD"]
            == "FALSE"
        )
    finally:
        del os.environ["FLASH_ATTENTION_DISABLE_BACKWARD"]
    assert "SM80" not in fa3_switches([], None, None, ["80", "90a"])


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"arches": ["sm_90"]}, r"compiles sm_90a \(always\) and sm_80 \(optional\), not sm_90"),
        ({"disable": ["dropout"]}, "no switch for dropout"),
        ({"dtypes": ["fp16"]}, "always compiles bf16"),
        ({"head_dims": [32]}, "head dims are"),
    ],
)
def test_knobs_refuse_what_fa3_cannot_build(tmp_path: Path, kw: dict[str, object], words: str) -> None:
    with pytest.raises(BuildFailure, match=words):
        build_env(spec(tmp_path, tmp_path / "x.tar.gz", **kw), "/usr/bin/python3", tmp_path, 0, 1, None)


# the path-source form of matrix.yaml's FA3 source (docs/matrix.md: a site may name its snapshot directly)
PATH_SOURCE = SourceSpec(kind="path", path=f"${{ATTNFORGE_SOURCES}}/{NAME}", sha256=SHA, subdir="hopper")


def test_source_path_expands_and_names_a_missing_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = PATH_SOURCE
    monkeypatch.setenv("ATTNFORGE_SOURCES", str(tmp_path / "nowhere"))
    with pytest.raises(
        ConfigurationError,
        match=r"source archive .*nowhere/flash-attention-3-0251105a.tar.gz does "
        r"not exist .* \(set ATTNFORGE_SOURCES to the folder that holds it\)",
    ):
        source_path("flash-attn-3", src, ROOT)
    monkeypatch.delenv("ATTNFORGE_SOURCES")
    unset = src.model_copy(update={"path": "${ATTNFORGE_NOPE}/x.tar.gz"})
    with pytest.raises(ConfigurationError, match=r"uses \$\{ATTNFORGE_NOPE\}, which is not set"):
        source_path("flash-attn-3", unset, ROOT)


def test_lock_pins_the_path_source(snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNFORGE_SOURCES", str(snapshot.parent))
    matrix = load_matrix(ROOT / "matrix.yaml")
    fa3 = matrix.kernels["flash-attn-3"].model_copy(update={"source": PATH_SOURCE})
    pinned = {"flash-attn-3": fa3}  # the FA2 sdist's pin needs the index
    lock = write_lock(matrix.model_copy(update={"kernels": pinned}), tmp_path / "attnforge.lock")
    assert lock["flash-attn-3"]["3.0.0"]["sha256"] == SHA
    assert json.loads((tmp_path / "attnforge.lock").read_text()) == lock
    changed = tmp_path / NAME
    changed.write_bytes(snapshot.read_bytes() + b"\0")
    monkeypatch.setenv("ATTNFORGE_SOURCES", str(tmp_path))
    with pytest.raises(ConfigurationError, match="pins sha256 ce0cca1eaeea… but the path source is"):
        write_lock(matrix.model_copy(update={"kernels": pinned}), tmp_path / "attnforge.lock")


def test_git_source_takes_the_pinned_snapshot_offline(
    snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """matrix.yaml's FA3 source is the upstream commit; ATTNFORGE_SOURCES supplies its snapshot (no git, no
    network), checked against the source's sha256; a wrong or unpinned snapshot is refused."""
    spec = load_matrix(ROOT / "matrix.yaml").kernels["flash-attn-3"]
    assert spec.source.kind == "git" and spec.source.ref == COMMIT and spec.source.sha256 == SHA
    monkeypatch.setenv("ATTNFORGE_SOURCES", str(snapshot.parent))
    got = fetch_source("flash-attn-3", spec, COMMIT, tmp_path / "cache", ROOT)
    assert (got.path, got.sha256, got.subdir) == (str(snapshot), SHA, "hopper")
    assert not (tmp_path / "cache").exists()  # nothing fetched or packed
    (tmp_path / NAME).write_bytes(snapshot.read_bytes() + b"\0")
    monkeypatch.setenv("ATTNFORGE_SOURCES", str(tmp_path))
    with pytest.raises(BuildError, match="no snapshot of commit 0251105a2fb1 .* matches the pinned sha256"):
        fetch_source("flash-attn-3", spec, COMMIT, tmp_path / "cache", ROOT)
    unpinned = spec.model_copy(update={"source": spec.source.model_copy(update={"sha256": None})})
    with pytest.raises(ConfigurationError, match="pins no sha256 to check it against"):
        fetch_source("flash-attn-3", unpinned, COMMIT, tmp_path / "cache", ROOT)
    assert git_snapshot("flash-attn-3", "f" * 40, SHA) is None  # another commit: the git fetch


def test_fa3_ninja_rules_are_counted(tmp_path: Path) -> None:
    from attnforge.builder.ninja import count_ninja_units

    temp = tmp_path / "build" / "temp.linux-x86_64-cpython-312"
    temp.mkdir(parents=True)
    (temp / "build.ninja").write_text(  # the rules hopper/setup.py's _write_ninja_file emits
        "build a/flash_api_stable.o: compile a/flash_api_stable.cpp\n"
        "build a/flash_fwd_hdim64_bf16_sm90.o: cuda_compile a/flash_fwd_hdim64_bf16_sm90.cu\n"
        "build a/flash_fwd_hdim64_bf16_sm80.o: cuda_compile_sm80 a/flash_fwd_hdim64_bf16_sm80.cu\n"
        "build a/flash_prepare_scheduler.o: cuda_compile_sm80_sm90 a/flash_prepare_scheduler.cu\n"
        "build x.so: link a/flash_api_stable.o\n"
    )
    assert count_ninja_units(tmp_path, "cpython-312") == 4
