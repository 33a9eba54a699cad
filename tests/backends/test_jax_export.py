"""jax.export round trip: StableHLO for cpu/cuda/tpu written here, reloaded and run on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from jax_helpers import inputs_for

from egraft.backends import lower
from egraft.backends.jax.export import export_executable, load_exported
from egraft.errors import ArtifactError, InputError
from egraft.ir import GraphBuilder, evaluate
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
    d = str(tmp_path_factory.mktemp("export"))
    export_executable(ex, d, platforms=["cpu", "cuda", "tpu"])
    return seed, g, ex, d


def test_round_trip_matches(exported):
    seed, g, ex, d = exported
    assert sorted(os.listdir(d)) == ["manifest.json", "program.stablehlo", "weights.npz"]
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert m["platforms"] == ["cpu", "cuda", "tpu"]
    assert any(w["name"].startswith("__folded_") for w in m["weights"])
    prog = load_exported(d)
    ins = inputs_for(g, np.random.default_rng(seed), index_ranges={"ids": 11})
    got = prog(*ins)
    assert [a.dtype for a in got] == [np.dtype("float32"), np.dtype("int64"), ex(*ins)[2].dtype]
    assert_close(got, ex(*ins), [d_ for _, d_ in g.output_types()], tol=0.0, what=f"reloaded vs live (seed={seed})")
    assert_close(got, evaluate(g, ins), [d_ for _, d_ in g.output_types()], what=f"reloaded vs reference (seed={seed})")
    with pytest.raises(InputError, match="shape"):
        prog(ins[0][:1], ins[1])


def test_loading_imports_no_compiler(exported):
    """The loader is what the runtime builds on: no torch, egglog, deap or tracing."""
    _, _, _, d = exported
    code = (
        "import sys, numpy as np\n"
        "from egraft.backends.jax.export import load_exported\n"
        f"p = load_exported({d!r})\n"
        "p(np.ones((2, 5, 8), np.float32), np.zeros((2, 5), np.int64))\n"
        "bad = [m for m in ('torch', 'egglog', 'deap', 'egraft.frontend.tracer', 'egraft.rewrites') if m in sys.modules]\n"
        "print('LOADED', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert "LOADED []" in out.stdout, out.stdout + out.stderr


def _copy(d, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(d, dst)
    return str(dst)


def test_missing_and_corrupt_files_name_the_file(exported, tmp_path):
    _, _, _, d = exported
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        load_exported(str(tmp_path))
    c = _copy(d, tmp_path)
    with open(os.path.join(c, "program.stablehlo"), "r+b") as f:
        f.seek(40)
        f.write(b"\x00garbage\x00")
    with pytest.raises(ArtifactError, match="program.stablehlo is corrupt"):
        load_exported(c)
    # garbage whose hash the manifest vouches for still fails clearly, naming the file
    m = json.load(open(os.path.join(c, "manifest.json")))
    from egraft.backends.jax.export import _sha256
    with open(os.path.join(c, "program.stablehlo"), "wb") as f:
        f.write(b"not a flatbuffer")
    m["sha256"]["program.stablehlo"] = _sha256(os.path.join(c, "program.stablehlo"))
    json.dump(m, open(os.path.join(c, "manifest.json"), "w"))
    with pytest.raises(ArtifactError, match="program.stablehlo could not be deserialised"):
        load_exported(c)
    os.remove(os.path.join(c, "weights.npz"))
    with pytest.raises(ArtifactError, match="weights.npz is missing"):
        load_exported(c)
    with open(os.path.join(c, "manifest.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(ArtifactError, match="manifest.json is corrupt"):
        load_exported(c)


def test_platform_not_exported(tmp_path):
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    ex = lower(b.build([x * 2.0]), "jax", "cpu")
    ex.export(str(tmp_path), platforms=["tpu"])
    with pytest.raises(ArtifactError, match="not for cpu"):
        load_exported(str(tmp_path), "cpu")


def test_float64_program_round_trip(tmp_path):
    """A graph that needs 64-bit types exports and reloads under a local x64 scope."""
    seed = fresh_seed()
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float64")
    w = b.weight("w", np.random.default_rng(seed).standard_normal((4, 2)))
    g = b.build([(x @ w).softmax(-1)])
    ex = lower(g, "jax", "cpu")
    ex.export(str(tmp_path), platforms=["cpu"])
    xs = np.random.default_rng(seed).standard_normal((3, 4))
    got = load_exported(str(tmp_path))(xs)
    assert got[0].dtype == np.float64
    assert_close(got, evaluate(g, [xs]), tol=1e-12, what=f"float64 export (seed={seed})")
    import jax

    assert not jax.config.jax_enable_x64
