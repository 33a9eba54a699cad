"""matmul_form: the builder's primitive matmul is recognised, with factors that reproduce it; near misses are not."""

from __future__ import annotations

import numpy as np
import pytest

from egraft.ir import Graph, GraphBuilder, evaluate
from egraft.ir.matmul_form import MatmulForm, matmul_form

from ir_testlib import rand


def _reduce_node(g) -> int:
    (i,) = [i for i, n in enumerate(g.nodes) if n.op == "SumReduce"]
    return i


def _strided(src: np.ndarray, view) -> np.ndarray:
    shape, strides, offset = view
    flat = src.reshape(-1)
    idx = np.full(shape, offset, dtype=np.int64)
    for d, (n, st) in enumerate(zip(shape, strides)):
        idx = idx + st * np.arange(n).reshape([n if e == d else 1 for e in range(len(shape))])
    return flat[idx]


def _factor_values(form: MatmulForm, f, vals) -> np.ndarray:
    """The factor over the whole product shape, rebuilt from what the form says it reads."""
    x = vals[f.src] if f.view is None else _strided(vals[f.src], f.view)
    keep = [form.shape[d] if d in f.axes else 1 for d in range(len(form.shape))]
    return np.broadcast_to(x.reshape(keep), form.shape)


def _all_values(g, inputs):
    """Every node's value (each node made an output)."""
    full = Graph(g.nodes, list(range(len(g.nodes))), g.input_ids, g.weights)
    return evaluate(full, inputs, dtype=np.float64)


LAYOUTS = [  # (a shape, b shape, transposed b): batch / broadcast layouts of the builder's matmul
    ((5, 7), (7, 3), False),
    ((2, 5, 7), (2, 7, 3), False),
    ((2, 5, 7), (7, 3), False),
    ((4, 1, 5, 7), (3, 7, 2), False),
    ((7,), (7, 3), False),
    ((5, 7), (7,), False),
    ((3, 4, 7), (6, 7), True),  # x @ w.T, a Linear layer
]


@pytest.mark.parametrize("a_shape,b_shape,transposed", LAYOUTS)
def test_builder_matmul_is_recognised(a_shape, b_shape, transposed, rng):
    b = GraphBuilder()
    a = b.input("a", a_shape, "float32")
    c = b.input("c", b_shape, "float32")
    out = a @ (c.T if transposed else c)
    g = b.build([out])
    nid = _reduce_node(g)
    form = matmul_form(g, nid)
    assert form is not None and form.node == nid and form.K == 7
    assert {g.nodes[form.lhs.src].attrs["name"], g.nodes[form.rhs.src].attrs["name"]} == {"a", "c"}
    assert g.nodes[form.lhs.src].attrs["name"] == "a"  # the builder writes a's factor first
    assert form.lhs.broadcast or form.rhs.broadcast
    # product [..., M, K, N]: M varies in a alone, N in c alone (a batch dim only one operand has counts as that operand's)
    m, n = form.k - 1, form.k + 1
    assert form.k == len(form.shape) - 2 and n not in form.m_axes and m not in form.n_axes
    assert (m in form.m_axes) == (form.shape[m] > 1) and (n in form.n_axes) == (form.shape[n] > 1)
    assert form.oriented(m, n) is form and form.swapped().oriented(m, n) == form
    # what the form says each factor reads reproduces the product's sum
    xs = [rand(a_shape, "float32", rng), rand(b_shape, "float32", rng)]
    vals = _all_values(g, xs)
    prod = _factor_values(form, form.lhs, vals) * _factor_values(form, form.rhs, vals)
    np.testing.assert_allclose(prod.sum(form.k), vals[nid], rtol=1e-12, atol=1e-12)


def test_factors_through_casts_and_scales_are_invariant():
    """A cast or scale of a broadcast operand is still constant along the broadcast axis."""
    b = GraphBuilder()
    a = b.input("a", (4, 6), "float16")
    w = b.input("w", (6, 5), "float16")
    g = b.build([a @ w])  # half operands are cast to float32 after the expand views
    form = matmul_form(g, _reduce_node(g))
    assert form is not None and form.K == 6
    assert form.m_axes == (0,) and form.n_axes == (2,) and form.batch_axes == ()


def test_swapped_factors_are_oriented():
    b = GraphBuilder()
    a = b.input("a", (4, 6), "float32")
    c = b.input("c", (6, 5), "float32")
    a3, c3 = a.unsqueeze(-1).expand((4, 6, 5)), c.unsqueeze(0).expand((4, 6, 5))
    g = b.build([(c3 * a3).sum(1)])
    form = matmul_form(g, _reduce_node(g))
    assert form is not None and g.nodes[form.lhs.src].attrs["name"] == "c"
    o = form.oriented(0, 2)
    assert o is not None and g.nodes[o.lhs.src].attrs["name"] == "a" and o.m_axes == (0,) and o.n_axes == (2,)


def _near_misses():
    def reduce_over_n(b):  # the builder's product, summed over N: a is broadcast along the reduce axis
        a, c = b.input("a", (4, 6), "float32"), b.input("c", (6, 5), "float32")
        return (a.unsqueeze(-1).expand((4, 6, 5)) * c.unsqueeze(0).expand((4, 6, 5))).sum(2)

    def reduce_over_m(b):
        a, c = b.input("a", (4, 6), "float32"), b.input("c", (6, 5), "float32")
        return (a.unsqueeze(-1).expand((4, 6, 5)) * c.unsqueeze(0).expand((4, 6, 5))).sum(0)

    def row_scaled_sum(b):  # x * (a column of x, broadcast along the reduce axis)
        x = b.input("x", (4, 6), "float32")
        return (x * x.slice(1, 0, 1).expand((4, 6))).sum(1)

    def add_not_mul(b):
        a, c = b.input("a", (4, 6), "float32"), b.input("c", (6, 5), "float32")
        return (a.unsqueeze(-1).expand((4, 6, 5)) + c.unsqueeze(0).expand((4, 6, 5))).sum(1)

    return [reduce_over_n, reduce_over_m, row_scaled_sum, add_not_mul]


@pytest.mark.parametrize("make", _near_misses(), ids=lambda f: f.__name__)
def test_near_misses_are_rejected(make):
    b = GraphBuilder()
    g = b.build([make(b)])
    assert matmul_form(g, _reduce_node(g)) is None


def test_other_nodes_are_not_contractions():
    b = GraphBuilder()
    a, c = b.input("a", (4, 6), "float32"), b.input("c", (6, 5), "float32")
    g = b.build([(a.unsqueeze(-1).expand((4, 6, 5)) * c.unsqueeze(0).expand((4, 6, 5))).max(1), a @ c])
    assert all(matmul_form(g, i) is None for i, n in enumerate(g.nodes) if n.op != "SumReduce")


def test_unbroadcast_product_sum_is_no_matrix_product():
    """An elementwise product summed is a contraction with only batch axes: no M/N to orient."""
    b = GraphBuilder()
    x, y = b.input("x", (2, 4, 6), "float32"), b.input("y", (2, 4, 6), "float32")
    g = b.build([(x * y).sum(2)])
    form = matmul_form(g, _reduce_node(g))
    assert form is not None and not (form.lhs.broadcast or form.rhs.broadcast)
    assert form.batch_axes == (0, 1) and form.m_axes == form.n_axes == ()
    assert form.oriented(0, 1) is None
