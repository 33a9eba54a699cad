"""The view decomposer: views become slice/reshape/transpose/rev/broadcast, gathers only as a last resort."""

from __future__ import annotations

import numpy as np
import pytest
from jax_helpers import check_graph

from egraft.backends.jax.views import GatherPlan, NumpyOps, SlicePlan, StackPlan, apply_view, gather_index, plan_view
from egraft.ir import GraphBuilder
from egraft.ir.shapes import contiguous_strides, view_extent
from egraft.testing import fresh_seed


def _check(src_shape, shape, strides, offset, rng, budget=64, ops=None):
    x = rng.standard_normal(src_shape).astype(np.float32)
    plan = plan_view(x.size, shape, strides, offset, budget)
    got = np.asarray(apply_view(x, plan, ops))
    want = x.reshape(-1)[gather_index(shape, strides, offset)]
    assert got.shape == tuple(shape) and np.array_equal(got, want), (src_shape, shape, strides, offset, plan)
    return plan


def _random_view(rng):
    """A random in-range view (any strides: negative, zero, overlapping) of a flat source."""
    while True:
        r = int(rng.integers(1, 5))
        shape = tuple(int(v) for v in rng.integers(1, 5, size=r))
        strides = tuple(int(v) for v in rng.integers(-12, 13, size=r))
        n = int(rng.integers(1, 80))
        lo, hi = view_extent(shape, strides, 0)
        if hi - lo < n:
            return (n,), shape, strides, int(rng.integers(-lo, n - hi))


def test_random_views_match_reference():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    kinds = set()
    for _ in range(800):  # plans run on numpy here (fast); the jax ops are checked below
        plan = _check(*_random_view(rng), rng, ops=NumpyOps())
        kinds.add(type(plan).__name__)
    assert {"SlicePlan", "StackPlan"} <= kinds, f"seed={seed}: the fuzz should reach both plan kinds"
    for _ in range(5):  # eager jax compiles each op: keep it short
        _check(*_random_view(rng), rng)


@pytest.mark.parametrize("name,src,make", [
    ("reshape", (4, 6), lambda s: ((3, 8), contiguous_strides((3, 8)), 0)),
    ("permute", (2, 3, 4), lambda s: ((4, 2, 3), (1, 12, 4), 0)),
    ("slice", (4, 5), lambda s: ((4, 2), (5, 1), 1)),
    ("step-slice", (6, 5), lambda s: ((3, 2), (10, 2), 6)),
    ("select", (3, 4, 5), lambda s: ((3, 5), (20, 1), 10)),
    ("flip", (4, 5), lambda s: ((4, 5), (5, -1), 4)),
    ("flip-both", (4, 5), lambda s: ((4, 5), (-5, -1), 19)),
    ("expand", (3, 1), lambda s: ((2, 3, 7), (0, 1, 0), 0)),
    ("transpose-slice", (6, 8), lambda s: ((4, 3), (1, 16), 1)),
    ("carry-offset", (24,), lambda s: ((2, 2), (6, 2), 5)),
])
def test_common_views_need_no_gather(name, src, make):
    rng = np.random.default_rng(fresh_seed())
    plan = _check(src, *make(src), rng)
    assert isinstance(plan, SlicePlan), f"{name}: {plan}"


def test_sliding_windows_are_stacked_slices():
    """A conv's im2col view (overlapping windows) is a stack of strided slices, not a gather."""
    rng = np.random.default_rng(fresh_seed())
    # [B=2, C=3, H=W=6] -> windows [2, 3, 4, 4, 3, 3] (3x3, stride 1)
    plan = _check((2, 3, 6, 6), (2, 3, 4, 4, 3, 3), (108, 36, 6, 1, 6, 1), 0, rng)
    assert isinstance(plan, StackPlan) and not plan.is_gather
    # stride 2 windows
    plan = _check((1, 2, 7, 7), (1, 2, 3, 3, 3, 3), (98, 49, 14, 2, 7, 1), 0, rng)
    assert not plan.is_gather


def test_gather_fallback_when_too_many_pieces():
    rng = np.random.default_rng(fresh_seed())
    plan = _check((40,), (8, 8), (3, 2), 1, rng, budget=2)  # overlapping both ways
    assert isinstance(plan, GatherPlan)


def test_empty_view():
    rng = np.random.default_rng(fresh_seed())
    _check((4, 5), (0, 3), (5, 1), 0, rng)


def test_views_through_the_backend():
    """Chains of views over non-contiguous values, negative strides and offsets, in one program."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (4, 6, 5), "float32")
    outs = []
    for _ in range(12):
        (n,), shape, strides, off = _random_view(rng)
        n = min(n, 120)
        lo, hi = view_extent(shape, strides, off)
        if hi >= 120:
            continue
        base = b.add("View", (x,), shape=(2, 60), strides=(1, 2), offset=0)  # a transposed source
        v = b.add("View", (base.exp2(),), shape=shape, strides=strides, offset=off)  # view of a non-view value
        vv = b.add("View", (v,), shape=tuple(reversed(v.shape)), strides=tuple(reversed(contiguous_strides(v.shape))), offset=0)
        outs.append(vv + 1.0)
    outs.append(x.flip(1).slice(2, 1, 5, 2).transpose(0, 2))
    ex = check_graph(b.build(outs), seed, what="views")
    assert ex.stats["view_gathers"] == 0
