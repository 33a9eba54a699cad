"""Validation of candidates against the float64 reference."""

from __future__ import annotations

import numpy as np

from egraft.backends import lower
from egraft.ir import GraphBuilder, evaluate
from egraft.measure import Validation, poison, random_inputs, validate
from egraft.testing import fresh_seed


def _graph():
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    y = b.input("y", (4, 8), "float32")
    return b.build([(x * y).exp() + x, (x + y).sum(1)])


def test_a_correct_jax_executable_validates():
    g = _graph()
    seed = fresh_seed()
    v = validate(lower(g, "jax", "cpu"), g, seed=seed)
    assert isinstance(v, Validation) and v.ok and bool(v), v.message
    assert len(v.errors) == len(v.tolerance) == 2
    assert all(0 <= e <= t for e, t in zip(v.errors, v.tolerance))
    assert v.seed == seed


def test_explicit_inputs_are_used():
    g = _graph()
    xs = random_inputs(g, fresh_seed())
    v = validate(lambda *a: evaluate(g, a), g, inputs=xs)
    assert v.ok, v.message


def test_off_by_1e_3_relative_fails():
    g = _graph()

    def wrong(*a):
        outs = evaluate(g, a)
        return [outs[0] * np.float32(1 + 1e-3), outs[1]]

    v = validate(wrong, g, seed=fresh_seed())
    assert not v.ok
    assert v.errors[0] > v.tolerance[0] and v.errors[1] <= v.tolerance[1]
    assert "output 0" in v.message


def test_a_raising_candidate_fails_without_raising():
    g = _graph()

    def boom(*a):
        raise RuntimeError("kernel launch failed")

    v = validate(boom, g, seed=fresh_seed())
    assert not v.ok and "RuntimeError" in v.message and "kernel launch failed" in v.message


def test_nan_where_reference_is_finite_fails():
    g = _graph()

    def holey(*a):
        outs = [o.copy() for o in evaluate(g, a)]
        outs[1][2] = np.nan
        return outs

    v = validate(holey, g, seed=fresh_seed())
    assert not v.ok and "NaN" in v.message


def test_wrong_output_count_or_shape_fails():
    g = _graph()
    assert not validate(lambda *a: evaluate(g, a)[:1], g, seed=fresh_seed()).ok
    assert not validate(lambda *a: [o.T for o in evaluate(g, a)], g, seed=fresh_seed()).ok


class _Prealloc:
    """A candidate that writes into its own output buffers, but forgets the last row of output 0."""

    def __init__(self, graph, forget: bool):
        self.graph = graph
        self.forget = forget
        self.output_buffers = [np.zeros(s, dtype=d) for s, d in graph.output_types()]
        self.runs = 0

    def __call__(self, *a):
        want = evaluate(self.graph, a)
        for buf, w in zip(self.output_buffers, want):
            if self.forget and buf.ndim == 2:
                buf[:-1] = w[:-1]
            else:
                buf[...] = w
        self.runs += 1
        return self.output_buffers


def test_poisoning_catches_unwritten_elements():
    g = _graph()
    xs = random_inputs(g, fresh_seed())
    good = _Prealloc(g, forget=False)
    assert validate(good, g, inputs=xs).ok
    stale = _Prealloc(g, forget=True)
    stale.forget = False
    assert validate(stale, g, inputs=xs).ok  # a full run leaves correct values in the buffers
    stale.forget = True
    v = validate(stale, g, inputs=xs)  # same inputs: stale values would pass without poisoning
    assert not v.ok and "NaN" in v.message


def test_poison_is_a_noop_for_fresh_array_candidates():
    assert poison(lambda *a: None) == 0
    c = _Prealloc(_graph(), forget=False)
    assert poison(c) == 2
    assert all(np.isnan(b).all() for b in c.output_buffers)


def test_gather_indices_are_drawn_inside_their_table():
    """Token ids feed an embedding: random inputs stay in [0, table) through views and casts, other ints do not."""
    import torch

    import egraft
    from egraft.measure.inputs import index_ranges

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(13, 4)

        def forward(self, ids, other):
            return self.emb(ids.reshape(-1)).sum() + other.float().sum()

    g = egraft.trace(Embed(), (torch.randint(0, 13, (2, 5)), torch.randint(0, 3, (3,))))
    assert index_ranges(g) == {0: 13}
    draws = [random_inputs(g, seed) for seed in range(5)]
    for ids, _ in draws:
        assert ids.min() >= 0 and ids.max() < 13 and ids.any()
    assert min(int(other.min()) for _, other in draws) < 0  # the other int input keeps the default range
    egraft.ir.evaluate(g, random_inputs(g, 9))  # an out-of-range id would raise
