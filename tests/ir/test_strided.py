"""The strided-view analysis (ir/strided.py, ir/strided_box.py) against the numpy semantics of ``View``.

Every answer the analysis gives (read maps, digit maps, compositions, the
movement-op decomposition, merged runs, flips) is checked on random source
shapes and random valid views -- negative, zero and overlapping strides,
offsets, size-1 and size-0 dims -- against ``ops._view``, the reference
interpreter's definition of a View.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egraft.ir import GraphBuilder, evaluate, strided
from egraft.ir.ops import _view
from egraft.ir.shapes import contiguous_strides, view_extent
from egraft.ir.strided import compose_views
from egraft.ir.strided_box import SlicePlan, box_plan, run_box_plan

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ref(x, view):
    shape, strides, offset = view
    return _view(x, {"shape": shape, "strides": strides, "offset": offset})


DIMS = st.sampled_from([0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4, 4])  # size-0 dims now and then


@st.composite
def views(draw, src_shape=None, min_numel=0):
    """(source shape, view) with the view in range of the source."""
    if src_shape is None:
        src_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))
    n = int(np.prod(src_shape))
    if n > 1 and draw(st.integers(0, 3)) == 0:  # a merging reshape (axes span several source dims) ...
        cuts = sorted(c for c in draw(st.sets(st.integers(1, len(src_shape)))) if c < len(src_shape))
        shape = tuple(int(np.prod(src_shape[a:b])) for a, b in zip([0] + cuts, cuts + [len(src_shape)]))
        strides = contiguous_strides(shape)
        flips = draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))  # ... flipped on some axes
        offset = sum((m - 1) * s for m, s, f in zip(shape, strides, flips) if f)
        return src_shape, (shape, tuple(-s if f else s for s, f in zip(strides, flips)), offset)
    rank = draw(st.integers(0, 4))
    dims = DIMS if not min_numel else st.integers(1, 4)
    shape = tuple(draw(st.lists(dims, min_size=rank, max_size=rank)))
    if np.prod(shape) == 0:
        return src_shape, (shape, tuple(draw(st.lists(st.integers(-6, 6), min_size=rank, max_size=rank))), 0)
    # strides: mostly the source's place values (times small signed factors), sometimes anything
    cs = contiguous_strides(src_shape) or (1,)
    strides = []
    for _ in range(rank):
        if draw(st.integers(0, 2)):
            strides.append(draw(st.sampled_from(cs)) * draw(st.integers(-2, 2)))
        else:
            strides.append(draw(st.integers(-n, n)))
    strides = tuple(strides)
    lo, hi = view_extent(shape, strides, 0)
    if hi - lo >= n:  # does not fit: keep the shape, read it all from one element
        strides = (0,) * rank
        lo = hi = 0
    offset = draw(st.integers(-lo, n - 1 - hi))
    return src_shape, (shape, strides, offset)


def _source(src_shape):
    return np.arange(int(np.prod(src_shape)), dtype=np.int64).reshape(src_shape)


def _read(x, m, shape):
    """Evaluate a read map: the source elements it says each output index reads (and check no carries)."""
    coords = [np.full(shape, b, dtype=np.int64) for b in m.base]
    for d, pieces in enumerate(m.pieces):
        n = shape[d]
        i, place = np.arange(n), n
        for p in pieces:  # outer -> inner
            place //= p.size
            if p.dim is not None:
                coords[p.dim] = coords[p.dim] + ((i // place) % p.size * p.step).reshape((n,) + (1,) * (len(shape) - d - 1))
    for j, c in enumerate(coords):
        assert c.min() >= 0 and c.max() < x.shape[j]
    return x[tuple(coords)] if x.ndim else np.broadcast_to(x, shape)


@SETTINGS
@given(views())
def test_gather_index_is_the_view(case):
    src_shape, view = case
    x = _source(src_shape)
    assert np.array_equal(x.reshape(-1)[strided.gather_index(*view)], _ref(x, view))


@SETTINGS
@given(views())
def test_read_map_reads_the_same_elements(case):
    """A read map's digits, evaluated per output index, give the source coordinates the View reads."""
    src_shape, view = case
    m = strided.read_map(src_shape, *view)
    if m is None:
        return
    x = _source(src_shape)
    got = _read(x, m, view[0])
    assert np.array_equal(got, _ref(x, view))


