"""`attnforge cache du|prune` on real cache folders: sizes, owners, LRU order, dry runs, locks, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from attnforge.builder.spec import BuildSpec, Source
from attnforge.cache.build_lock import build_lock
from attnforge.cache.scan import scan
from attnforge.cache.units import format_size, parse_duration, parse_size
from attnforge.core.errors import ConfigurationError

Run = Callable[..., tuple[int, str, str]]
DAY = 86400.0
KEY = "abcd1234abcd1234"


def _write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def _age(path: Path, days: float) -> None:
    """Date a file or a whole tree `days` ago (mtime; the scan reads no access times)."""
    when = time.time() - days * DAY
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (when, when))


def _spec(cache: Path, cp: str, cell: str, venv: str, days: float) -> None:
    """A cell's build folder as the engine leaves it: a build tree and spec.json naming what it used."""
    workdir = cache / "cells" / KEY / cp
    _write(workdir / "tree" / "build" / "flash_api.o", 50_000)
    spec = BuildSpec(
        cell_id=cell,
        kernel="flash-attn",
        kernel_version="2.8.3",
        python="3.11",
        torch="2.14.1",
        source=Source(str(cache / "sources" / "flash_attn-2.8.3.tar.gz"), "0" * 64),
        kernel_set_key=KEY,
        build_dir=str(workdir / "tree"),
        output_dir=str(workdir / "out"),
        venv_dir=str(cache / "venvs" / venv),
        kernel_objects_dir=str(cache / "cells" / KEY / "objects"),
        ccache_dir=str(cache / "ccache"),
    )
    (workdir / "spec.json").write_text(spec.dumps())
    _age(workdir, days)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """Two cells of one kernel-set (cp311 built 10 days ago, cp312 2 days ago) plus an unused venv."""
    c = tmp_path / "cache"
    _write(c / "sources" / "flash_attn-2.8.3.tar.gz", 100_000)
    _write(c / "venvs" / "cp311-torch2.14.1-cu130" / "lib" / "torch.so", 300_000)
    (c / "venvs" / "cp311-torch2.14.1-cu130.lock").touch()
    _write(c / "venvs" / "cp312-torch2.14.1-cu130" / "lib" / "torch.so", 300_000)
    _write(c / "venvs" / "cp310-torch2.8.0-cu128" / "lib" / "torch.so", 300_000)
    _write(c / "cells" / KEY / "objects" / "flash_fwd.o", 200_000)
    (c / "cells" / KEY / "objects" / "manifest.json").write_text(json.dumps({"created_by": "cell-311"}))
    (c / "job_memory.json").write_text("{}")
    for p in c.rglob("*"):
        _age(p, 30)  # everything's own files are old; the specs below say what was used since
    _age(c / "venvs" / "cp310-torch2.8.0-cu128", 20)
    _spec(c, "cp311", "cell-311", "cp311-torch2.14.1-cu130", 10)
    _spec(c, "cp312", "cell-312", "cp312-torch2.14.1-cu130", 2)
    return c


@pytest.fixture
def output(tmp_path: Path) -> Path:
    out = tmp_path / "wheels"
    _age(_write(out / "logs" / "cell-311.log", 4_000), 10)
    _write(out / ".staging-abcd-cp311" / "x.whl", 4_000)
    _age(out / ".staging-abcd-cp311", 40)
    return out


def _du(run_cli: Run, cache: Path, output: Path) -> dict[str, object]:
    code, out, err = run_cli("cache", "du", "--cache-dir", str(cache), "--output-dir", str(output), "--json")
    assert code == 0, err
    data: dict[str, object] = json.loads(out)
    return data


def _entries(data: dict[str, object]) -> dict[str, dict[str, object]]:
    rows = data["entries"]
    assert isinstance(rows, list)
    return {
        Path(str(e["path"])).name if e["kind"] != "build-tree" else f"tree-{Path(e['path']).name}": e
        for e in rows
    }


def _names(tmp: Path) -> set[str]:
    return {p.relative_to(tmp).as_posix() for p in tmp.rglob("*")}


