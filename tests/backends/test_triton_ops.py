"""Every primitive, View and idiom through the Triton backend matches ir.evaluate.

Runs in Triton's interpreter on the CPU (tiny shapes: ~1 ms per program
instance) unless EGRAFT_TEST_DEVICE=cuda.  Inputs are random with a fresh
seed per run (printed on failure).
"""

from __future__ import annotations

import numpy as np
import pytest
from triton_helpers import DEVICE, check, require_mode, rng

from egraft.ir import IDIOMS, PRIMITIVES, GraphBuilder, Tensor, cat
from egraft.testing import random_array

pytestmark = pytest.mark.usefixtures("_mode")


@pytest.fixture
def _mode():
    require_mode()


def _pos(x):
    return x * x + 0.5


# --- elementwise primitives ---------------------------------------------------------------
UNARY = {
    "Exp2": lambda x: x.exp2(),
    "Log2": lambda x: _pos(x).log2(),
    "Sin": lambda x: (x * 3.0).sin(),
    "Sqrt": lambda x: _pos(x).sqrt(),
    "Recip": lambda x: _pos(x).recip(),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("shape", [(5,), (3, 7, 33)])
def test_unary(op, shape):
    b = GraphBuilder()
    x = b.input("x", shape, "float32")
    check(b.build([UNARY[op](x)]))


@pytest.mark.parametrize("dt", ["float32", "int64", "int32"])
def test_binary_broadcast(dt):
    b = GraphBuilder()
    x = b.input("x", (3, 1, 6), dt)
    y = b.input("y", (4, 6), dt)
    z = x + y
    outs = [z, x * y, x < y, (z * 2) + 1]
    check(b.build(outs))


def test_mod_is_truncated_for_ints_and_floats():
    r, seed = rng()
    b = GraphBuilder()
    a = b.input("a", (4, 9), "int64")
    d = b.input("d", (4, 9), "int64")
    f = b.input("f", (4, 9), "float32")
    g = b.build([a % d, f % 0.75, (-f) % 0.75])
    dv = r.integers(1, 5, (4, 9)) * r.choice([-1, 1], (4, 9))
    check(g, [r.integers(-20, 20, (4, 9)), dv.astype(np.int64), random_array((4, 9), "float32", r) * 3], seed=seed)


def test_bool_add_mul_lessthan_where():
    b = GraphBuilder()
    p = b.input("p", (6, 5), "bool")
    q = b.input("q", (5,), "bool")
    x = b.input("x", (6, 5), "float32")
    outs = [p | q, p & q, b.add("LessThan", (p, q.expand((6, 5)))), Tensor.where(p & q, x, -x), ~p]
    check(b.build(outs))


def test_where_with_broadcast_condition_and_inf():
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    c = b.input("c", (1, 8), "bool")
    check(b.build([Tensor.where(c, x, float("-inf")), Tensor.where(x > 0, x, 0.0)]))


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("float32", "int64"), ("int64", "float32"),
                                     ("float32", "bool"), ("bool", "float32"), ("int32", "int64"),
                                     ("float32", "float16"), ("float16", "float32"), ("int64", "bool")])
def test_cast(src, dst):
    b = GraphBuilder()
    x = b.input("x", (3, 10), src)
    y = x * 3 if src not in ("bool",) else x
    check(b.build([y.cast(dst)]))


def test_iota_and_scalar_constants():
    b = GraphBuilder()
    x = b.input("x", (4, 6), "float32")
    i = b.iota(6, "int64")
    j = b.iota(4, "float32")
    outs = [x + i.cast("float32"), i * 3, j.reshape((4, 1)) * x, b.constant(2.5, "float32", (2, 3)) + 0.0]
    check(b.build(outs))


def test_tensor_constant():
    r, seed = rng()
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    c = b.tensor_constant(random_array((3, 4), "float32", r))
    check(b.build([x * c + c.sum(1, keepdim=True)]), seed=seed)


