"""Graph -> e-graph -> extraction of the original gives the same structural hash."""

import numpy as np
import pytest

from egraft.ir import GraphBuilder, TensorValue
from egraft.rewrites import Limits, saturate
from egraft.rewrites.codec import Context, encode_op, lit_f64, split_commands
from egraft.rewrites.schema import PRELUDE, SIGS
from egraft.testing.fuzz import random_program
from egraft.search import Space

from rewrites_testlib import model_names, traced

NO_RULES = Limits(repeated_layers=False)


def _roundtrip(g):
    res = saturate(g, rules=[], limits=NO_RULES)
    assert res.stop_reason == "saturated"
    sp = Space.from_egraph(res)
    out = sp.extract()
    assert out.structural_hash() == g.structural_hash(), f"round trip changed the graph:\n{g.dump()}\n---\n{out.dump()}"
    assert out.input_names() == g.input_names()
    assert set(out.weight_names()) == set(g.weight_names())
    return out


def test_every_op_and_literal_round_trips():
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4), "float32")
    m = b.input("mask", (2, 3, 3), "bool")
    w = b.weight("blk.0.w", np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    tc = b.tensor_constant(np.arange(4, dtype=np.float32))
    y = x @ w + tc.expand((2, 3, 4))
    y = y * float("inf") + (-0.0) + y * 0.0
    z = b.add("MatMul", (y, b.add("View", (y,), shape=(2, 4, 3), strides=(12, 1, 4), offset=0)))
    att = b.add("Attention", (y, y, y), scale=0.5, causal=True)
    attb = b.add("Attention", (y, y, y, z), scale=0.25, causal=False)
    sm = b.add("Softmax", (att,), axis=2)
    ln = b.add("LayerNorm", (attb,), axis=2, eps=1e-5)
    rn = b.add("RMSNorm", (sm,), axis=1, eps=1e-6)
    i = b.iota(4, "int32")
    g_ = (i % 3).reshape((1, 1, 4)).expand((2, 3, 4)).cast("int64")
    gat = rn.gather(2, g_)
    pos = (i * 3 + 1) % 4  # distinct positions, broadcast along the other axes (a KV-cache write)
    sct = gat.scatter(2, pos.reshape((1, 1, 4)).expand((2, 3, 4)), rn.sin())
    gat = sct.gather(2, g_)
    q = (gat.sin() + gat.exp2() + gat.log2() + gat.sqrt() + gat.recip()).max(1).sum(0)
    c = (z < 0.5) * m
    wh = type(x).where(c, z, z.cast("float64").cast("float32"))
    b16 = ln.cast("bfloat16").cast("float16")
    nib = b.input("packed", (3, 16), "int8").unpack_int4()  # Nibble
    g = b.build([q, wh, b16, (i.cast("int64") + 7).cast("bool"), nib])
    ops = {n.op for n in g.nodes}
    for s in SIGS.values():
        assert s.op in ops, f"the round-trip test misses {s.op}"
    _roundtrip(g)


def test_negative_zero_and_nonfinite_constants_stay_distinct():
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    g = b.build([(x * 0.0 + 1.0).recip(), (x * -0.0).recip(), x + float("nan")])
    out = _roundtrip(g)
    vals = {repr(n.attrs["value"]) for n in out.nodes if n.op == "Constant"}
    assert {"0.0", "-0.0", "nan"} <= vals


@pytest.mark.parametrize("seed", range(60))
def test_random_programs_round_trip(seed):
    _roundtrip(random_program(seed, 30))


@pytest.mark.parametrize("name", model_names())
def test_models_round_trip(name):
    _roundtrip(traced(name))


def test_tensor_constants_are_opaque_and_keyed_by_content():
    ctx = Context()
    a = encode_op("Constant", {"value": TensorValue(np.ones(3)), "shape": (3,), "dtype": "float64"}, [], ctx)
    b = encode_op("Constant", {"value": TensorValue(np.ones(3)), "shape": (3,), "dtype": "float64"}, [], ctx)
    c = encode_op("Constant", {"value": TensorValue(np.zeros(3)), "shape": (3,), "dtype": "float64"}, [], ctx)
    assert a == b != c and a.startswith("(Const ")


def test_literals_and_command_splitting():
    assert lit_f64(1e-5) == "1e-05" and lit_f64(2.0) == "2.0" and lit_f64(float("-inf")) == "-inf"
    cmds = split_commands('(rewrite (Add a b) (Add b a)) ; c (\n(rule ((= e (Input "a(" s d))) ((union e e)))')
    assert len(cmds) == 2
    assert "(function shape (T) IVec :no-merge)" in PRELUDE
