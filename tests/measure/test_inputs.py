"""The random-input policy for Scatter indices and the Scatter's error budget."""

from __future__ import annotations

import numpy as np
import pytest

from egraft.ir import GraphBuilder, evaluate
from egraft.ir.builder import Tensor
from egraft.measure.inputs import distinct_index, distinct_lines, index_ranges, random_inputs
from egraft.measure.tolerances import ULPS_PER_OP, eps, error_budgets, tolerance_for
from egraft.testing import fresh_seed


def _lines_distinct(a, axis):
    lines = np.sort(np.moveaxis(a, axis, -1), axis=-1)
    return not np.any(lines[..., 1:] == lines[..., :-1])


@pytest.mark.parametrize("shape,axis,n", [((5,), 0, 5), ((3, 4), 1, 9), ((4, 3, 2), 0, 4), ((2, 1, 3), 1, 6)])
@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_distinct_index_draws_distinct_lines_in_range(shape, axis, n, dt):
    rng = np.random.default_rng(fresh_seed())
    for _ in range(20):
        a = distinct_index(shape, dt, rng, n, axis)
        assert a.shape == shape and a.dtype == np.dtype(dt)
        assert a.min() >= 0 and a.max() < n and a.any()
        assert _lines_distinct(a, axis)
    flat = distinct_index((2, 3), dt, rng, 6, None)  # None: distinct over the whole array
    assert sorted(flat.reshape(-1).tolist()) == list(range(6))


def _kv_graph(idt="int64"):
    b = GraphBuilder()
    cache = b.input("cache", (2, 3, 8, 4), "float32")
    pos = b.input("pos", (3,), idt)
    i2 = b.input("i2", (2, 6, 5), "int32")
    new = b.input("new", (2, 3, 3, 4), "float32")
    t = b.input("t", (2, 6, 7), "float32")
    out = cache.scatter(2, pos.reshape((1, 1, 3, 1)).expand((2, 3, 3, 4)), new)
    out2 = t.scatter(2, i2, b.input("u", (2, 6, 5), "float32"))
    return b.build([out, out2])


def test_scatter_indices_are_found_through_views_and_drawn_distinct_per_line():
    g = _kv_graph()
    names = g.input_names()
    lines = {names[k]: ax for k, ax in distinct_lines(g).items()}
    assert lines == {"pos": 0, "i2": 2}  # the position vector's one axis is the broadcast view's axis 2
    ranges = {names[k]: n for k, n in index_ranges(g).items()}
    assert ranges == {"pos": range(8), "i2": range(7)}
    seed = fresh_seed()
    for s in range(seed, seed + 50):
        xs = random_inputs(g, s)
        evaluate(g, xs)  # the reference rejects a repeated or out-of-range scatter index
        assert _lines_distinct(xs[names.index("i2")], 2)


def test_scatter_indices_are_found_through_a_negative_index_wrap():
    """index_copy_ lowers its index as ``pos < 0 ? pos + n : pos``: the input behind it is still drawn distinct."""
    b = GraphBuilder()
    cache = b.input("cache", (1, 2, 16, 4), "float32")
    pos = b.input("pos", (3,), "int64")
    upd = b.input("upd", (1, 2, 3, 4), "float32")
    wrapped = Tensor.where(pos < 0, pos + 16, pos)
    idx = wrapped.reshape((1, 1, 3, 1)).expand((1, 2, 3, 4))
    g = b.build([b.add("Scatter", (cache, idx, upd), axis=2)])
    assert distinct_lines(g) == {g.input_names().index("pos"): 0}
    seed = fresh_seed()
    for s in range(seed, seed + 50):  # three of sixteen positions: a repeat in about one draw in six if not distinct
        xs = random_inputs(g, s)
        assert len(set(xs[g.input_names().index("pos")].tolist())) == 3
        evaluate(g, xs)


@pytest.mark.parametrize("start_dt", ["int32", "int64"])
def test_a_start_position_plus_an_iota_is_drawn_short_of_the_end(start_dt):
    """A layer block cut out of a static-cache step takes the first position as a scalar and writes its T slots at
    ``start + 0 .. T-1`` (wrapped as index_copy_ wraps): the start is drawn from ``[0, n - T + 1)``, so every slot
    written is inside the cache (drawn from ``[0, n)`` it wrote past the end; seen at 128 tokens of 256 slots)."""
    b = GraphBuilder()
    cache = b.input("cache", (1, 2, 16, 4), "float32")
    start = b.input("start", (), start_dt)
    upd = b.input("upd", (1, 2, 6, 4), "float32")
    pos = b.iota(6) + start.cast("int64").reshape((1,)).expand((6,))
    wrapped = Tensor.where(pos < 0, pos + 16, pos)
    idx = wrapped.reshape((1, 1, 6, 1)).expand((1, 2, 6, 4))
    g = b.build([b.add("Scatter", (cache, idx, upd), axis=2)])
    k = g.input_names().index("start")
    assert index_ranges(g) == {k: range(0, 11)}
    seed = fresh_seed()
    starts = set()
    for s in range(seed, seed + 60):
        xs = random_inputs(g, s)
        starts.add(int(xs[k]))
        evaluate(g, xs)  # the reference rejects a slot past the cache's end
    assert max(starts) >= 8  # the whole allowed range is used, not a safe corner of it


def test_a_position_minus_one_is_drawn_from_one():
    """An index computed as ``x - 1`` (an Add of -1) is drawn from ``[1, n + 1)``, a gather's token past a shift."""
    b = GraphBuilder()
    table = b.input("table", (9, 3), "float32")
    x = b.input("x", (4, 3), "int64")
    g = b.build([b.add("Gather", (table, x + (-1)), axis=0)])
    assert index_ranges(g) == {g.input_names().index("x"): range(1, 10)}
    for s in range(fresh_seed(), fresh_seed() + 20):
        evaluate(g, random_inputs(g, s))


def test_scatter_budget_is_the_larger_of_its_target_and_update_budgets():
    b = GraphBuilder()
    x = b.input("x", (4, 6), "float32")
    u = b.input("u", (4, 2), "float32")
    i = b.input("i", (4, 2), "int64")
    g = b.build([x.scatter(1, i, u.exp2().sin()), x.recip().scatter(1, i, u)])
    budgets = error_budgets(g)
    e = eps("float32")
    assert budgets[g.outputs[0]] == 2 * ULPS_PER_OP * e  # the update's two ops, none on the target
    assert budgets[g.outputs[1]] == ULPS_PER_OP * e  # the target's one op
    assert tolerance_for(g, 0) == 2 * ULPS_PER_OP * e


def test_like_keeps_distinct_example_positions_distinct():
    import torch

    from egraft.measure.inputs import like

    pos = torch.arange(5, 9)  # cache positions: distinct in the example
    ids = torch.tensor([[3, 3, 7, 1]])  # token ids: repeats allowed
    for s in range(20):
        (p, i), _ = like((pos, ids), seed=s)
        assert sorted(p.tolist()) == [5, 6, 7, 8] and p.dtype == pos.dtype
        assert i.min() >= 1 and i.max() <= 7 and i.shape == ids.shape