def test_gather_and_index_select():
    r, seed = rng()
    b = GraphBuilder()
    x = b.input("x", (5, 7), "float32")
    idx = b.input("idx", (5, 3), "int64")
    e = b.input("e", (4,), "int32")
    table = b.input("table", (10, 6), "float32")
    outs = [x.gather(1, idx), (x * 2).gather(1, idx) + 1.0, table.index_select(0, e)]
    g = b.build(outs)
    xs = [random_array((5, 7), "float32", r), r.integers(0, 7, (5, 3)).astype(np.int64),
          r.integers(0, 10, (4,)).astype(np.int32), random_array((10, 6), "float32", r)]
    check(g, xs, seed=seed)


def test_pad_and_cat_are_iota_gather_where():
    b = GraphBuilder()
    x = b.input("x", (3, 5), "float32")
    y = b.input("y", (3, 2), "float32")
    check(b.build([x.pad(1, 2, 1, value=-1.0), cat([x, y * 2.0, x], axis=1), cat([x, x], axis=0)]))


# --- views ------------------------------------------------------------------------------------
def test_views_of_inputs_transpose_flip_slice_offset():
    b = GraphBuilder()
    x = b.input("x", (4, 6, 5), "float32")
    outs = [
        x.permute((2, 0, 1)),
        x.flip(1),  # negative stride, positive offset
        x.slice(2, 1, 5, 2).slice(0, 3, 0, -1),  # step slices, negative step
        x.select(1, 3),
        x.reshape((24, 5)).T,
        x.slice(1, 2, 3).expand((4, 3, 5)),
    ]
    check(b.build(outs))


def test_views_of_computed_values():
    b = GraphBuilder()
    x = b.input("x", (4, 6), "float32")
    y = (x * 2.0).exp2()  # computed: views of it are index arithmetic inside the consumer kernel
    outs = [
        y.T + 1.0,
        y.flip(0).flip(1) * x,
        y.reshape((2, 2, 6)).permute((2, 1, 0)).reshape((6, 4)) + 0.0,  # merging reshape: divmod path
        y.reshape((24,)).slice(0, 3, 20, 4) * 1.0,
        b.view(y, (3, 2), (-6, 2), 19) + 0.0,  # hand-written negative-stride view with offset
    ]
    check(b.build(outs))


# --- reductions ----------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_sum_max_reduce_each_axis(axis):
    b = GraphBuilder()
    x = b.input("x", (3, 5, 7), "float32")
    check(b.build([x.sum(axis), x.max(axis), (x * x).sum(axis) * 0.5]))


def test_reductions_int_bool_and_long_axis_loop():
    b = GraphBuilder()
    x = b.input("x", (3, 300), "float32")
    i = b.input("i", (4, 9), "int32")
    p = b.input("p", (4, 9), "bool")
    outs = [x.sum(1), x.max(1), i.sum(0), i.max(1), p.any(1), b.add("MaxReduce", (p,), axis=0)]
    g = b.build(outs)
    check(g, knobs={"tile_elems": 64})  # a 64-element tile: the 300-long axis runs as a loop
    check(g)


def test_reduce_all_and_keepdim_epilogues():
    b = GraphBuilder()
    x = b.input("x", (6, 10), "float32")
    check(b.build([x.sum(), x.mean(1, keepdim=True) - 1.0, x.var(1), x.argmax(1), x.logsumexp(1)]))


# --- idioms ------------------------------------------------------------------------------------------
def _idiom(b, op, ins, **attrs):
    return b.add(op, ins, **attrs)


