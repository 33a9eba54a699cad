"""Save an executable, load it with the runtime, and get the same answers: JAX and torch backends."""

from __future__ import annotations

import inspect
import json
import os

import numpy as np
import pytest
import torch
from runtime_helpers import build, flat, random_args

from egraft.backends.artifact import save_artifact
from egraft.errors import ArtifactError
from egraft.ir import dtypes
from egraft.runtime import load
from egraft.runtime.manifest import FORMAT, FORMAT_VERSION, manifest_signature
from egraft.testing import assert_close, fresh_seed

CASES = [("mlp", "jax"), ("gpt2_block", "jax"), ("dict_heads", "jax"), ("bf16_block", "jax"),
         ("mlp", "torch"), ("llama_block", "torch"), ("dict_heads", "torch"), ("bf16_block", "torch")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{b}-{n}" for n, b in CASES])
def saved(request, tmp_path_factory):
    name, backend = request.param
    return build(name, backend, str(tmp_path_factory.mktemp(f"{backend}_{name}") / "art"), seed=fresh_seed() % 1000)


def _numpy(ts) -> list[np.ndarray]:
    out = []
    for t in ts:
        t = t.detach()
        out.append(t.float().numpy().astype(dtypes.to_numpy("bfloat16")) if t.dtype == torch.bfloat16 else t.numpy())
    return out


def test_matches_the_executable_and_eager(saved):
    model, args, g, ex, d = saved
    art = load(d)
    seed = fresh_seed()
    ins = random_args(g, np.random.default_rng(seed))
    got = art.run_flat(*ins)
    out_dtypes = [dt for _, dt in g.output_types()]
    assert [a.dtype for a in got] == [dtypes.to_numpy(dt) for dt in out_dtypes]
    assert [a.shape for a in got] == [tuple(s) for s, _ in g.output_types()]
    assert_close(got, ex(*ins), out_dtypes, tol=0.0, what=f"loaded vs executable (seed={seed})")
    with torch.no_grad():
        want = flat(model(*[torch.from_numpy(np.asarray(a, np.float32)).to(t.dtype) if t.dtype == torch.bfloat16
                            else torch.from_numpy(a) for a, t in zip(ins, args)]))
    assert_close(got, _numpy(want), out_dtypes, graph=g, what=f"loaded vs eager (seed={seed})")


def test_torch_in_torch_out_in_the_model_structure(saved):
    model, args, g, ex, d = saved
    art = load(d)
    y = art(*args)
    with torch.no_grad():
        ref = model(*args)
    assert type(y) is type(ref) or (isinstance(ref, dict) and isinstance(y, dict))
    if isinstance(ref, dict):
        assert list(y) == list(ref) and y["extra"][1] is None and isinstance(y["best"], list)
    got, want = flat(y), flat(ref)
    assert all(isinstance(t, torch.Tensor) and t.dtype == w.dtype and t.shape == w.shape for t, w in zip(got, want))
    assert_close(_numpy(got), _numpy(want), [dt for _, dt in g.output_types()], graph=g, what="torch call vs eager")
    # numpy in: the same structure, numpy out
    yn = art(*[_numpy([a])[0] for a in args])
    assert all(isinstance(a, np.ndarray) for a in flat(yn) if a is not None)


def test_manifest_records_what_was_saved(saved):
    model, args, g, ex, d = saved
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert (m["format"], m["format_version"]) == (FORMAT, FORMAT_VERSION)
    assert m["target"] == {**m["target"], "device": "cpu", "backend": ex.backend}
    lib = "jax" if ex.backend == "jax" else "torch"
    assert lib in m["backend_versions"]
    assert [i["name"] for i in m["inputs"]] == g.input_names()
    assert [(tuple(o["shape"]), o["dtype"]) for o in m["outputs"]] == [(tuple(s), dt) for s, dt in g.output_types()]
    assert m["report"] == {"speedup": 1.0} and m["source"].startswith("egraft.models:")
    # the program's signature: roles, the user's names and the aliases, read back as the graph's
    assert [i["role"] for i in m["inputs"]] == ["input"] * len(g.input_ids) and m["aliases"] == []
    sig = manifest_signature(m)
    assert sig.key() == g.signature.key() and sig.aliases == g.signature.aliases == ()
    assert sig.sources() == g.signature.sources() == [p for p in inspect.signature(model.forward).parameters][
        :len(g.input_ids)]
    assert {s.name for s in sig.role("weight")} == {w["name"] for w in m["weights"]}
    listed = sorted(m["files"])
    assert listed == sorted(f for f in os.listdir(d) if f != "manifest.json")
    assert "weights.safetensors" in listed and m["kernels"][0]["file"] in listed
    names = [w["name"] for w in m["weights"]]
    assert len(names) == len(set(names)) and names
    if "bf16" in m["model"]:
        assert any(w["dtype"] == "bfloat16" for w in m["weights"])


def test_bfloat16_weights_round_trip_bit_exactly(tmp_path):
    _, _, g, ex, d = build("bf16_block", "torch", str(tmp_path / "a"))
    from egraft.runtime.manifest import read_manifest
    from egraft.runtime.weights import parse_weights

    m = read_manifest(d)
    stored = parse_weights(bytearray(open(os.path.join(d, "weights.safetensors"), "rb").read()), d)
    for name, t in ex.program.weights.items():
        a = stored[name]
        assert a.dtype == dtypes.to_numpy(dtypes.from_torch(t.dtype))
        assert a.tobytes() == np.ascontiguousarray(_numpy([t])[0]).tobytes(), name
    assert {w["name"] for w in m["weights"]} == set(ex.program.weights)


def test_jax_folded_weights_are_stored(tmp_path):
    """What the executable uses per call: a weight-only product is folded and stored as its result."""
    from egraft.backends import lower
    from egraft.ir import GraphBuilder, evaluate

    rng = np.random.default_rng(fresh_seed())
    b = GraphBuilder()
    x = b.input("x", (3, 8), "float32")
    w1 = b.weight("w1", rng.standard_normal((8, 16)).astype(np.float32))
    w2 = b.weight("w2", rng.standard_normal((16, 4)).astype(np.float32))
    g = b.build([x @ (w1 @ w2)])
    d = save_artifact(lower(g, "jax", "cpu"), str(tmp_path / "a"), meta={"model": "folded"})
    art = load(d)
    assert any(w["name"].startswith("__folded_") for w in art.manifest["weights"])
    xs = rng.standard_normal((3, 8)).astype(np.float32)
    out = art(xs)
    assert isinstance(out, list) and len(out) == 1  # no output_tree given: a list, as an Executable returns
    assert_close(out, evaluate(g, [xs]), graph=g, what="folded artifact vs reference")


def test_jax_int64_and_float64_programs(tmp_path):
    """int64 inputs held as int32 are narrowed (and range-checked) per call; a float64 program runs under x64."""
    from egraft.backends import lower
    from egraft.errors import InputError
    from egraft.ir import GraphBuilder, evaluate

    import jax

    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    ids = b.input("ids", (2, 5), "int64")
    emb = b.weight("emb", rng.standard_normal((11, 4)).astype(np.float32))
    g = b.build([emb.index_select(0, ids.reshape((10,))), ids.cumsum(1)])
    art = load(save_artifact(lower(g, "jax", "cpu"), str(tmp_path / "i"), meta={}))
    xs = rng.integers(0, 11, (2, 5))
    got = art(xs)
    assert got[1].dtype == np.int64
    assert_close(got, evaluate(g, [xs]), graph=g, what=f"int64 artifact (seed={seed})")
    with pytest.raises(InputError, match="outside the int32 range"):
        art(np.full((2, 5), 2**40, np.int64))
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float64")
    w = b.weight("w", rng.standard_normal((4, 2)))
    g = b.build([(x @ w).softmax(-1)])
    art = load(save_artifact(lower(g, "jax", "cpu"), str(tmp_path / "f"), meta={}, platforms=["cpu"]))
    assert art.manifest["target"]["platforms"] == ["cpu"]
    xs = rng.standard_normal((3, 4))
    got = art(xs)
    assert got[0].dtype == np.float64
    assert_close(got, evaluate(g, [xs]), tol=1e-12, what=f"float64 artifact (seed={seed})")
    assert not jax.config.jax_enable_x64
    with pytest.raises(ArtifactError, match="not for tpu|no tpu device"):
        load(str(tmp_path / "f"), device="tpu")


def test_overwrite_replaces_a_previous_artifact(tmp_path):
    d = str(tmp_path / "a")
    build("mlp", "jax", d, seed=1)
    first = json.load(open(os.path.join(d, "manifest.json")))["files"]
    _, args, _, ex, _ = build("mlp", "torch", d, seed=2)  # another backend, same directory
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert m["target"]["backend"] == "torch" and m["files"] != first
    assert sorted(os.listdir(d)) == ["manifest.json", "program.pt2", "weights.safetensors"]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")], "staging directories left behind"
    got = load(d)(*args)
    assert torch.equal(got, ex(*args)[0])


@pytest.mark.slow
def test_torch_inductor_mode_round_trip(tmp_path):
    """mode="inductor": the loaded program is compiled by Inductor on its first call (seconds)."""
    model, args, g, ex, d = build("gated_mlp", "torch", str(tmp_path / "a"), knobs={"mode": "inductor"})
    art = load(d)
    assert art.manifest["kernels"][0]["mode"] == "inductor"
    seed = fresh_seed()
    ins = random_args(g, np.random.default_rng(seed))
    assert_close(art.run_flat(*ins), ex(*ins), graph=g, what=f"inductor artifact vs executable (seed={seed})")
    assert art.runner.compiled and art.runner._fn is not art.runner.module  # compiled, not the plain module


def test_a_failed_replacement_puts_the_old_artifact_back(tmp_path, monkeypatch):
    """Every artifact writer (a program's, a generation's) ends in backends.artifact.commit_staged: when the
    staged directory cannot be moved into place, the artifact that was there is restored, not left aside."""
    from egraft.backends.artifact import commit_staged

    old, stage = tmp_path / "art", tmp_path / ".stage"
    old.mkdir()
    (old / "manifest.json").write_text("old")
    stage.mkdir()
    (stage / "manifest.json").write_text("new")
    real = os.rename

    def failing(src, dst):
        if str(src) == str(stage):
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError, match="disk full"):
        commit_staged(str(stage), str(old))
    assert (old / "manifest.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".stage", "art"], "the old artifact was left aside"
    monkeypatch.setattr(os, "rename", real)
    commit_staged(str(stage), str(old))
    assert (old / "manifest.json").read_text() == "new" and not stage.exists()