def test_du_kinds_sizes_owners(run_cli: Run, cache: Path, output: Path) -> None:
    data = _du(run_cli, cache, output)
    e = _entries(data)
    assert {k: v["kind"] for k, v in e.items()} == {
        "flash_attn-2.8.3.tar.gz": "source",
        "cp310-torch2.8.0-cu128": "venv",
        "cp311-torch2.14.1-cu130": "venv",
        "cp312-torch2.14.1-cu130": "venv",
        "tree-cp311": "build-tree",
        "tree-cp312": "build-tree",
        "objects": "objects",
        "job_memory.json": "state",
        "cell-311.log": "log",
        ".staging-abcd-cp311": "staging",
    }
    assert e["objects"]["kernel_set"] == KEY and e["objects"]["cells"] == ["cell-311", "cell-312"]
    assert e["cp311-torch2.14.1-cu130"]["cells"] == ["cell-311"]
    assert e["flash_attn-2.8.3.tar.gz"]["cells"] == ["cell-311", "cell-312"]
    assert e["tree-cp312"]["cells"] == ["cell-312"] and e["cp310-torch2.8.0-cu128"]["cells"] == []
    assert e["job_memory.json"]["prunable"] is False
    # a venv's size is its files' blocks (and its lock file), at least the bytes written
    assert int(str(e["cp311-torch2.14.1-cu130"]["bytes"])) >= 300_000
    # last use: a spec naming the entry counts (the sdist's own file is 30 days old)
    assert 1.9 * DAY < float(str(e["flash_attn-2.8.3.tar.gz"]["age_s"])) < 2.1 * DAY
    assert 19.9 * DAY < float(str(e["cp310-torch2.8.0-cu128"]["age_s"])) < 20.1 * DAY
    assert data["total_bytes"] == sum(int(str(v["bytes"])) for v in e.values())
    assert data["build_running"] is False


def test_du_table(run_cli: Run, cache: Path, output: Path) -> None:
    code, out, _ = run_cli("cache", "du", "--cache-dir", str(cache), "--output-dir", str(output))
    assert code == 0
    for text in (
        "venvs/cp311-torch2.14.1-cu130",
        "build-tree",
        "objects",
        "kernel-set " + KEY,
        "by kind",
        "total",
    ):
        assert text in out


def test_prune_max_size_removes_least_recently_used_first(run_cli: Run, cache: Path, output: Path) -> None:
    entries = {e.path.name: e for e in scan(cache, output)}
    total = sum(e.size for e in entries.values())
    # by last use: staging (40 d), cp310 venv (20 d), then cp311's tree, venv and log (10 d), ...
    staging, old_venv = entries[".staging-abcd-cp311"], entries["cp310-torch2.8.0-cu128"]
    limit = total - staging.size - old_venv.size
    code, out, err = run_cli(
        "cache", "prune", "--cache-dir", str(cache), "--output-dir", str(output), "--max-size", str(limit)
    )
    assert code == 0, err
    assert not staging.path.exists() and not old_venv.path.exists()
    assert (cache / "venvs" / "cp311-torch2.14.1-cu130").is_dir()  # next in line, but the total fits now
    assert out.index(".staging-abcd-cp311") < out.index("cp310-torch2.8.0-cu128")  # oldest first

    # the three entries last used 10 days ago go next; the 2-day-old ones stay
    next_three = [entries["cp311"], entries["cp311-torch2.14.1-cu130"], entries["cell-311.log"]]
    limit -= sum(e.size for e in next_three)
    code, out, _ = run_cli(
        "cache", "prune", "--cache-dir", str(cache), "--output-dir", str(output), "--max-size", str(limit)
    )
    assert code == 0
    gone = [
        line.split()[-1] for line in out.splitlines() if line.startswith("removed ") and " unused " in line
    ]
    assert {Path(p).name for p in gone} == {"cp311", "cp311-torch2.14.1-cu130", "cell-311.log"}
    assert not (cache / "venvs" / "cp311-torch2.14.1-cu130.lock").exists()  # removed with its venv
    assert (cache / "cells" / KEY / "cp312").is_dir() and (cache / "sources").is_dir()


