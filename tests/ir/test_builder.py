"""Builder: every Tensor method against torch on random inputs; view composition; CSE."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egraft.errors import IRError
from egraft.ir import GraphBuilder, Tensor, cat, evaluate, shapes, stack
from egraft.testing import rel_err

from ir_testlib import rand

S = (3, 4, 5)


def _idx(rng, n, shape):
    return rng.gen.integers(0, n, size=shape).astype(np.int64)


# name -> (input specs [(shape, dtype, kind)], builder fn, torch fn, tolerance in float64 oracle mode)
# kind: "n" normal, "p" positive, "i" small ints, "b" bools, ("idx", n) indices below n
CASES = {
    "add_sub_mul_div": ([(S, "float32", "n"), ((4, 1), "float32", "p")],
                        lambda x, y: (x + y) * 2.0 - x / y + 1 / (y + 1.0), lambda x, y: (x + y) * 2 - x / y + 1 / (y + 1), 1e-12),
    "neg_rsub_radd": ([(S, "float32", "n")], lambda x: 3.0 - (-x) + (1.0 + x), lambda x: 3 - (-x) + (1 + x), 1e-12),
    "int_div_is_float": ([(S, "int32", "i"), (S, "int32", "i")],
                         lambda x, y: x / (y * y + 1), lambda x, y: x / (y * y + 1), 1e-6),
    "reshape": ([(S, "float32", "n")], lambda x: x.reshape((5, -1)).reshape((2, 30)), lambda x: x.reshape(5, -1).reshape(2, 30), 0),
    "permute": ([(S, "float32", "n")], lambda x: x.permute((2, 0, 1)), lambda x: x.permute(2, 0, 1), 0),
    "transpose_T": ([(S, "float32", "n")], lambda x: x.transpose(0, 2).T, lambda x: x.transpose(0, 2).transpose(-2, -1), 0),
    "expand": ([((3, 1, 5), "float32", "n")], lambda x: x.expand((2, 3, 4, 5)), lambda x: x.expand(2, 3, 4, 5), 0),
    "expand_minus1": ([((3, 1, 5), "float32", "n")], lambda x: x.expand((3, 4, -1)), lambda x: x.expand(3, 4, -1), 0),
    "unsqueeze_squeeze": ([((3, 1, 5), "float32", "n")], lambda x: x.unsqueeze(-1).unsqueeze(0).squeeze(),
                          lambda x: x.unsqueeze(-1).unsqueeze(0).squeeze(), 0),
    "squeeze_axis": ([((3, 1, 5), "float32", "n")], lambda x: x.squeeze(1).squeeze(0), lambda x: x.squeeze(1).squeeze(0), 0),
    "slice": ([(S, "float32", "n")], lambda x: x.slice(1, 1, None, 2).slice(2, -4, -1),
              lambda x: x[:, 1::2, -4:-1], 0),
    "slice_negative_step": ([(S, "float32", "n")], lambda x: x.slice(2, None, None, -2),
                            lambda x: x.flip(2)[:, :, ::2], 0),
    "select": ([(S, "float32", "n")], lambda x: x.select(1, -1).select(0, 2), lambda x: x[:, -1][2], 0),
    "flip": ([(S, "float32", "n")], lambda x: x.flip(0).flip(-1), lambda x: x.flip(0, -1), 0),
    "movedim": ([(S, "float32", "n")], lambda x: x.movedim(0, -1), lambda x: x.movedim(0, -1), 0),
    "gather": ([(S, "float32", "n"), ((3, 6, 5), "int64", ("idx", 4))], lambda x, i: x.gather(1, i),
               lambda x, i: torch.gather(x, 1, i), 0),
    "gather_smaller_index": ([(S, "float32", "n"), ((2, 4, 3), "int64", ("idx", 5))], lambda x, i: x.gather(2, i),
                             lambda x, i: torch.gather(x, 2, i), 0),
    "index_select": ([(S, "float32", "n"), ((2, 3), "int64", ("idx", 4))], lambda x, i: x.index_select(1, i),
                     lambda x, i: x[:, i], 0),
    "pad": ([(S, "float32", "n")], lambda x: x.pad(1, 2, 1, value=-3.0), lambda x: F.pad(x, (0, 0, 2, 1), value=-3.0), 0),
    "pad_int": ([(S, "int64", "i")], lambda x: x.pad(2, 0, 3), lambda x: F.pad(x, (0, 3)), 0),
    "cat": ([((3, 2, 5), "float32", "n"), (S, "float32", "n"), ((3, 1, 5), "float32", "n")],
            lambda a, b, c: cat([a, b, c], 1), lambda a, b, c: torch.cat([a, b, c], 1), 0),
    "cat_promotes": ([((2, 3), "int32", "i"), ((2, 3), "float32", "n")], lambda a, b: cat([a, b], -1),
                     lambda a, b: torch.cat([a, b], -1), 0),
    "stack": ([(S, "float32", "n"), (S, "float32", "n")], lambda a, b: stack([a, b], 2),
              lambda a, b: torch.stack([a, b], 2), 0),
    "cumsum": ([(S, "float32", "n")], lambda x: x.cumsum(1), lambda x: x.cumsum(1), 1e-12),
    "cumsum_int": ([(S, "int32", "i")], lambda x: x.cumsum(-1), lambda x: x.cumsum(-1, dtype=torch.int32), 0),
    "argmax": ([(S, "int64", "i")], lambda x: x.argmax(1), lambda x: x.argmax(1), 0),  # ints: ties, first wins
    "argmax_float_keepdim": ([(S, "float32", "n")], lambda x: x.argmax(-1, keepdim=True),
                             lambda x: x.argmax(-1, keepdim=True), 0),
    "sum_mean": ([(S, "float32", "n")], lambda x: x.sum((0, 2)) + x.mean(1, keepdim=True).mean(),
                 lambda x: x.sum((0, 2)) + x.mean(1, keepdim=True).mean(), 1e-12),
    "mean_int": ([(S, "int32", "i")], lambda x: x.mean(), lambda x: x.double().mean(), 1e-6),
    "var": ([(S, "float32", "n")], lambda x: x.var(1, keepdim=True) + x.var((0, 2), correction=0, keepdim=True),
            lambda x: x.var(1, keepdim=True) + x.var((0, 2), correction=0, keepdim=True), 1e-12),
    "min_max": ([(S, "float32", "n")], lambda x: x.max(0) - x.min(2).max(0, keepdim=True).T,
                lambda x: x.amax(0) - x.amin(2).amax(0, keepdim=True).T, 0),
    "min_max_int": ([(S, "int64", "i")], lambda x: x.max(-1) * 10 + x.min(), lambda x: x.amax(-1) * 10 + x.min(), 0),
    "any_all": ([(S, "int32", "i"), (S, "bool", "b")], lambda x, b: (x - 8).any(1) & b.all(0).T.any(1).unsqueeze(0) | (x > 7).all(),
                lambda x, b: (x - 8).any(1) & b.all(0).T.any(1).unsqueeze(0) | (x > 7).all(), 0),
    "min_max_bool": ([(S, "bool", "b")], lambda b: b.min(1) | b.max(0).T.max(1).unsqueeze(0),
                     lambda b: b.amin(1) | b.amax(0).T.amax(1).unsqueeze(0), 0),
    "softmax": ([(S, "float32", "n")], lambda x: x.softmax(1), lambda x: x.softmax(1), 1e-12),
    "log_softmax": ([(S, "float32", "n")], lambda x: x.log_softmax(-1), lambda x: x.log_softmax(-1), 1e-12),
    "logsumexp": ([(S, "float32", "n")], lambda x: x.logsumexp(1), lambda x: x.logsumexp(1), 1e-12),
    "layer_norm": ([(S, "float32", "n")], lambda x: x.layer_norm(1e-5), lambda x: F.layer_norm(x, (5,), eps=1e-5), 1e-12),
    "rms_norm": ([(S, "float32", "n")], lambda x: x.rms_norm(1e-6), lambda x: F.rms_norm(x, (5,), eps=1e-6), 1e-12),
    "matmul_broadcast": ([((2, 1, 3, 4), "float32", "n"), ((5, 4, 2), "float32", "n")], lambda a, b: a @ b,
                         lambda a, b: a @ b, 1e-12),
    "matmul_vectors": ([((4,), "float32", "n"), ((3, 4, 2), "float32", "n")], lambda a, b: a @ b,
                       lambda a, b: a @ b, 1e-12),
    "exp_log": ([(S, "float32", "p")], lambda x: x.exp() + x.log() + x.log2() + x.exp2(),
                lambda x: x.exp() + x.log() + x.log2() + x.exp2(), 1e-12),
    "sin_cos_sqrt_rsqrt": ([(S, "float32", "p")], lambda x: x.sin() + x.cos() + x.sqrt() + x.rsqrt(),
                           lambda x: x.sin() + x.cos() + x.sqrt() + x.rsqrt(), 1e-12),
    "erf": ([(S, "float32", "n")], lambda x: (x * 2).erf(), lambda x: torch.erf(x * 2), 1e-6),
    "gelu": ([(S, "float32", "n")], lambda x: (x * 3).gelu(), lambda x: F.gelu(x * 3), 1e-6),
    "gelu_tanh": ([(S, "float32", "n")], lambda x: (x * 3).gelu("tanh"), lambda x: F.gelu(x * 3, approximate="tanh"), 1e-12),
    "tanh": ([(S, "float32", "n")], lambda x: (x * 30).tanh(), lambda x: torch.tanh(x * 30), 1e-12),
    "sigmoid_silu": ([(S, "float32", "n")], lambda x: (x * 30).sigmoid() + x.silu(),
                     lambda x: torch.sigmoid(x * 30) + F.silu(x), 1e-12),
    "relu_clamp": ([(S, "float32", "n")], lambda x: x.relu() + x.clamp(-0.5, 0.7) + x.clamp(hi=0.1),
                   lambda x: x.relu() + x.clamp(-0.5, 0.7) + x.clamp(max=0.1), 0),
    "pow_int": ([(S, "float32", "n")], lambda x: x.pow(3) + x.pow(2) * x.pow(0) - x.pow(-2),
                lambda x: x.pow(3) + x.pow(2) * x.pow(0) - x.pow(-2), 1e-12),
    "pow_frac": ([(S, "float32", "p")], lambda x: x.pow(0.5) + x.pow(-0.5) + x.pow(2.5) + x.pow(x),
                 lambda x: x.pow(0.5) + x.pow(-0.5) + x.pow(2.5) + x.pow(x), 1e-12),
    "floor_ceil_trunc": ([(S, "float32", "n")], lambda x: (x * 3).floor() * 100 + (x * 3).ceil() * 10 + (x * 3).trunc(),
                         lambda x: (x * 3).floor() * 100 + (x * 3).ceil() * 10 + (x * 3).trunc(), 0),
    "floor_mod": ([(S, "float32", "n"), (S, "float32", "n")], lambda x, y: x.floor_mod(y), lambda x, y: x % y, 1e-12),
    "floor_mod_int": ([(S, "int32", "i"), ((5,), "int32", "nz")], lambda x, y: x.floor_mod(y), lambda x, y: x % y, 0),
    "trunc_mod_int": ([(S, "int64", "i"), ((5,), "int64", "nz")], lambda x, y: x % y, lambda x, y: torch.fmod(x, y), 0),
    "maximum_minimum": ([(S, "float32", "n"), ((5,), "float32", "n")], lambda x, y: x.maximum(y) + x.minimum(y) * 10,
                        lambda x, y: torch.maximum(x, y) + torch.minimum(x, y) * 10, 0),
    "abs_sign": ([(S, "float32", "n")], lambda x: x.abs() + x.sign() * 10, lambda x: x.abs() + x.sign() * 10, 0),
    "abs_sign_int": ([(S, "int32", "i")], lambda x: x.abs() + x.sign() * 100, lambda x: x.abs() + x.sign() * 100, 0),
    "logical": ([(S, "bool", "b"), (S, "bool", "b")], lambda a, b: [a & b, a | b, a ^ b, ~a],
                lambda a, b: [a & b, a | b, a ^ b, ~a], 0),
    "compare_float": ([(S, "float32", "n"), ((4, 1), "float32", "n")],
                      lambda x, y: [x < y, x > y, x <= y, x >= y, x.eq(y), x.ne(y), x < 0.5, x >= 0],
                      lambda x, y: [x < y, x > y, x <= y, x >= y, x == y, x != y, x < 0.5, x >= 0], 0),
    "compare_int": ([(S, "int32", "i"), (S, "int32", "i")],
                    lambda x, y: [x < y, x > y, x <= y, x >= y, x.eq(y), x.ne(y), x.eq(3)],
                    lambda x, y: [x < y, x > y, x <= y, x >= y, x == y, x != y, x == 3], 0),
    "where": ([(S, "bool", "b"), (S, "float32", "n")], lambda c, x: Tensor.where(c, x, 0.5) + Tensor.where(c, 1.0, x),
              lambda c, x: torch.where(c, x, 0.5) + torch.where(c, 1.0, x), 0),
    "bool_times_int": ([(S, "bool", "b")], lambda b: b * 2 + 1, lambda b: b * 2 + 1, 0),
}


def _make_input(spec, rng):
    shape, dt, kind = spec
    if isinstance(kind, tuple):
        return _idx(rng, kind[1], shape)
    if kind == "p":
        return rand(shape, dt, rng, 0.2, 3.0)
    if kind == "nz":
        x = rand(shape, dt, rng)
        return np.where(x == 0, 5, x).astype(x.dtype)
    return rand(shape, dt, rng)


def _torch_ref(fn, xs):
    ts = [torch.from_numpy(x.astype(np.float64) if x.dtype.kind == "f" else x) for x in xs]
    out = fn(*ts)
    return [o.numpy() for o in (out if isinstance(out, list) else [out])]


@pytest.mark.parametrize("name", sorted(CASES))
def test_tensor_method(name, rng):
    specs, build, ref, tol = CASES[name]
    b = GraphBuilder()
    ins = [b.input(f"x{i}", s, d) for i, (s, d, _) in enumerate(specs)]
    out = build(*ins)
    outs = out if isinstance(out, list) else [out]
    g = b.build(outs)
    xs = [_make_input(s, rng) for s in specs]
    got = evaluate(g, xs, dtype=np.float64)
    want = _torch_ref(ref, xs)
    for k, (a, w) in enumerate(zip(got, want)):
        assert a.shape == w.shape, f"{name}[{k}]: shape {a.shape} != torch {w.shape}"
        if w.dtype.kind in "biu":
            assert a.dtype.kind == w.dtype.kind, f"{name}[{k}]: dtype {a.dtype} vs torch {w.dtype}"
            assert np.array_equal(a, w), f"{name}[{k}]: {a} != {w}; {rng.tag}"
        else:
            assert a.dtype.kind == "f", f"{name}[{k}]: dtype {a.dtype} vs torch {w.dtype}"
            e = rel_err(a, w)
            assert e <= tol, f"{name}[{k}]: relative error {e:.3g} > {tol}; {rng.tag}"


# --- nan / inf behaviour matches torch -------------------------------------------------------

NAN_CASES = {
    "eq": (lambda x, y: x.eq(y), lambda x, y: x == y),
    "ne": (lambda x, y: x.ne(y), lambda x, y: x != y),
    "le": (lambda x, y: x <= y, lambda x, y: x <= y),
    "ge": (lambda x, y: x >= y, lambda x, y: x >= y),
    "maximum": (lambda x, y: x.maximum(y), torch.maximum),
    "minimum": (lambda x, y: x.minimum(y), torch.minimum),
    "any": (lambda x, y: x.any(0), lambda x, y: x.any(0)),
    "all": (lambda x, y: x.all(0), lambda x, y: x.all(0)),
    "relu": (lambda x, y: x.relu(), lambda x, y: torch.relu(x)),
    "clamp": (lambda x, y: x.clamp(-1.0, 1.0), lambda x, y: x.clamp(-1.0, 1.0)),
    "abs": (lambda x, y: x.abs(), lambda x, y: x.abs()),
    "floor_ceil_trunc": (lambda x, y: [x.floor(), x.ceil(), x.trunc()], lambda x, y: [x.floor(), x.ceil(), x.trunc()]),
}


@pytest.mark.parametrize("name", sorted(NAN_CASES))
def test_nan_and_inf_follow_torch(name):
    v = [math.nan, 1.0, -2.0, 0.0, math.inf, -math.inf, math.nan, 2.5]
    w = [1.0, math.nan, -2.0, 0.0, math.inf, 3.0, math.nan, -math.inf]
    build, ref = NAN_CASES[name]
    b = GraphBuilder()
    x, y = b.input("x", (8,), "float32"), b.input("y", (8,), "float32")
    out = build(x, y)
    g = b.build(out if isinstance(out, list) else [out])
    xs = [np.array(v, np.float32), np.array(w, np.float32)]
    got = evaluate(g, xs)
    want = _torch_ref(lambda a, c: ref(a.float(), c.float()), xs)
    for a, e in zip(got, want):
        assert np.array_equal(a, e, equal_nan=a.dtype.kind == "f"), f"{name}: {a} != torch {e}"


# --- errors ----------------------------------------------------------------------------------

def test_builder_errors_name_the_problem():
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    for fn, needle in [
        (lambda: x.reshape((5, 3)), "reshape"),
        (lambda: x.permute((0, 0)), "permutation"),
        (lambda: x.expand((3, 5)), "expand"),
        (lambda: x.expand((4,)), "lower-rank"),
        (lambda: x.select(0, 3), "out of range"),
        (lambda: x.sum(2), "out of range"),
        (lambda: ~x, "bool"),
        (lambda: -(x < 0), "bool"),
        (lambda: x + b.input("y", (2, 4), "float32"), "broadcast"),
        (lambda: cat([x, b.input("z", (2, 5), "float32")], 0), "cat"),
    ]:
        with pytest.raises(IRError, match=needle):
            fn()


# --- view composition ------------------------------------------------------------------------

def _np_view(arr, v):
    kind, args = v
    if kind == "reshape":
        return arr.reshape(args)
    if kind == "permute":
        return arr.transpose(args)
    if kind == "expand":
        return np.broadcast_to(arr, args)
    if kind == "slice":
        axis, start, stop, step = args
        sl = [slice(None)] * arr.ndim
        sl[axis] = slice(start, stop, step)
        return arr[tuple(sl)]
    if kind == "flip":
        return np.flip(arr, args)
    raise AssertionError(kind)


def _ir_view(t, v):
    kind, args = v
    if kind == "reshape":
        return t.reshape(args)
    if kind == "permute":
        return t.permute(args)
    if kind == "expand":
        return t.expand(args)
    if kind == "slice":
        return t.slice(*args)
    return t.flip(args)


@st.composite
def view_chains(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    cur = shape
    chain = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["reshape", "permute", "expand", "slice", "flip"]))
        rank = len(cur)
        if kind == "reshape":
            n = shapes.numel(cur)
            divs = [d for d in range(1, n + 1) if n % d == 0]
            a = draw(st.sampled_from(divs))
            b = draw(st.sampled_from([d for d in divs if (n // a) % d == 0]))
            args = new = tuple(draw(st.permutations((a, b, n // a // b))))
        elif kind == "permute":
            args = tuple(draw(st.permutations(range(rank))))
            new = tuple(cur[d] for d in args)
        elif kind == "expand":
            lead = draw(st.integers(0, 1))
            new = (draw(st.integers(1, 3)),) * lead + tuple(
                draw(st.integers(2, 3)) if n == 1 else n for n in cur)
            args = new
        elif kind == "slice":
            axis = draw(st.integers(0, rank - 1))
            n = cur[axis]
            start = draw(st.integers(0, n - 1))
            stop = draw(st.integers(start + 1, n))
            step = draw(st.integers(1, 2))
            args = (axis, start, stop, step)
            new = cur[:axis] + (len(range(start, stop, step)),) + cur[axis + 1:]
        else:
            args = draw(st.integers(0, rank - 1))
            new = cur
        chain.append((kind, args))
        cur = new
    return shape, chain


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(view_chains())
def test_composed_views_equal_views_applied_one_by_one(case):
    shape, chain = case
    b = GraphBuilder()
    x = b.input("x", shape, "int64")
    t = x
    for v in chain:
        t = _ir_view(t, v)
    g = b.build([t])
    arr = np.arange(shapes.numel(shape), dtype=np.int64).reshape(shape) * 7 + 3
    want = arr
    for v in chain:
        want = _np_view(want, v)
    (got,) = evaluate(g, [arr])
    assert np.array_equal(got, want), (shape, chain, g.dump())
    assert all(n.op in ("Input", "View") for n in g.nodes)
    assert g.op_counts()["View"] <= len(chain)


def test_permute_of_reshape_of_contiguous_is_one_view():
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4, 5), "float32")
    y = x.reshape((6, 20)).reshape((6, 4, 5)).permute((2, 0, 1)).reshape((5, 24)).slice(1, 2, 20, 3).unsqueeze(0)
    y = y.expand((3, 5, 6))
    g = b.build([y])
    assert g.op_counts()["View"] == 1, g.dump()
    arr = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    want = np.broadcast_to(arr.reshape(6, 4, 5).transpose(2, 0, 1).reshape(5, 24)[:, 2:20:3][None], (3, 5, 6))
    assert np.array_equal(evaluate(g, [arr])[0], want)


def test_identity_views_add_no_node():
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    assert x.reshape((3, 4)).id == x.id
    assert x.permute((0, 1)).id == x.id
    assert x.T.T.id == x.id
    assert x.slice(0, 0, 3).id == x.id


# --- CSE -------------------------------------------------------------------------------------

def test_cse_shares_identical_expressions():
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    e1 = (x * 2.0 + 1.0).exp().sum(-1)
    n = len(b.nodes)
    e2 = (x * 2.0 + 1.0).exp().sum(-1)
    assert e1.id == e2.id and len(b.nodes) == n
    g = b.build([e1, e2])
    assert g.outputs[0] == g.outputs[1]
    assert len(g.nodes) == len(b.build([e1]).nodes)


def test_cse_keeps_distinct_constants_apart():
    """0.0 and -0.0 (and 1 vs 1.0 vs True) compare equal in python but are different IR constants."""
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    pz, nz = b.constant(0.0, "float32", (3,)), b.constant(-0.0, "float32", (3,))
    assert pz.id != nz.id
    g = b.build([(x * 0.0 + pz).recip(), (x * 0.0 + nz).recip(), (pz + x).recip(), (nz + x).recip()])
    a, c, _, _ = evaluate(g, [np.ones(3, np.float32)])
    assert np.all(a == np.inf) and np.all(c == np.inf)  # 0*1 + (+-0) = +0 in both: recip +inf
    (r1, r2) = evaluate(b.build([pz.recip(), nz.recip()]), [np.ones(3, np.float32)])
    assert np.all(r1 == np.inf) and np.all(r2 == -np.inf)


# --- half precision: composites round once, like torch's float32 opmath ---------------------

HALF_CASES = {
    "exp": (lambda x: x.exp(), torch.exp),
    "gelu": (lambda x: x.gelu(), F.gelu),
    "gelu_tanh": (lambda x: x.gelu("tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "sigmoid_silu_tanh": (lambda x: [x.sigmoid(), x.silu(), x.tanh()], lambda x: [torch.sigmoid(x), F.silu(x), torch.tanh(x)]),
    "softmax_log_softmax": (lambda x: [x.softmax(-1), x.log_softmax(-1)], lambda x: [x.softmax(-1), x.log_softmax(-1)]),
    "norms": (lambda x: [x.layer_norm(1e-5), x.rms_norm(1e-6)],
              lambda x: [F.layer_norm(x, (16,), eps=1e-5), F.rms_norm(x, (16,), eps=1e-6)]),
}


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(HALF_CASES))
def test_half_composites_match_torch_half(name, dt, rng):
    build, ref = HALF_CASES[name]
    b = GraphBuilder()
    x = b.input("x", (8, 16), dt)
    out = build(x)
    outs = out if isinstance(out, list) else [out]
    g = b.build(outs)
    tdt = getattr(torch, dt)
    xt = (torch.from_numpy(rng.gen.standard_normal((8, 16))) * 4).to(tdt)
    got = evaluate(g, [xt])
    want = ref(xt)
    for a, w in zip(got, want if isinstance(want, list) else [want]):
        assert str(a.dtype) == dt
        e = rel_err(a.astype(np.float32), w.float().numpy())
        assert e <= {"float16": 2e-3, "bfloat16": 1.6e-2}[dt], f"{name} {dt}: {e:.3g}; {rng.tag}"


def test_tensor_knows_its_builder_and_is_one_class():
    """Every handle is a Tensor (all mixins) whatever method made it; ``b`` is the old name of ``builder``."""
    b = GraphBuilder()
    x = b.input("x", (2, 3), "float32")
    made = [x, x + 1, x.exp(), x.T, x @ x.T, x.softmax(), cat([x, x], 0), Tensor.where(x < 0, x, 0.0)]
    assert all(type(t) is Tensor and t.builder is b for t in made)