@SETTINGS
@given(views())
def test_digit_map_is_affine_per_source_dim(case):
    src_shape, view = case
    dm = strided.digit_map(src_shape, *view)
    if dm is None:
        return
    shape = view[0]
    idx = np.indices(shape) if shape else np.zeros((0,), dtype=np.int64)
    coords = []
    for base, terms in dm:
        c = np.full(shape, base, dtype=np.int64)
        for d, coef in terms:
            c = c + coef * idx[d]
        coords.append(c)
    x = _source(src_shape)
    got = x[tuple(coords)] if src_shape else np.broadcast_to(x, shape)
    assert np.array_equal(got, _ref(x, view))


@st.composite
def view_pairs(draw):
    src_shape, inner = draw(views(min_numel=1))
    _, outer = draw(views(src_shape=tuple(inner[0])))
    return src_shape, inner, outer


@SETTINGS
@given(view_pairs())
def test_composition_equals_applying_both(case):
    src_shape, inner, outer = case
    comp = compose_views(src_shape, inner, outer)
    if comp is None:
        return
    x = _source(src_shape)
    assert np.array_equal(_ref(x, comp), _ref(_ref(x, inner), outer))


@SETTINGS
@given(view_pairs())
def test_read_map_through_a_chain(case):
    """Following a view chain one link down (through_view + read_pieces) reads what both views read."""
    src_shape, inner, outer = case
    m = strided.read_map(tuple(inner[0]), *outer)
    if m is None:
        return
    axes, off = strided.through_view(m, inner[1], inner[2])
    m2 = strided.read_pieces(src_shape, axes, off)
    if m2 is None:
        return
    x = _source(src_shape)
    want = _ref(_ref(x, inner), outer)
    got = _read(x, m2, outer[0])
    assert np.array_equal(got, want)


@SETTINGS
@given(views())
def test_box_plan_on_numpy_equals_the_view(case):
    src_shape, view = case
    if np.prod(view[0]) == 0:
        return
    x = _source(src_shape)
    plan = box_plan(x.size, *view)
    if not isinstance(plan, SlicePlan):
        a, b = plan
        assert a != b and view[0][a] > 1 and view[0][b] > 1
        return
    got = run_box_plan(x.reshape(-1), plan)
    assert got.shape == tuple(view[0]) and np.array_equal(got, _ref(x, view))


@SETTINGS
@given(views())
def test_merge_runs_and_unflip_keep_the_elements(case):
    src_shape, (shape, strides, offset) = case
    if np.prod(shape) == 0:
        return
    x = _source(src_shape)
    want = _ref(x, (shape, strides, offset)).reshape(-1)
    sizes, mstrides = strided.merge_runs(shape, strides)
    assert np.array_equal(_ref(x, (tuple(sizes), tuple(mstrides), offset)).reshape(-1), want)
    pos, off, flipped = strided.unflip(shape, strides, offset)
    fwd = _ref(x, (shape, pos, off))
    assert all(s >= 0 for s in pos)
    assert np.array_equal(np.flip(fwd, flipped).reshape(-1), want)


def test_common_axes_refine_two_operands():
    # a [6] axis read as (2, 3) digits of a [2, 3] source by one operand and as one walk of a [6] source by
    # the other: the common digits are (2, 3); digit boundaries (2, 3) vs (3, 2) do not divide: no common axes
    a = ((strided.Piece(2, 0, 1), strided.Piece(3, 1, 1)),)
    b = ((strided.Piece(6, 0, 1),),)
    v = strided.common_axes((6,), (a, b))
    assert [(x.size, x.a, x.b) for x in v] == [(2, (0, 1), (0, 3)), (3, (1, 1), (0, 1))]
    assert strided.common_axes((6,), (a, ((strided.Piece(3, 0, 1), strided.Piece(2, 1, 1)),))) is None


def test_negative_strides_compose():
    """A flip of a flip, and a flip of a slice, are single views (compose_views once rejected these)."""
    x = _source((4, 5))
    flip = ((4, 5), (5, -1), 4)
    assert compose_views((4, 5), flip, flip) == ((4, 5), (5, 1), 0)
    sl = ((4, 3), (5, 1), 1)
    comp = compose_views((4, 5), sl, ((4, 3), (-3, 1), 9))
    assert comp is not None and np.array_equal(_ref(x, comp), _ref(_ref(x, sl), ((4, 3), (-3, 1), 9)))


def test_builder_composes_through_the_analysis():
    """The builder folds view chains with compose_views; the folded graph still evaluates to the chain."""
    b = GraphBuilder()
    x = b.input("x", (3, 4, 5), "float32")
    y = x.flip(2).transpose(0, 2).slice(1, 1, 4, 2)
    g = b.build([y])
    assert sum(n.op == "View" for n in g.nodes) == 1
    xv = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    (got,) = evaluate(g, [xv])
    assert np.array_equal(got, np.flip(xv, 2).transpose(2, 1, 0)[:, 1:4:2])