def test_prune_dry_run_removes_nothing(run_cli: Run, cache: Path, output: Path, tmp_path: Path) -> None:
    before = _names(tmp_path)
    code, out, _ = run_cli(
        "cache",
        "prune",
        "--cache-dir",
        str(cache),
        "--output-dir",
        str(output),
        "--max-size",
        "0",
        "--dry-run",
    )
    assert code == 0
    assert _names(tmp_path) == before
    listed = [line for line in out.splitlines() if line.startswith("would remove ")]
    assert len(listed) == 9  # everything but job_memory.json
    assert "dry run: would remove 9 entries" in out
    assert "job_memory.json" not in out


def test_prune_older_than(run_cli: Run, cache: Path, output: Path) -> None:
    code, _, _ = run_cli(
        "cache", "prune", "--cache-dir", str(cache), "--output-dir", str(output), "--older-than", "1w"
    )
    assert code == 0
    assert sorted(p.name for p in (cache / "venvs").iterdir()) == ["cp312-torch2.14.1-cu130"]
    assert sorted(p.name for p in (cache / "cells" / KEY).iterdir()) == ["cp312", "objects"]
    assert not (output / ".staging-abcd-cp311").exists() and not (output / "logs" / "cell-311.log").exists()
    assert (cache / "job_memory.json").is_file()


def test_the_test_suites_cache_is_listed_and_pruned(run_cli: Run, cache: Path, output: Path) -> None:
    _age(_write(cache / "tests" / "venv-torch2.14.1" / "lib" / "torch.so", 80_000).parents[1], 40)
    _age(_write(cache / "tests" / "wheels" / "x.whl", 20_000).parent, 1)
    e = _entries(_du(run_cli, cache, output))
    assert e["venv-torch2.14.1"]["kind"] == "test" and e["venv-torch2.14.1"]["prunable"] is True
    assert e["wheels"]["kind"] == "test"
    code, _, _ = run_cli(
        "cache", "prune", "--cache-dir", str(cache), "--output-dir", str(output), "--older-than", "30d"
    )
    assert code == 0
    assert sorted(p.name for p in (cache / "tests").iterdir()) == ["wheels"]


def test_prune_removes_an_emptied_kernel_set(run_cli: Run, cache: Path, output: Path) -> None:
    code, _, _ = run_cli(
        "cache", "prune", "--cache-dir", str(cache), "--output-dir", str(output), "--max-size", "0"
    )
    assert code == 0
    left = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*"))
    assert left == [".build.lock", "cells", "job_memory.json", "sources", "venvs"]


