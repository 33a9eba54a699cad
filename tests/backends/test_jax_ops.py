"""Every primitive and idiom through the JAX backend matches ir.evaluate on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from jax_helpers import check_graph

from egraft.backends import lower
from egraft.errors import BackendError
from egraft.ir import GraphBuilder
from egraft.ir.builder import Tensor
from egraft.ir.idioms import IDIOMS
from egraft.testing import fresh_seed

SHAPES = [(7,), (3, 5), (2, 3, 4)]
UNARY = ["Exp2", "Log2", "Sin", "Sqrt", "Recip"]
POSITIVE = {"Log2", "Sqrt", "Recip"}


@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op", UNARY)
def test_unary(op, dt):
    seed = fresh_seed()
    for shape in SHAPES:
        b = GraphBuilder()
        x = b.input("x", shape, dt)
        g = b.build([b.add(op, (x,))])
        check_graph(g, seed, positive={"x"} if op in POSITIVE else (), what=f"{op} {shape} {dt}")


@pytest.mark.parametrize("dt", ["float32", "float16", "int32", "int64"])
@pytest.mark.parametrize("op", ["Add", "Mul", "Mod", "LessThan"])
def test_binary(op, dt):
    seed = fresh_seed()
    for shape in SHAPES:
        b = GraphBuilder()
        x = b.input("x", shape, dt)
        y = b.input("y", shape, dt)
        g = b.build([b.add(op, (x, y))])
        if op == "Mod":  # divisor away from zero, both signs (truncated remainder)
            rng = np.random.default_rng(seed)
            xs = (rng.standard_normal(shape) * 10).astype(dt) if dt.startswith("float") else \
                rng.integers(-50, 50, size=shape).astype(dt)
            ys = (rng.choice([-1, 1], size=shape) * rng.uniform(0.5, 3, size=shape)).astype(dt) if dt.startswith("float") \
                else (rng.choice([-1, 1], size=shape) * rng.integers(1, 7, size=shape)).astype(dt)
            ex = lower(g, "jax", "cpu")
            from egraft.ir import evaluate
            from egraft.testing import assert_close
            assert_close(ex(xs, ys), evaluate(g, [xs, ys]), what=f"Mod {shape} {dt} seed={seed}")
        else:
            check_graph(g, seed, what=f"{op} {shape} {dt}")


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_bool_add_mul_are_or_and(op):
    seed = fresh_seed()
    b = GraphBuilder()
    x, y = b.input("x", (4, 6), "bool"), b.input("y", (4, 6), "bool")
    check_graph(b.build([b.add(op, (x, y))]), seed, what=f"bool {op}")


def test_where_and_broadcast_views():
    seed = fresh_seed()
    for dt in ["float32", "int64", "float16"]:
        b = GraphBuilder()
        c = b.input("c", (3, 1), "bool")
        x = b.input("x", (1, 5), dt)
        y = b.input("y", (3, 5), dt)
        out = Tensor.where(c, x, y)  # c and x are broadcast with stride-0 views
        check_graph(b.build([out]), seed, what=f"Where {dt}")


@pytest.mark.parametrize("op", ["SumReduce", "MaxReduce"])
@pytest.mark.parametrize("dt", ["float32", "float16", "int32", "int64"])
def test_reductions(op, dt):
    seed = fresh_seed()
    for shape in SHAPES:
        for axis in range(len(shape)):
            b = GraphBuilder()
            x = b.input("x", shape, dt)
            check_graph(b.build([b.add(op, (x,), axis=axis)]), seed, what=f"{op} {shape} axis={axis} {dt}")


def test_max_reduce_bool_is_any():
    seed = fresh_seed()
    b = GraphBuilder()
    x = b.input("x", (5, 4), "bool")
    check_graph(b.build([b.add("MaxReduce", (x,), axis=1), b.add("MaxReduce", (x,), axis=0)]), seed)


@pytest.mark.parametrize("dt", ["int32", "int64", "float32"])
def test_iota(dt):
    b = GraphBuilder()
    x = b.input("x", (6,), dt)
    check_graph(b.build([b.iota(6, dt) + x, b.iota(1, dt)]), fresh_seed(), what=f"Iota {dt}")


@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_gather_take_along_axis(idt):
    seed = fresh_seed()
    for xshape, ishape, axis in [((5,), (8,), 0), ((4, 6), (4, 3), 1), ((4, 6), (9, 6), 0), ((2, 3, 4), (2, 5, 4), 1)]:
        b = GraphBuilder()
        x = b.input("x", xshape, "float32")
        i = b.input("i", ishape, idt)
        g = b.build([b.add("Gather", (x, i), axis=axis)])
        for peep in (True, False):
            check_graph(g, seed, knobs={"peephole": peep}, index_ranges={"i": xshape[axis]},
                        what=f"Gather {xshape} {ishape} axis={axis}")


def test_index_select_pattern_uses_take():
    """Gather with an index broadcast along the other axes (embedding) becomes jnp.take."""
    seed = fresh_seed()
    b = GraphBuilder()
    table = b.weight("table", np.random.default_rng(seed).standard_normal((11, 6)).astype(np.float32))
    ids = b.input("ids", (2, 5), "int64")
    out = table.index_select(0, ids)
    g = b.build([out])
    ex = check_graph(g, seed, index_ranges={"ids": 11}, what="index_select")
    assert ex.stats["peephole_takes"] == 1
    assert "take_along_axis" not in str(ex.jaxpr())
    ex2 = check_graph(g, seed, knobs={"peephole": False}, index_ranges={"ids": 11}, what="index_select, no peephole")
    assert ex2.stats["peephole_takes"] == 0 and "take_along_axis" in str(ex2.jaxpr())


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("float32", "int64"), ("float32", "bool"),
                                     ("int64", "float32"), ("bool", "float32"), ("float32", "float16"),
                                     ("float16", "float32"), ("float32", "bfloat16"), ("int32", "int64"),
                                     ("int64", "bool"), ("bool", "int64")])
def test_cast(src, dst):
    seed = fresh_seed()
    b = GraphBuilder()
    x = b.input("x", (4, 5), src)
    g = b.build([x.cast(dst)])
    rng = np.random.default_rng(seed)
    from egraft.ir import evaluate
    from egraft.testing import assert_close, random_array
    xs = random_array((4, 5), src, rng)
    if src == "float32":
        xs = (xs * 7).astype(np.float32)
        xs[0, :2] = [0.0, -0.0]  # zero stays false / 0
    assert_close(lower(g, "jax", "cpu")(xs), evaluate(g, [xs]), what=f"Cast {src}->{dst} seed={seed}")


def test_constants_scalar_and_tensor():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    t = b.tensor_constant(rng.standard_normal((3, 4)).astype(np.float32))
    k = b.tensor_constant(np.array([[1, -2, 3, 4]], dtype=np.int64))
    out = x * 2.5 + t + k.cast("float32").expand((3, 4))
    check_graph(b.build([out, b.constant(True, "bool", (2,)), b.constant(7, "int64")]), seed)


# --- idioms --------------------------------------------------------------------

def _idiom_graphs(dt, rng):
    """One small graph per idiom, several shapes each."""
    out = []
    for bs in [(), (2,), (2, 3)]:
        b = GraphBuilder()
        a = b.input("a", bs + (5, 7), dt)
        c = b.input("c", bs + (7, 4), dt)
        out.append(("MatMul", b.build([b.add("MatMul", (a, c))])))
    for shape, axis in [((6,), 0), ((3, 8), 1), ((3, 8), 0), ((2, 3, 5), 1)]:
        for op, attrs in [("Softmax", {}), ("LayerNorm", {"eps": 1e-5}), ("RMSNorm", {"eps": 1e-6})]:
            b = GraphBuilder()
            x = b.input("x", shape, dt)
            out.append((op, b.build([b.add(op, (x,), axis=axis, **attrs)])))
    for bs, sq, sk, causal, bias in [((2,), 4, 4, True, False), ((2, 3), 3, 5, False, True),
                                     ((1,), 6, 6, True, True), ((), 2, 3, False, False)]:
        b = GraphBuilder()
        q = b.input("q", bs + (sq, 8), dt)
        k = b.input("k", bs + (sk, 8), dt)
        v = b.input("v", bs + (sk, 4), dt)
        args = (q, k, v) + ((b.input("bias", bs + (sq, sk), dt),) if bias else ())
        out.append(("Attention", b.build([b.add("Attention", args, scale=0.35, causal=causal)])))
    return out


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("idioms", ["library", "primitive"])
def test_idioms(dt, idioms):
    seed = fresh_seed()
    graphs = _idiom_graphs(dt, np.random.default_rng(seed))
    assert {op for op, _ in graphs} == set(IDIOMS), "add the new idiom to _idiom_graphs"
    for op, g in graphs:
        check_graph(g, seed, knobs={"idioms": idioms}, what=f"{op} {g.input_types()} {idioms}")


def test_matmul_library_call_is_dot_general():
    b = GraphBuilder()
    a = b.input("a", (2, 5, 7), "float32")
    c = b.input("c", (2, 7, 4), "float32")
    ex = check_graph(b.build([b.add("MatMul", (a, c))]), fresh_seed())
    assert "dot_general" in {e.primitive.name for e in ex.jaxpr().jaxpr.eqns}


@pytest.mark.parametrize("knobs", [{"precision": "default"}, {"weights": "constants"},
                                   {"peephole": False, "idioms": "primitive"}])
def test_non_default_knobs(knobs):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (3, 8), "float32")
    w = b.weight("w", rng.standard_normal((8, 6)).astype(np.float32))
    h = (x @ w).softmax(-1)
    g = b.build([b.add("LayerNorm", (h,), axis=1, eps=1e-5), h.argmax(-1)])
    check_graph(g, seed, knobs=knobs, what=str(knobs))


def test_unknown_knob_and_device_are_clear_errors():
    b = GraphBuilder()
    g = b.build([b.input("x", (2,), "float32")])
    with pytest.raises(BackendError, match="no knob 'bogus'"):
        lower(g, "jax", "cpu", {"bogus": 1})
    with pytest.raises(BackendError, match="unknown device"):
        lower(g, "jax", "gpu0")
    import jax

    if not any(d.platform == "gpu" for d in jax.devices()):
        with pytest.raises(BackendError, match="no cuda device"):
            lower(g, "jax", "cuda:0")


def test_torch_in_torch_out():
    import torch

    seed = fresh_seed()
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    ids = b.input("ids", (3,), "int64")
    g = b.build([x.softmax(-1), ids + 1, x.cast("bfloat16")])
    ex = lower(g, "jax", "cpu")
    gen = torch.Generator().manual_seed(seed)
    xt = torch.randn(3, 4, generator=gen)
    it = torch.randint(0, 100, (3,), generator=gen)
    y, j, h = ex(xt, it)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and j.dtype == torch.int64 and h.dtype == torch.bfloat16
    torch.testing.assert_close(y, torch.softmax(xt, -1), rtol=1e-5, atol=1e-6)
    assert torch.equal(j, it + 1)
    assert torch.equal(h, xt.to(torch.bfloat16))
    # run_jax: jax arrays in and out, no conversions
    import jax.numpy as jnp
    outs = ex.run_jax([jnp.asarray(xt.numpy()), jnp.asarray(it.numpy().astype(np.int32))])
    np.testing.assert_allclose(np.asarray(outs[0]), y.numpy(), rtol=1e-6)
    from egraft.errors import InputError
    with pytest.raises(InputError, match="shape"):
        ex(torch.zeros(2, 4), it)
    with pytest.raises(InputError, match="dtype"):
        ex(xt.double(), it)
    # bool and bfloat16 inputs (bfloat16 has no numpy view: it crosses by DLPack), a non-contiguous input
    b2 = GraphBuilder()
    m = b2.input("m", (3, 4), "bool")
    hb = b2.input("h", (3, 4), "bfloat16")
    xf = b2.input("xf", (3, 4), "float32")
    ex2 = lower(b2.build([Tensor.where(m, hb.cast("float32") + xf, 0.0)]), "jax", "cpu")
    mt = torch.rand(3, 4, generator=gen) < 0.5
    ht = torch.randn(3, 4, generator=gen).to(torch.bfloat16)
    xft = torch.randn(4, 3, generator=gen).t()
    (got,) = ex2(mt, ht, xft)
    torch.testing.assert_close(got, torch.where(mt, ht.float() + xft, torch.zeros(())), rtol=1e-6, atol=0)
