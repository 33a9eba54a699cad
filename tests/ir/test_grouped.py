"""split_grouped_products: a product over a repeated operand (grouped-query attention) split so the repeat is a
broadcast; the same function on random inputs, one strided view per factor after it, and no change without it."""

from __future__ import annotations

import numpy as np
import pytest

from egraft.ir import GraphBuilder, Op, evaluate
from egraft.ir.grouped import split_grouped_products
from egraft.ir.matmul_form import matmul_form
from egraft.testing import fresh_seed, rel_err


def _attention(b, kv, rep, t, s, d, grouped=True):
    """q k^T and (q k^T) v over keys and values repeated `rep` times per kv head (transformers' repeat_kv),
    written in primitives as the torch lowering writes them; `grouped=False`: kv * rep distinct heads."""
    g = GraphBuilder()
    h = kv * rep
    q = g.input("q", (b, h, t, d), "float32")
    cache_k = g.input("k", (b, kv if grouped else h, s + 3, d), "float32")  # a longer cache, read in part
    cache_v = g.input("v", (b, kv if grouped else h, s + 3, d), "float32")

    def heads(c):
        c = c.slice(2, 0, s)
        if not grouped:
            return c
        return c.unsqueeze(2).expand((b, kv, rep, s, d)).reshape((b, h, s, d))

    k, v = heads(cache_k), heads(cache_v)
    scores = (q.unsqueeze(3) * k.unsqueeze(2)).sum(4)  # [b, h, t, s]
    p = scores.exp()
    out = (p.unsqueeze(4) * v.unsqueeze(2)).sum(3)  # [b, h, t, d]
    return g.build([out, scores])


def _inputs(graph, rng):
    return [rng.standard_normal(graph.nodes[i].shape).astype(np.float32) * 0.5 for i in graph.input_ids]


def _view_of_view_factors(graph) -> int:
    n = 0
    for i in range(len(graph.nodes)):
        f = matmul_form(graph, i)
        for fac in (f.lhs, f.rhs) if f is not None else ():
            n += graph.nodes[fac.node].op == Op.View and graph.nodes[fac.src].op == Op.View
    return n


@pytest.mark.parametrize("shape", [(1, 2, 4, 1, 7, 8), (2, 2, 2, 3, 5, 4), (3, 3, 2, 2, 6, 4)])
def test_grouped_products_split_into_broadcasts_and_compute_the_same(shape):
    graph = _attention(*shape)
    assert _view_of_view_factors(graph) == 2  # the repeated K and V: a copy each, as traced
    split = split_grouped_products(graph)
    assert split is not graph and _view_of_view_factors(split) == 0
    forms = [f for f in (matmul_form(split, i) for i in range(len(split.nodes))) if f is not None]
    assert len(forms) == 2 and all(f.lhs.broadcast or f.rhs.broadcast for f in forms)  # the repeat: stride 0
    rng = np.random.default_rng(fresh_seed())
    xs = _inputs(graph, rng)
    for want, got in zip(evaluate(graph, xs), evaluate(split, xs)):
        assert got.shape == want.shape and rel_err(got, want) < 1e-5


def test_products_without_a_repeat_are_left_alone():
    graph = _attention(2, 2, 2, 3, 5, 4, grouped=False)
    assert split_grouped_products(graph) is graph
    one = _attention(2, 1, 3, 3, 5, 4)  # one kv head: the repeat is one strided view already (the builder composes)
    assert _view_of_view_factors(one) == 0 and split_grouped_products(one) is one


def test_the_jax_backend_runs_the_split_form(monkeypatch):
    """The JAX lowering splits them under its peephole knob, and the program computes the reference's values."""
    from egraft.backends import lower
    from egraft.backends.jax import function

    graph = _attention(2, 2, 3, 2, 6, 4)
    seen = []
    real = function.split_grouped_products
    monkeypatch.setattr(function, "split_grouped_products", lambda g: seen.append(g) or real(g))
    exe = lower(graph, "jax", "cpu")
    assert seen
    xs = _inputs(graph, np.random.default_rng(fresh_seed()))
    for want, got in zip(evaluate(graph, xs), exe(*xs)):
        assert rel_err(np.asarray(got), want) < 1e-5
