"""Per-primitive semantics: each op in a one-op graph against an independent python/numpy formulation.

The reference for every op is written elementwise in plain python (``math``,
explicit loops over indices) on float64 values and rounded once to the
node's dtype, so it shares no code path with ``egraft.ir.ops``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from egraft.errors import IRError
from egraft.ir import PRIMITIVES, GraphBuilder, TensorValue, dtypes, evaluate
from egraft.ir.graph import Graph, Node, Attrs

from ir_testlib import ALL_DTYPES, FLOATS, INTS, assert_elementwise, one_op, positive, rand, round_to, run1

SHAPES = [(), (5,), (3, 4), (2, 3, 4)]


def _map(fn, *arrays):
    """Apply a python scalar function elementwise (arrays of one shape), in float64/python numbers."""
    shape = np.shape(arrays[0])
    flat = [np.asarray(a).reshape(-1).tolist() for a in arrays]
    return np.array([fn(*xs) for xs in zip(*flat)], dtype=object).reshape(shape)


def _as_float(x):
    return np.asarray(x).astype(np.float64)


# --- unary -------------------------------------------------------------------------

def _unary_case(op, fn, domain):
    def case(rng):
        for dt, shape in itertools.product(FLOATS, SHAPES):
            x = domain(shape, dt, rng)
            got = run1(one_op(op, [(shape, dt)]), [x])
            want = round_to(_map(fn, _as_float(x)).astype(np.float64), dt)
            assert_elementwise(got, want, dt, rng.tag, f"{op} {shape}")
    return case


def _safe(fn):
    def g(v):
        try:
            return fn(v)
        except (ValueError, ZeroDivisionError, OverflowError):
            return math.nan
    return g


def _recip(v):
    if v == 0:
        return math.copysign(math.inf, v)
    return 1.0 / v


# --- binary ------------------------------------------------------------------------

def _binary_case(op, fn, dts, domain=rand):
    def case(rng):
        for dt, shape in itertools.product(dts, SHAPES):
            a, c = domain(shape, dt, rng), domain(shape, dt, rng)
            got = run1(one_op(op, [(shape, dt), (shape, dt)]), [a, c])
            if dt == "bool" or dtypes.is_int(dt):
                want = _map(fn, a, c).astype(dtypes.to_numpy(dt))
            else:
                want = round_to(_map(fn, _as_float(a), _as_float(c)).astype(np.float64), dt)
            assert_elementwise(got, want, dt, rng.tag, f"{op} {shape} {dt}")
    return case


def _add(a, c):
    return (a or c) if isinstance(a, bool) else a + c


def _mul(a, c):
    return (a and c) if isinstance(a, bool) else a * c


def _trunc_mod(a, c):
    if isinstance(a, float):
        return math.fmod(a, c)
    r = abs(a) % abs(c)
    return r if a >= 0 else -r


def _nonzero(shape, dt, rng):
    x = rand(shape, dt, rng)
    if dtypes.is_int(dt):
        return np.where(x == 0, 3, x).astype(x.dtype)
    return np.where(x == 0, 1.5, x).astype(x.dtype)


def case_lessthan(rng):
    for dt, shape in itertools.product(ALL_DTYPES, SHAPES):
        a, c = rand(shape, dt, rng), rand(shape, dt, rng)
        if shape and dt not in ("bool",):
            c.reshape(-1)[0] = a.reshape(-1)[0]  # equal operands compare False
        got = run1(one_op("LessThan", [(shape, dt), (shape, dt)]), [a, c])
        want = _map(lambda u, v: u < v, _as_float(a), _as_float(c)).astype(bool)
        assert_elementwise(got, want, "bool", rng.tag, f"LessThan {dt}")


def case_nibble(rng):
    """Every int8 byte at both positions (and random positions), against the bit fields read in python."""
    for shape in SHAPES:
        a = rng.gen.integers(-128, 128, size=shape).astype(np.int8)
        pos = rng.gen.integers(-128, 128, size=shape).astype(np.int8)  # parity picks the field
        got = run1(one_op("Nibble", [(shape, "int8"), (shape, "int8")]), [a, pos])
        want = _map(lambda u, p: (((int(u) & 255) >> (4 * (int(p) & 1))) & 15 ^ 8) - 8, a, pos).astype(np.int8)
        assert_elementwise(got, want, "int8", rng.tag, "Nibble")
    every = np.arange(-128, 128, dtype=np.int8)
    for p in (0, 1):
        got = run1(one_op("Nibble", [((256,), "int8"), ((256,), "int8")]), [every, np.full(256, p, np.int8)])
        assert sorted(set(got.tolist())) == list(range(-8, 8)), f"{rng.tag} Nibble field {p}"


def case_where(rng):
    for dt, shape in itertools.product(ALL_DTYPES, SHAPES):
        cond = rand(shape, "bool", rng)
        a, c = rand(shape, dt, rng), rand(shape, dt, rng)
        got = run1(one_op("Where", [(shape, "bool"), (shape, dt), (shape, dt)]), [cond, a, c])
        want = _map(lambda k, u, v: u if k else v, cond, a, c).astype(dtypes.to_numpy(dt))
        assert_elementwise(got, want, dt, rng.tag, f"Where {dt}")


# --- reductions ----------------------------------------------------------------------

def _reduce_ref(x, axis, fn):
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1], dtype=object)
    for idx in np.ndindex(*moved.shape[:-1]):
        out[idx] = fn(moved[idx].tolist())
    return out


def _reduce_case(op, fn, dts):
    def case(rng):
        for dt, shape in itertools.product(dts, [(5,), (3, 4), (2, 3, 4), (2, 1, 3)]):
            for axis in range(len(shape)):
                x = rand(shape, dt, rng)
                got = run1(one_op(op, [(shape, dt)], axis=axis), [x])
                scale = None
                if dtypes.is_float(dt):
                    want = round_to(_reduce_ref(_as_float(x), axis, fn).astype(np.float64), dt)
                    if op == "SumReduce":  # a sum's error bound: the sum of |terms|
                        scale = np.abs(_as_float(x)).sum(axis=axis)
                else:
                    want = _reduce_ref(x, axis, fn).astype(dtypes.to_numpy(dt))
                assert_elementwise(got, want, dt, rng.tag, f"{op} {shape} axis={axis} {dt}", scale=scale)
    return case


def _fsum_or_sum(vals):
    return math.fsum(vals) if vals and isinstance(vals[0], float) else sum(vals)


def _max_or_any(vals):
    return any(vals) if isinstance(vals[0], bool) else max(vals)


def case_sumreduce_empty(rng):
    got = run1(one_op("SumReduce", [((3, 0), "float32")], axis=1), [np.zeros((3, 0), np.float32)])
    assert np.array_equal(got, np.zeros(3, np.float32)), rng.tag


# --- index / type ----------------------------------------------------------------------

def case_iota(rng):
    for dt, n in itertools.product(FLOATS + INTS, [0, 1, 7, int(rng.gen.integers(2, 200))]):
        b = GraphBuilder()
        g = b.build([b.iota(n, dt)])
        got = run1(g, [])
        want = np.array(list(range(n)), dtype=np.float64).astype(dtypes.to_numpy(dt))
        assert_elementwise(got, want, dt, rng.tag, f"Iota({n}) {dt}")


def _gather_ref(x, idx, axis):
    out = np.empty(idx.shape, dtype=x.dtype)
    for pos in np.ndindex(*idx.shape):
        src = list(pos)
        src[axis] = int(idx[pos])
        out[pos] = x[tuple(src)]
    return out


def case_gather(rng):
    for dt, idt, (shape, axis, k) in itertools.product(
        ALL_DTYPES, INTS, [((5,), 0, 7), ((3, 4), 0, 2), ((3, 4), 1, 6), ((2, 3, 4), 1, 1), ((2, 3, 4), 2, 4)]
    ):
        x = rand(shape, dt, rng)
        ishape = shape[:axis] + (k,) + shape[axis + 1:]
        idx = rng.gen.integers(0, shape[axis], size=ishape).astype(dtypes.to_numpy(idt))
        got = run1(one_op("Gather", [(shape, dt), (ishape, idt)], axis=axis), [x, idx])
        assert_elementwise(got, _gather_ref(x, idx, axis), dt, rng.tag, f"Gather {shape} axis={axis}")


def _scatter_ref(x, idx, upd, axis):
    out = x.copy()
    for pos in np.ndindex(*idx.shape):
        dst = list(pos)
        dst[axis] = int(idx[pos])
        out[tuple(dst)] = upd[pos]
    return out


def _distinct_index(shape, axis, n, dt, gen):
    """An index of `shape` whose lines along `axis` hold distinct values in [0, n) (a permutation prefix)."""
    k = shape[axis]
    lines = [gen.permutation(n)[:k] for _ in range(int(np.prod(shape)) // max(k, 1))]
    flat = np.array(lines, dtype=np.int64).reshape(shape[:axis] + shape[axis + 1:] + (k,))
    return np.moveaxis(flat, -1, axis).astype(dtypes.to_numpy(dt))


def case_scatter(rng):
    for dt, idt, (shape, axis, k) in itertools.product(
        ALL_DTYPES, INTS, [((5,), 0, 3), ((3, 4), 0, 2), ((3, 4), 1, 4), ((2, 3, 4), 1, 1), ((2, 3, 4), 2, 3)]
    ):
        x = rand(shape, dt, rng)
        ushape = shape[:axis] + (k,) + shape[axis + 1:]
        idx = _distinct_index(ushape, axis, shape[axis], idt, rng.gen)
        upd = rand(ushape, dt, rng)
        got = run1(one_op("Scatter", [(shape, dt), (ushape, idt), (ushape, dt)], axis=axis), [x, idx, upd])
        assert_elementwise(got, _scatter_ref(x, idx, upd, axis), dt, rng.tag, f"Scatter {shape} axis={axis}")
        g = run1(one_op("Gather", [(shape, dt), (ushape, idt)], axis=axis), [got, idx])
        assert_elementwise(g, upd, dt, rng.tag, f"Gather of Scatter {shape} axis={axis}")  # reads back the writes


def _cast_scalar(v, to):
    if to == "bool":
        return v != 0
    if dtypes.is_int(to):
        return math.trunc(v) if isinstance(v, float) else int(v)
    return float(v)


def case_cast(rng):
    for src, to, shape in itertools.product(ALL_DTYPES, ALL_DTYPES, [(6,), (2, 3)]):
        x = rand(shape, src, rng) if not dtypes.is_float(src) else (rand(shape, src, rng) * 4).astype(
            dtypes.to_numpy(src))
        got = run1(one_op("Cast", [(shape, src)], dtype=to), [x])
        vals = x.astype(np.float64) if dtypes.is_float(src) else x.astype(object)
        want = _map(lambda v: _cast_scalar(v, to), vals)
        if dtypes.is_float(to):
            want = round_to(want.astype(np.float64), to)
        else:
            want = want.astype(dtypes.to_numpy(to))
        assert_elementwise(got, want, to, rng.tag, f"Cast {src}->{to}")


def _view_ref(x, shape, strides, offset):
    flat = x.reshape(-1).tolist()
    out = np.empty(shape, dtype=x.dtype)
    for pos in np.ndindex(*shape):
        out[pos] = flat[offset + sum(i * s for i, s in zip(pos, strides))]
    return out


VIEW_CASES = [
    ((3, 4), (4, 3), (1, 4), 0),  # transpose
    ((3, 4), (2, 3, 4), (0, 4, 1), 0),  # expand (stride 0)
    ((3, 4), (3, 2), (4, 2), 1),  # slice with step and offset
    ((3, 4), (3, 4), (-4, -1), 11),  # flip both axes (negative strides)
    ((12,), (5, 4), (2, 1), 0),  # overlapping sliding windows
    ((2, 3, 4), (4, 6), (1, 4), 0),  # reshape-of-permute style
    ((6,), (), (), 5),  # select one element
    ((3, 4), (0, 4), (4, 1), 0),  # empty
]


def case_view(rng):
    for dt, (src, shape, strides, offset) in itertools.product(ALL_DTYPES, VIEW_CASES):
        x = rand(src, dt, rng)
        got = run1(one_op("View", [(src, dt)], shape=shape, strides=strides, offset=offset), [x])
        assert_elementwise(got, _view_ref(x, shape, strides, offset), dt, rng.tag, f"View {shape} {strides}")


def case_view_of_view(rng):
    """A view reads the *logical* row-major layout of its input, even when that input is a view."""
    x = rand((3, 4), "float32", rng)
    nodes = [
        Node("Input", (), Attrs(dict(name="x", shape=(3, 4), dtype="float32", role="input")), (3, 4), "float32"),
        Node("View", (0,), Attrs(dict(shape=(4, 3), strides=(1, 4), offset=0)), (4, 3), "float32"),
        Node("View", (1,), Attrs(dict(shape=(6, 2), strides=(2, 1), offset=0)), (6, 2), "float32"),
    ]
    got = run1(Graph(nodes, [2]), [x])
    assert np.array_equal(got, x.T.reshape(6, 2)), rng.tag


def case_input(rng):
    for dt, shape in itertools.product(ALL_DTYPES, SHAPES):
        x = rand(shape, dt, rng)
        b = GraphBuilder()
        g = b.build([b.input("x", shape, dt)])
        assert_elementwise(run1(g, [x]), x, dt, rng.tag, "Input")


def case_constant(rng):
    for dt in ALL_DTYPES:
        v = {"bool": True}.get(dt, int(rng.gen.integers(-9, 9)) if not dtypes.is_float(dt) else float(rng.gen.normal()))
        b = GraphBuilder()
        g = b.build([b.constant(v, dt, (2, 3)), b.tensor_constant(rand((2, 3), dt, rng))])
        outs = evaluate(g, [])
        assert_elementwise(outs[0], round_to(np.full((2, 3), float(v)), dt) if dtypes.is_float(dt)
                           else np.full((2, 3), v, dtypes.to_numpy(dt)), dt, rng.tag, f"Constant {dt}")
        tv = next(n.attrs["value"] for n in g.nodes if isinstance(n.attrs.get("value"), TensorValue))
        assert_elementwise(outs[1], tv.array, dt, rng.tag, f"tensor Constant {dt}")


SEMANTICS = {
    "Exp2": _unary_case("Exp2", lambda v: 2.0 ** v, lambda s, d, r: rand(s, d, r, -10, 10)),
    "Log2": _unary_case("Log2", _safe(math.log2), positive),
    "Sin": _unary_case("Sin", math.sin, lambda s, d, r: rand(s, d, r, -20, 20)),
    "Sqrt": _unary_case("Sqrt", math.sqrt, positive),
    "Recip": _unary_case("Recip", _recip, rand),
    "Add": _binary_case("Add", _add, ALL_DTYPES),
    "Mul": _binary_case("Mul", _mul, ALL_DTYPES),
    "Mod": _binary_case("Mod", _trunc_mod, FLOATS + INTS, _nonzero),
    "LessThan": case_lessthan,
    "Nibble": case_nibble,
    "Where": case_where,
    "SumReduce": _reduce_case("SumReduce", _fsum_or_sum, FLOATS + INTS),
    "MaxReduce": _reduce_case("MaxReduce", _max_or_any, ALL_DTYPES),
    "Iota": case_iota,
    "Gather": case_gather,
    "Scatter": case_scatter,
    "Cast": case_cast,
    "View": case_view,
    "Input": case_input,
    "Constant": case_constant,
}


def test_every_primitive_has_a_semantics_test():
    assert set(SEMANTICS) == set(PRIMITIVES) | {"View", "Input", "Constant"}


@pytest.mark.parametrize("op", sorted(SEMANTICS))
def test_semantics(op, rng):
    SEMANTICS[op](rng)


def test_view_of_view_reads_logical_layout(rng):
    case_view_of_view(rng)


def test_sum_over_empty_axis_is_zero(rng):
    case_sumreduce_empty(rng)


# --- edge cases --------------------------------------------------------------------------

@pytest.mark.parametrize("dt", FLOATS + INTS)
def test_mod_is_truncated_with_negative_operands(dt):
    a = np.array([7, -7, 7, -7, 5, -5, 0, 6], dtype=dtypes.to_numpy(dt))
    c = np.array([3, 3, -3, -3, 5, 2, 3, -4], dtype=dtypes.to_numpy(dt))
    got = run1(one_op("Mod", [((8,), dt), ((8,), dt)]), [a, c])
    want = np.array([1, -1, 1, -1, 0, -1, 0, 2], dtype=dtypes.to_numpy(dt))
    assert np.array_equal(got, want), got


def test_float_mod_fractional_and_by_zero():
    a = np.array([5.5, -5.5, 1.0, np.inf], np.float32)
    c = np.array([2.0, 2.0, 0.0, 2.0], np.float32)
    got = run1(one_op("Mod", [((4,), "float32"), ((4,), "float32")]), [a, c])
    assert got[0] == 1.5 and got[1] == -1.5 and np.isnan(got[2]) and np.isnan(got[3]), got


@pytest.mark.parametrize("dt", INTS)
def test_integer_mod_by_zero_raises(dt):
    g = one_op("Mod", [((3,), dt), ((3,), dt)])
    with pytest.raises(IRError, match="Mod by zero"):
        evaluate(g, [np.array([1, 2, 3], dt), np.array([1, 0, 3], dt)])


@pytest.mark.parametrize("dt", FLOATS)
def test_where_never_leaks_the_unselected_branch(dt):
    cond = np.array([True, False, True, False, True, False])
    a = np.array([1.0, np.inf, -np.inf, np.nan, 2.0, np.nan], dtypes.to_numpy(dt))
    c = np.array([np.nan, 3.0, np.nan, -np.inf, np.inf, 4.0], dtypes.to_numpy(dt))
    got = run1(one_op("Where", [((6,), "bool"), ((6,), dt), ((6,), dt)]), [cond, a, c])
    want = np.array([1.0, 3.0, -np.inf, -np.inf, 2.0, 4.0])
    assert np.array_equal(got.astype(np.float64), want), got


@pytest.mark.parametrize("dt", FLOATS)
def test_lessthan_with_nan_and_inf_is_false_both_ways(dt):
    a = np.array([np.nan, 1.0, np.nan, -np.inf, np.inf, 0.0], dtypes.to_numpy(dt))
    c = np.array([1.0, np.nan, np.nan, np.inf, np.inf, -0.0], dtypes.to_numpy(dt))
    g = one_op("LessThan", [((6,), dt), ((6,), dt)])
    assert run1(g, [a, c]).tolist() == [False, False, False, True, False, False]
    assert run1(g, [c, a]).tolist() == [False, False, False, False, False, False]


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("to", INTS)
def test_cast_float_to_int_truncates_toward_zero(src, to):
    x = np.array([2.75, -2.75, 0.5, -0.5, 3.0, -3.0, 7.5, -7.5], dtypes.to_numpy(src))
    got = run1(one_op("Cast", [((8,), src)], dtype=to), [x])
    assert got.tolist() == [2, -2, 0, 0, 3, -3, 7, -7], got


@pytest.mark.parametrize("src", FLOATS + INTS)
def test_cast_to_bool_is_nonzero(src):
    vals = [0, 1, -2, 0, 3] + ([0.25, -0.0, np.nan] if dtypes.is_float(src) else [5, 0, -1])
    x = np.array(vals, dtypes.to_numpy(src))
    got = run1(one_op("Cast", [((8,), src)], dtype="bool"), [x])
    assert got.tolist() == [bool(v) for v in vals], got  # nan is nonzero -> True, -0.0 -> False


def test_cast_float32_to_half_rounds_to_nearest():
    x = np.array([1 + 2 ** -11 + 2 ** -20, 65520.0, 1e-8, 3.14159265], np.float32)
    got = run1(one_op("Cast", [((4,), "float32")], dtype="float16"), [x])
    assert got.dtype == np.float16
    assert got[0] == np.float16(1 + 2 ** -10) and np.isinf(got[1]) and got[3] == np.float16(3.14159265), got


def test_view_with_stride0_negative_stride_and_offset():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    g = one_op("View", [((3, 4), "int64")], shape=(2, 3), strides=(0, -4), offset=9)
    assert run1(g, [x]).tolist() == [[9, 5, 1], [9, 5, 1]]


@pytest.mark.parametrize("bad", [[[4, 0, 1]], [[-1, 0, 2]]])
def test_gather_out_of_range_raises(bad):
    g = one_op("Gather", [((2, 3), "float32"), ((1, 3), "int64")], axis=0)
    with pytest.raises(IRError, match="Gather index out of range"):
        evaluate(g, [np.ones((2, 3), np.float32), np.array(bad, np.int64)])


@pytest.mark.parametrize("bad,msg", [([[3, 0]], "out of range"), ([[-1, 1]], "out of range"),
                                     ([[1, 1]], "repeat along the axis")])
def test_scatter_bad_indices_raise(bad, msg):
    """Out-of-range indices and two writes to one element of a line are errors, not an arbitrary order."""
    g = one_op("Scatter", [((1, 3), "float32"), ((1, 2), "int64"), ((1, 2), "float32")], axis=1)
    with pytest.raises(IRError, match=msg):
        evaluate(g, [np.ones((1, 3), np.float32), np.array(bad, np.int64), np.ones((1, 2), np.float32)])


def test_scatter_does_not_write_into_its_input():
    """Scatter is a pure function: the target array handed to evaluate is left unchanged."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    before = x.copy()
    g = one_op("Scatter", [((2, 3), "float32"), ((2, 1), "int32"), ((2, 1), "float32")], axis=1)
    out = run1(g, [x, np.array([[2], [0]], np.int32), np.array([[-5.0], [7.0]], np.float32)])
    assert np.array_equal(x, before)
    assert out.tolist() == [[0.0, 1.0, -5.0], [7.0, 4.0, 5.0]]


def test_sum_reduce_int_wraps_like_c():
    x = np.array([2 ** 31 - 1, 1], np.int32)
    got = run1(one_op("SumReduce", [((2,), "int32")], axis=0), [x])
    assert got.dtype == np.int32 and int(got) == -(2 ** 31)


def test_max_reduce_propagates_nan():
    x = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 3.0]], np.float32)
    got = run1(one_op("MaxReduce", [((2, 3), "float32")], axis=1), [x])
    assert np.isnan(got[0]) and got[1] == 3.0


def test_half_ops_compute_in_float32_and_round_once():
    """float16 Add of values whose exact sum needs float32 precision: the result is the rounded float32 sum."""
    a = np.array([2048.0, 1.0, 0.1], np.float16)
    c = np.array([1.0, 2 ** -11, 0.2], np.float16)
    got = run1(one_op("Add", [((3,), "float16"), ((3,), "float16")]), [a, c])
    want = (a.astype(np.float32) + c.astype(np.float32)).astype(np.float16)
    assert np.array_equal(got, want)