@pytest.mark.parametrize("op", ["Softmax", "LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("axis", [2, 1])
def test_row_idioms(op, axis):
    b = GraphBuilder()
    x = b.input("x", (2, 6, 20), "float32")
    attrs = {"axis": axis} if op == "Softmax" else {"axis": axis, "eps": 1e-5}
    y = _idiom(b, op, (x * 1.5,), **attrs)
    ex = check(b.build([y * 2.0 + 1.0]))
    if axis == 2:
        assert len(ex.kernels) == 1, "a row idiom with its prologue and epilogue is one kernel"


@pytest.mark.parametrize("form", ["idiom", "primitive"])
def test_softmax_and_norms_primitive_form_are_one_kernel(form):
    b = GraphBuilder()
    x = b.input("x", (3, 5, 24), "float32")
    if form == "primitive":
        outs = [x.softmax(-1), x.layer_norm(1e-5), x.rms_norm(1e-6)]
    else:
        outs = [_idiom(b, "Softmax", (x,), axis=2), _idiom(b, "LayerNorm", (x,), axis=2, eps=1e-5),
                _idiom(b, "RMSNorm", (x,), axis=2, eps=1e-6)]
    ex = check(b.build(outs))
    assert len(ex.kernels) == 3, [k.name for k in ex.kernels]


@pytest.mark.parametrize("form", ["idiom", "primitive"])
@pytest.mark.parametrize("shape", [((2, 5, 12), (2, 12, 7)), ((20, 33), (33, 18))])
def test_matmul(form, shape):
    b = GraphBuilder()
    a = b.input("a", shape[0], "float32")
    w = b.input("w", shape[1], "float32")
    y = _idiom(b, "MatMul", (a, w)) if form == "idiom" else a.matmul(w)
    ex = check(b.build([y]))
    assert [k.kind for k in ex.kernels] == ["dot"]


def test_linear_with_fused_epilogue_and_prologue():
    b = GraphBuilder()
    x = b.input("x", (2, 6, 16), "float32")
    w = b.input("w", (24, 16), "float32")  # torch layout [out, in]: the transpose is a view
    bias = b.input("bias", (24,), "float32")
    res = b.input("res", (2, 6, 24), "float32")
    scale = b.input("scale", (2, 6, 1), "float32")
    y = ((x * 0.5).matmul(w.T) + bias).gelu("tanh") * scale + res
    ex = check(b.build([y]))
    assert [k.kind for k in ex.kernels] == ["dot"], "bias, activation, row scale and residual fuse into the matmul"


def _attention_case(causal, bias, gqa, sq=6, sk=6, d=8):
    b = GraphBuilder()
    h, kvh = 4, (2 if gqa else 4)
    q = b.input("q", (2, h, sq, d), "float32")
    k = b.input("k", (2, kvh, sk, d), "float32")
    v = b.input("v", (2, kvh, sk, d), "float32")
    if gqa:  # repeat_interleave of kv heads as views
        k = k.unsqueeze(2).expand((2, kvh, h // kvh, sk, d)).reshape((2, h, sk, d))
        v = v.unsqueeze(2).expand((2, kvh, h // kvh, sk, d)).reshape((2, h, sk, d))
    ins = [q, k, v]
    if bias:
        ins.append(b.input("bias", (2, h, sq, sk), "float32"))
    return b, ins


@pytest.mark.parametrize("causal,bias,gqa", [(False, False, False), (True, False, True), (False, True, False),
                                             (True, True, True)])
def test_attention_idiom_single_kernel(causal, bias, gqa):
    b, ins = _attention_case(causal, bias, gqa, sq=6, sk=9 if not causal else 6)
    y = b.add("Attention", tuple(ins), scale=0.35, causal=causal)
    ex = check(b.build([y]))
    assert [k.kind for k in ex.kernels] == ["attention"]


def test_attention_primitive_form_matches():
    b, ins = _attention_case(True, False, True)
    from egraft.ir.idioms import attention_decomposed

    check(b.build([attention_decomposed(*ins, causal=True)]))


def test_every_idiom_and_primitive_has_a_rule():
    from egraft.backends.triton import RULES

    missing = (set(PRIMITIVES) | set(IDIOMS) | {"View", "Input", "Constant"}) - set(RULES)
    assert not missing


# --- float16 -------------------------------------------------------------------------------------------
def test_float16_elementwise_reduce_matmul_softmax():
    b = GraphBuilder()
    x = b.input("x", (4, 16), "float16")
    w = b.input("w", (16, 24), "float16")
    y = x.matmul(w)
    outs = [(x * 2.0).exp2() + 1.0, x.sum(1), y, b.add("Softmax", (y,), axis=1), x.cast("float32") * 3.0]
    check(b.build(outs))


def test_float16_attention():
    b = GraphBuilder()
    q = b.input("q", (1, 2, 5, 16), "float16")
    k = b.input("k", (1, 2, 7, 16), "float16")
    v = b.input("v", (1, 2, 7, 16), "float16")
    check(b.build([b.add("Attention", (q, k, v), scale=0.25, causal=False)]))


def test_device_string():
    assert DEVICE in ("cpu", "cuda")
