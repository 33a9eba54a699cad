"""The JAX artifact writer: StableHLO for cpu/cuda/tpu written here, loaded by the runtime and run on CPU."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from jax_helpers import inputs_for

from egraft.backends import lower
from egraft.backends.jax import export as jax_export
from egraft.backends.jax.export import export_executable
from egraft.errors import ArtifactError, BackendError, InputError
from egraft.ir import GraphBuilder, evaluate
from egraft.runtime import load
from egraft.testing import assert_close, fresh_seed


def _graph(seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (2, 5, 8), "float32")
    ids = b.input("ids", (2, 5), "int64")
    w1 = b.weight("w1", rng.standard_normal((8, 16)).astype(np.float32))
    w2 = b.weight("w2", rng.standard_normal((16, 8)).astype(np.float32))
    emb = b.weight("emb", rng.standard_normal((11, 8)).astype(np.float32))
    hb = b.weight("hb", rng.standard_normal((8,)).astype("bfloat16"))
    h = x + emb.index_select(0, ids)
    y = (h @ (w1 @ w2)).softmax(-1) + hb.cast("float32")  # w1 @ w2 is folded
    return b.build([y, ids.cumsum(1), y.cast("bfloat16")])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    seed = fresh_seed()
    g = _graph(seed)
    ex = lower(g, "jax", "cpu")
    d = str(tmp_path_factory.mktemp("export") / "art")
    assert export_executable(ex, d, platforms=["cpu", "cuda", "tpu"]) == d
    return seed, g, ex, d


def test_round_trip_matches(exported):
    seed, g, ex, d = exported
    assert sorted(os.listdir(d)) == ["manifest.json", "program.stablehlo", "weights.safetensors"]
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert m["target"]["platforms"] == m["kernels"][0]["platforms"] == ["cpu", "cuda", "tpu"]
    assert m["kernels"][0]["input_program_dtypes"] == ["float32", "int32"]  # int64 held as int32 without x64
    assert any(w["name"].startswith("__folded_") for w in m["weights"])
    art = load(d)
    ins = inputs_for(g, np.random.default_rng(seed), index_ranges={"ids": 11})
    got = art(*ins)
    assert [a.dtype for a in got] == [np.dtype("float32"), np.dtype("int64"), ex(*ins)[2].dtype]
    assert_close(got, ex(*ins), [d_ for _, d_ in g.output_types()], tol=0.0, what=f"reloaded vs live (seed={seed})")
    assert_close(got, evaluate(g, ins), [d_ for _, d_ in g.output_types()], what=f"reloaded vs reference (seed={seed})")
    with pytest.raises(InputError, match="shape"):
        art(ins[0][:1], ins[1])


def test_export_method_and_platform_not_exported(tmp_path):
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    ex = lower(b.build([x * 2.0]), "jax", "cpu")
    ex.export(str(tmp_path / "tpu"), platforms=["tpu"])
    with pytest.raises(ArtifactError, match="not for cpu"):
        load(str(tmp_path / "tpu"), "cpu")
    with pytest.raises(BackendError, match="cannot export for platform"):
        ex.export(str(tmp_path / "bad"), platforms=["metal"])


def test_default_platforms_fall_back_to_the_devices_own(tmp_path, monkeypatch):
    """A program that lowers for its own platform only is still saved, and the manifest says for which."""
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    ex = lower(b.build([x + 1.0]), "jax", "cpu")
    real = jax_export._serialise
    tried = []

    def only_cpu(ex_, platforms):
        tried.append(list(platforms))
        if platforms != ["cpu"]:
            raise NotImplementedError("no lowering for tpu")
        return real(ex_, platforms)

    monkeypatch.setattr(jax_export, "_serialise", only_cpu)
    from egraft.backends.artifact import save_artifact

    d = save_artifact(ex, str(tmp_path / "a"), meta={})
    assert tried == [["cpu", "cuda", "tpu"], ["cpu"]]
    assert load(d).manifest["target"]["platforms"] == ["cpu"]
    with pytest.raises(BackendError, match="jax.export failed.*no lowering for tpu"):
        save_artifact(ex, str(tmp_path / "b"), meta={}, platforms=["cpu", "tpu"])
    assert not (tmp_path / "b").exists()


def test_an_old_export_is_named(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "egraft-jax-export", "version": 1}))
    with pytest.raises(ArtifactError, match="egraft-jax-export.*older egraft.*egraft compile"):
        load(str(tmp_path))
