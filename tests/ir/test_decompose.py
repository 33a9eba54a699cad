"""decompose: every idiom node rewritten into primitives computes what the idiom node computes."""

from __future__ import annotations

import numpy as np
import pytest

from egraft.ir import IDIOMS, GraphBuilder, evaluate
from egraft.ir.decompose import DECOMPOSITIONS, decompose
from egraft.testing import rel_err

from ir_testlib import rand

# idiom -> (input shapes, attrs): batch dims, a non-last axis and a bias among them
CASES = {
    "MatMul": [([(2, 3, 5), (2, 5, 4)], {}), ([(1, 1), (1, 1)], {})],
    "Softmax": [([(3, 5)], {"axis": 1}), ([(2, 3, 4)], {"axis": 1})],
    "LayerNorm": [([(3, 5)], {"axis": 1, "eps": 1e-5}), ([(2, 3, 4)], {"axis": 0, "eps": 1e-3})],
    "RMSNorm": [([(3, 5)], {"axis": 1, "eps": 1e-6}), ([(4, 3)], {"axis": 0, "eps": 1e-2})],
    "Attention": [([(2, 5, 8), (2, 6, 8), (2, 6, 3)], {"scale": 0.3, "causal": False}),
                  ([(2, 5, 4), (2, 7, 4), (2, 7, 4), (2, 5, 7)], {"scale": 0.5, "causal": True})],
}


def _nonzero(shape, dtype, rng):
    x = rand(shape, dtype, rng)
    return np.where(x == 0, np.asarray(0.5, x.dtype), x)


def _graph(op, shapes, attrs, dtype, rng):
    """A graph with the idiom between other ops: a weight operand, a view on the way in, an Add after."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", s, dtype) for i, s in enumerate(shapes[1:], start=1)]
    s0 = shapes[0]
    w = b.weight("w0", _nonzero(s0[:-2] + (s0[-1], s0[-2]), dtype, rng)).T  # first operand: a transposed weight
    y = b.add(op, [w, *xs], **attrs)
    return b.build([y + 1.0, (w * w).sum()])  # a positive sum: no cancellation to blur float32


def test_every_idiom_has_a_case():
    assert set(CASES) == set(IDIOMS) == set(DECOMPOSITIONS)


@pytest.mark.parametrize("op", sorted(CASES))
def test_decomposed_graph_matches_idiom(op, rng):
    for shapes, attrs in CASES[op]:
        g = _graph(op, shapes, attrs, "float32", rng)
        d = decompose(g)
        assert g.op_counts()[op] == 1 and not any(n.op in IDIOMS for n in d.nodes)
        assert d.input_types() == g.input_types() and d.output_types() == g.output_types()
        assert d.weight_names() == g.weight_names()
        xs = [_nonzero(s, "float32", rng) for s in shapes[1:]]
        want = evaluate(g, xs, dtype=np.float64)
        got = evaluate(d, xs, dtype=np.float64)
        for a, e in zip(got, want):
            assert a.dtype == np.float64 and rel_err(a, e) <= 1e-9, f"{op} {shapes} float64; {rng.tag}"
        for a, e in zip(evaluate(d, xs), want):
            assert a.dtype == np.float32 and rel_err(a, e) <= 1e-5, f"{op} {shapes} float32; {rng.tag}"


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_decomposed_half_idioms_keep_their_dtype(dt, rng):
    shapes, attrs = CASES["Softmax"][0]
    g = _graph("Softmax", shapes, attrs, dt, rng)
    d = decompose(g)
    assert d.output_types() == g.output_types()
    (want, _), (got, _) = evaluate(g, []), evaluate(d, [])
    assert str(got.dtype) == dt and rel_err(got, want) <= 1e-2, rng.tag


def test_which_selects_nodes():
    b = GraphBuilder()
    x = b.input("x", (3, 8), "float32")
    y = b.add("Softmax", (b.add("LayerNorm", (x,), axis=1, eps=1e-5),), axis=0)
    g = b.build([y])
    assert decompose(g, ()) is g  # nothing chosen: the graph itself
    assert decompose(g, lambda graph, i: False) is g
    only_ln = decompose(g, {"LayerNorm"})
    assert only_ln.op_counts()["Softmax"] == 1 and "LayerNorm" not in only_ln.op_counts()
    by_axis = decompose(g, lambda graph, i: graph.nodes[i].attrs["axis"] == 0)
    assert by_axis.op_counts()["LayerNorm"] == 1 and "Softmax" not in by_axis.op_counts()
    assert not any(n.op in IDIOMS for n in decompose(g).nodes)
