"""`which --head-dim D --dtype T --backward`: the wheel of any profile whose manifest has the kernels a call
needs (what a narrower wheel's RuntimeError tells the user to ask), else why none has them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.cli import main
from attnforge.client.kernel_needs import Needs, kernel_dim
from attnforge.client.which import resolve
from attnforge.engine.environment import Env
from attnforge.publish.index import StaticIndex
from tests.unit.test_client_interpreter import bundle, make_venv, probe_data

V = "2.8.3+cu130torch2.14cxx11abiTRUE"
FWD_FLAGS = ["-DFLASHATTENTION_DISABLE_BACKWARD", "-DFLASHATTENTION_DISABLE_DROPOUT"]


def publish(root: Path, *profiles: str, manifest: bool = True) -> Path:
    """An index of torch 2.14 wheels in the given profiles (full, hd128: head dim 128, fwd128: 128 bf16
    forward only), each with a manifest recording its profile unless `manifest` is False."""
    bundles = []
    for p in profiles:
        b = bundle(root / "in", "cu130torch2.14cxx11abiTRUE" + ("" if p == "full" else f".{p}"))
        inputs = b.manifest["inputs"]
        if p in ("hd128", "fwd128"):
            inputs.update(profile=p, head_dims=[128])
        if p == "fwd128":
            inputs.update(dtypes=["bf16"], profile_flags=FWD_FLAGS)
        bundles.append(b)
    StaticIndex(root / "index").publish(bundles)
    if not manifest:
        for m in (root / "index").rglob("*.manifest.json"):
            m.unlink()
    return root / "index"


@pytest.fixture(scope="module")
def env() -> Env:
    return Env.from_probe(probe_data("2.14.1+cu130"))


def chosen(index: Path, env: Env, needs: Needs) -> str | None:
    res = resolve(env, str(index), needs=needs)
    return res.choice.version if res.choice else None


def test_any_profile_with_the_kernels_fits(tmp_path: Path, env: Env) -> None:
    index = publish(tmp_path, "full", "hd128", "fwd128")
    assert chosen(index, env, Needs(head_dim=64)) == V  # only the full profile has head dim 64
    assert chosen(index, env, Needs(head_dim=100, dtype="fp16")) in (V, f"{V}.hd128")  # the 128 kernel, fp16
    assert chosen(index, env, Needs(dtype="bf16", backward=True)) != f"{V}.fwd128"
    assert chosen(index, env, Needs(head_dim=128, dtype="bf16")) is not None
    # without needs the full profile is the default, as before
    assert chosen(index, env, Needs()) == V


def test_no_profile_with_the_kernels_says_what_each_has(tmp_path: Path, env: Env) -> None:
    index = publish(tmp_path, "hd128", "fwd128")
    res = resolve(env, str(index), needs=Needs(head_dim=64, backward=True))
    text = "\n".join(res.explanation)
    assert res.choice is None
    assert "kernels needed: head dim 64, backward kernels (any profile that has them)" in text
    assert (
        "  profile: wheel is profile fwd128: head dims [128], not 64; no backward kernels" in text
    )  # nearest
    rejected = res.to_json()["rejected"]
    assert {why["profile"] for why in rejected.values()} == {
        "wheel is profile hd128: head dims [128], not 64",
        "wheel is profile fwd128: head dims [128], not 64; no backward kernels",
    }
    assert "--profile" not in text  # no --profile advice: no profile has the kernels
    assert kernel_dim("flash-attn", 300) is None
    assert "no flash-attn kernel runs head dim 300" in str(Needs(head_dim=300).problem({"inputs": {}}, None))


def test_a_lean_wheel_without_a_manifest_is_not_guessed(tmp_path: Path, env: Env) -> None:
    index = publish(tmp_path, "full", "hd128", manifest=False)
    res = resolve(env, str(index), needs=Needs(head_dim=128))
    assert res.choice is not None and res.choice.version == V
    hd128 = next(c for c in res.candidates if c.version.endswith(".hd128"))
    assert hd128.problems == [
        ("profile", "wheel is profile hd128, whose kernels are unknown (no manifest beside it)")
    ]


def test_the_options_reach_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    index = publish(tmp_path, "full", "fwd128")
    user = make_venv(tmp_path / "user", "2.14.1+cu130", "13.0")
    monkeypatch.delenv("ATTNFORGE_INDEX_URL", raising=False)
    args = ["which", "--python", str(user), "--index-url", str(index)]
    assert main([*args, "--profile", "fwd128", "--dtype", "fp16", "--json"]) == 3  # that profile has no fp16
    rejected = json.loads(capsys.readouterr().out)["rejected"]
    assert rejected[next(f for f in rejected if ".fwd128-" in f)] == {
        "profile": "wheel is profile fwd128: dtypes [bf16], not fp16"
    }
    assert main([*args, "--dtype", "fp16"]) == 0
    assert capsys.readouterr().out.startswith(f"pip install flash-attn=={V} ")
    assert main([*args, "--head-dim", "0"]) == 2  # click's range check