@pytest.fixture
def running_builder(cache: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line is a builder's (`python ... -m builder --spec <cp311's spec>`)."""
    spec = cache / "cells" / KEY / "cp311" / "spec.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "-m",
            "builder",
            "--spec",
            str(spec),
        ]
    )
    time.sleep(0.3)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_prune_keeps_what_a_running_builder_uses(
    run_cli: Run, cache: Path, output: Path, running_builder: subprocess.Popen[bytes]
) -> None:
    code, out, _ = run_cli(
        "cache", "prune", "--cache-dir", str(cache), "--output-dir", str(output), "--max-size", "0"
    )
    assert code == 0
    held = ["cells/" + KEY + "/cp311", "cells/" + KEY + "/objects", "venvs/cp311-torch2.14.1-cu130"]
    kept = [line for line in out.splitlines() if line.startswith("kept (a running build uses it): ")]
    for rel in [*held, "sources/flash_attn-2.8.3.tar.gz"]:
        assert (cache / rel).exists(), rel
        assert any(line.endswith(str(cache / rel)) for line in kept), rel
    assert (output / "logs" / "cell-311.log").exists()
    assert not (cache / "venvs" / "cp312-torch2.14.1-cu130").exists()
    assert not (cache / "cells" / KEY / "cp312").exists()


def test_prune_refuses_while_a_build_holds_the_lock(
    run_cli: Run, cache: Path, output: Path, tmp_path: Path
) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from attnforge.cache.build_lock import build_lock\n"
            "with build_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)",
            str(cache),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        before = _names(tmp_path)
        args = ("cache", "prune", "--cache-dir", str(cache), "--output-dir", str(output), "--max-size", "0")
        code, _, err = run_cli(*args)
        assert code == 5 and "a build is running" in err and "nothing was removed" in err
        assert _names(tmp_path) == before
        code, out, _ = run_cli(*args, "--dry-run")
        assert code == 0 and "a real prune would refuse now" in out
    finally:
        holder.kill()
        holder.wait()
    code, _, _ = run_cli(
        "cache", "prune", "--cache-dir", str(cache), "--output-dir", str(output), "--max-size", "0"
    )
    assert code == 0 and not (cache / "venvs" / "cp311-torch2.14.1-cu130").exists()


def test_builds_share_the_lock(tmp_path: Path) -> None:
    with build_lock(tmp_path / "c"), build_lock(tmp_path / "c"):
        assert (tmp_path / "c" / ".build.lock").is_file()


def test_an_interrupted_removal_is_finished_next_time(run_cli: Run, cache: Path, output: Path) -> None:
    trash = cache / "venvs" / "cp310-torch2.8.0-cu128.123.attnforge-trash"
    (cache / "venvs" / "cp310-torch2.8.0-cu128").rename(trash)
    code, out, _ = run_cli(
        "cache", "prune", "--cache-dir", str(cache), "--output-dir", str(output), "--max-size", "1T"
    )
    assert code == 0 and not trash.exists() and "removed 1 entry," in out


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("20G", 20 * 2**30),
        ("20GiB", 20 * 2**30),
        ("20GB", 20 * 10**9),
        ("1.5T", int(1.5 * 2**40)),
        ("512", 512),
        ("100B", 100),
        ("0", 0),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 7 * DAY), ("12h", 43200), ("1d12h", 1.5 * DAY), ("2w", 14 * DAY), ("90m", 5400)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["20Q", "-5G", "", "G", "twenty"])
def test_bad_size(text: str) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        parse_size(text)


@pytest.mark.parametrize("text", ["7", "7x", "d", "-1d", "7d3"])
def test_bad_duration(text: str) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        parse_duration(text)


def test_format_size() -> None:
    assert [format_size(n) for n in (0, 1023, 4096, 5.4 * 2**30, 43 * 2**30)] == [
        "0B",
        "1023B",
        "4.0K",
        "5.4G",
        "43G",
    ]


def test_bad_input_exit_codes(run_cli: Run, cache: Path) -> None:
    code, _, err = run_cli("cache", "prune", "--cache-dir", str(cache), "--max-size", "20Q")
    assert code == 2 and "--max-size: cannot read '20Q' as a size" in err and "20GiB" in err
    code, _, err = run_cli("cache", "prune", "--cache-dir", str(cache), "--older-than", "7")
    assert code == 2 and "--older-than: cannot read '7' as a duration" in err
    code, _, err = run_cli("cache", "prune", "--cache-dir", str(cache))
    assert code == 2 and "give --max-size and/or --older-than" in err
    assert len(list(cache.rglob("*"))) > 10  # nothing removed


def test_missing_cache_is_empty(run_cli: Run, tmp_path: Path) -> None:
    code, out, _ = run_cli(
        "cache", "du", "--cache-dir", str(tmp_path / "none"), "--output-dir", str(tmp_path / "w")
    )
    assert code == 0 and "empty" in out
    code, out, _ = run_cli(
        "cache",
        "prune",
        "--cache-dir",
        str(tmp_path / "none"),
        "--output-dir",
        str(tmp_path / "w"),
        "--max-size",
        "1G",
    )
    assert code == 0 and "removed 0 entries" in out and not (tmp_path / "none").exists()
