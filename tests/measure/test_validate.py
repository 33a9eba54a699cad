"""Validation of candidates against the float64 reference."""

from __future__ import annotations

import numpy as np

from egraft.backends import lower
from egraft.ir import GraphBuilder, evaluate
from egraft.measure import Validation, random_inputs, validate
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


class _Reused:
    """A candidate that writes into one buffer it keeps between runs, and forgets its last row on the second."""

    def __init__(self, graph):
        self.graph = graph
        self.buffer = None
        self.runs = 0

    def __call__(self, *a):
        want = evaluate(self.graph, a)
        if self.buffer is None:
            self.buffer = np.full_like(want[0], np.nan)
        rows = want[0].shape[0] - (1 if self.runs else 0)
        self.buffer[:rows] = want[0][:rows]
        self.runs += 1
        return [self.buffer, want[1]]


def test_an_unwritten_row_fails_on_new_inputs():
    """A kernel that leaves part of its output unwritten passes only while the stale values happen to be right:
    validation on fresh inputs (the search's and the check's policy) catches it."""
    g = _graph()
    c = _Reused(g)
    assert validate(c, g, inputs=random_inputs(g, fresh_seed())).ok  # the first run writes everything
    v = validate(c, g, inputs=random_inputs(g, fresh_seed() + 1))
    assert not v.ok and "output 0" in v.message


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
    assert index_ranges(g) == {0: range(13)}
    draws = [random_inputs(g, seed) for seed in range(5)]
    for ids, _ in draws:
        assert ids.min() >= 0 and ids.max() < 13 and ids.any()
    assert min(int(other.min()) for _, other in draws) < 0  # the other int input keeps the default range
    egraft.ir.evaluate(g, random_inputs(g, 9))  # an out-of-range id would raise
