"""Program-level behaviour of the JAX backend: matmul peephole, weight folding, integer widths, errors."""

from __future__ import annotations

import numpy as np
import pytest
from jax_helpers import check_graph, jaxpr_primitives

from egraft.backends import get_backend, lower
from egraft.backends.jax import KNOBS
from egraft.errors import InputError
from egraft.runtime import llvm_kernels
from egraft.ir import GraphBuilder, evaluate
from egraft.testing import assert_close, fresh_seed


@pytest.mark.parametrize("a_shape,b_shape", [((5, 7), (7, 3)), ((2, 5, 7), (2, 7, 3)), ((2, 5, 7), (7, 3)),
                                             ((7,), (7, 3)), ((4, 1, 5, 7), (3, 7, 2)), ((5, 7), (7,))])
@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_primitive_matmul_becomes_dot_general(a_shape, b_shape, dt):
    """SumReduce(Mul(expand a, expand b)) must not materialise [.., M, K, N]: it is a dot_general."""
    seed = fresh_seed()
    b = GraphBuilder()
    a = b.input("a", a_shape, dt)
    c = b.input("c", b_shape, dt)
    g = b.build([a @ c])  # the builder's matmul is the primitive form
    assert "MatMul" not in g.op_counts() and g.op_counts()["SumReduce"] == 1
    ex = check_graph(g, seed, what=f"matmul {a_shape}@{b_shape} {dt}")
    assert ex.stats["peephole_dots"] == 1
    assert "dot_general" in jaxpr_primitives(ex) and "reduce_sum" not in jaxpr_primitives(ex)
    off = check_graph(g, seed, knobs={"peephole": False}, what="no peephole")
    assert off.stats["peephole_dots"] == 0 and "dot_general" not in jaxpr_primitives(off)


def test_peephole_on_transposed_weight_and_int_operands():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (3, 4, 8), "float32")
    w = b.weight("w", rng.standard_normal((6, 8)).astype(np.float32))  # Linear weight [out, in]
    i = b.input("i", (4, 5), "int32")
    j = b.input("j", (5, 2), "int32")
    ex = check_graph(b.build([x @ w.T, i @ j]), seed, what="linear + int matmul")
    assert ex.stats["peephole_dots"] == 2


def test_elementwise_product_sum_is_left_alone():
    """A reduce of an un-broadcast product is not a matmul; it must still be right."""
    seed = fresh_seed()
    b = GraphBuilder()
    x, y = b.input("x", (4, 6), "float32"), b.input("y", (4, 6), "float32")
    ex = check_graph(b.build([(x * y).sum(1), (x * x.slice(1, 0, 1).expand((4, 6))).sum(1)]), seed)
    assert ex.stats["peephole_dots"] == 0


def test_weight_only_subgraph_runs_once_at_build():
    """W1 @ W2 and a transposed, scaled weight are folded: the per-call program has no trace of them."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    w1 = b.weight("w1", rng.standard_normal((8, 16)).astype(np.float32))
    w2 = b.weight("w2", rng.standard_normal((16, 6)).astype(np.float32))
    s = b.weight("s", rng.standard_normal((6,)).astype(np.float32))
    merged = (w1 @ w2) * s.exp()  # weight-only: a matmul, an exp and a broadcast multiply
    g = b.build([x @ merged])
    ex = check_graph(g, seed, what="fold")
    assert list(ex.folded) == ["__folded_0"] and ex.folded["__folded_0"].shape == (8, 6)
    prims = jaxpr_primitives(ex)
    assert "exp2" not in prims, "the weight-only exp ran per call"
    assert ex.stats["peephole_dots"] == 1  # only x @ merged is left
    assert ex.program.graph.weight_names() == ["__folded_0"]
    # the folded value is what the reference computes
    np.testing.assert_allclose(ex.folded["__folded_0"], evaluate(b.build([merged]), [np.zeros((4, 8), np.float32)])[0], rtol=1e-6)


def test_a_weight_broadcast_along_rows_then_widened_is_folded_once_and_read_as_stored():
    """Rows times a bfloat16 weight lowered as the weight broadcast along the rows, then widened (a batch's output
    layer): the fold keeps the repeat a view of one widened value (not rows copies), which the generated product
    reads as the stored bfloat16 weight; the result is the reference's."""
    import ml_dtypes

    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows, k, n = 4, 32, 256
    b = GraphBuilder()
    x = b.input("x", (rows, 1, k), "float32")
    w = b.weight("w", rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16))
    wide = b.view(w, (rows, k, n), (0, 1, k)).cast("float32")  # [rows, K, N]: W^T repeated per row, widened
    prod = b.view(x, (rows, 1, k, 1), (k, k, 1, 0)) * b.view(wide, (rows, 1, k, n), (k * n, 0, n, 1))
    g = b.build([prod.sum(2)])
    ex = check_graph(g, seed, knobs={"stream": "llvm", "stream_layout": "rows"}, what="broadcast weight")
    assert all(v.shape == (k, n) for v in ex.folded.values())  # never the [rows, K, N] repeat
    assert f"f32[{rows},{k},{n}]" not in ex.hlo_text()
    if llvm_kernels.available():
        assert [p.kernel.dtype for p in ex.program.plans.values() if getattr(p, "kernel", None)] == ["bfloat16"]


def test_weights_stay_on_device_between_calls():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (2, 8), "float32")
    w = b.weight("w", rng.standard_normal((8, 8)).astype(np.float32))
    ex = lower(b.build([x @ w]), "jax", "cpu")
    import jax

    before = [id(a) for a in ex.weights]
    assert all(isinstance(a, jax.Array) for a in ex.weights)
    ex(rng.standard_normal((2, 8)).astype(np.float32))
    ex(rng.standard_normal((2, 8)).astype(np.float32))
    assert [id(a) for a in ex.weights] == before


def test_int64_values_and_range():
    seed = fresh_seed()
    b = GraphBuilder()
    ids = b.input("ids", (6,), "int64")
    big = b.constant(3_000_000_000, "int64", (6,))  # needs 64 bits: the program runs in x64 scope
    g_small = b.build([ids * 3 + 1, ids.cumsum(0)])
    check_graph(g_small, seed, what="int64")
    ex = lower(g_small, "jax", "cpu")
    assert not ex.program.x64
    with pytest.raises(InputError, match="int32 range"):
        ex(np.array([2**40, 0, 0, 0, 0, 0], dtype=np.int64))
    g_big = b.build([ids + big])
    ex_big = check_graph(g_big, seed, what="int64 beyond int32")
    assert ex_big.program.x64
    import jax

    assert not jax.config.jax_enable_x64, "x64 must never be switched on globally"


def test_float64_graph_runs_in_x64_scope():
    seed = fresh_seed()
    b = GraphBuilder()
    x = b.input("x", (3, 5), "float64")
    g = b.build([(x * 1e-12 + 1.0).log2(), x.softmax(-1)])
    check_graph(g, seed, tol=1e-12, what="float64")


def test_knob_space_and_rule_table():
    be = get_backend("jax")
    b = GraphBuilder()
    g = b.build([b.input("x", (2,), "float32")])
    space = be.knobs(g)
    assert space == {k: list(v) for k, v in KNOBS.items()}
    assert all(len(v) >= 2 for v in space.values())
    assert set(be.devices) == {"cpu", "cuda", "tpu"}
    # a model's worth of weights: never as constants (each candidate would embed its own copy)
    from egraft.backends.jax.executable import CONSTANT_WEIGHTS_MAX

    b = GraphBuilder()
    x, w = b.input("x", (1, 1024), "float32"), b.weight("w", np.ones((1024, CONSTANT_WEIGHTS_MAX // 4096 + 1), "float32"))
    big = be.knobs(b.build([x.matmul(w)]))
    assert big["weights"] == ["arguments"] and {k: v for k, v in big.items() if k != "weights"} == \
        {k: list(v) for k, v in KNOBS.items() if k != "weights"}


def test_outputs_that_are_inputs_or_weights():
    seed = fresh_seed()
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    w = b.weight("w", np.arange(3, dtype=np.float32))
    check_graph(b.build([x, w, x.reshape((1, 3))]), seed)


def test_numpy_input_errors():
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    ex = lower(b.build([x * 2.0]), "jax", "cpu")
    with pytest.raises(InputError, match="takes 1 input"):
        ex()
    with pytest.raises(InputError, match="shape"):
        ex(np.zeros(4, np.float32))
    with pytest.raises(InputError, match="dtype"):
        ex(np.zeros(3, np.float64))
    assert_close(ex(np.ones(3, np.float32)), [np.full(3, 2.0, np.float32)])


def test_pad_and_cat_with_folded_indices_become_slices():
    """Iota+Gather+Where forms of pad / cat / rotate-half: static slices after folding, not gathers."""
    seed = fresh_seed()
    from egraft.ir import cat

    b = GraphBuilder()
    x = b.input("x", (2, 3, 6), "float32")
    y = b.input("y", (2, 3, 4), "float32")
    padded = x.pad(2, 1, 2)  # clamp indices: [0, 0, 1, .., 5, 5, 5]
    rot = cat([-x.slice(2, 3, 6), x.slice(2, 0, 3)], 2)  # rotate_half
    joined = cat([x, y], 2)
    g = b.build([padded, rot, joined])
    ex = check_graph(g, seed, what="pad/cat")
    assert ex.stats["peephole_slices"] >= 3 and ex.stats["peephole_takes"] == 0
    off = check_graph(g, seed, knobs={"peephole": False}, what="pad/cat, no peephole")
    assert off.stats["peephole_slices"] == 0


def test_index_pieces_reconstruct_the_index():
    from egraft.backends.jax.peephole import index_pieces

    rng = np.random.default_rng(fresh_seed())
    for _ in range(300):
        v = [int(a) for a in rng.integers(0, 5, size=int(rng.integers(1, 10)))]
        pieces = index_pieces(v)
        assert [s + k * st for s, n, st in pieces for k in range(n)] == v
        assert all(st in (0, 1) and n >= 1 for _, n, st in pieces)
    assert index_pieces([0, 0, 1, 2, 3, 3]) == ((0, 2, 0), (1, 3, 1), (3, 1, 1))


def _random_matmul_graph(rng):
    """a @ b over random (broadcast, size-1, transposed, sliced) operands, in primitive form."""
    b = GraphBuilder()
    m, k, n = (int(v) for v in rng.integers(1, 6, size=3))
    batch_a = tuple(int(v) for v in rng.choice([1, 2, 3], size=int(rng.integers(0, 3))))
    # a suffix of a's batch dims (broadcasting aligns trailing dims), some of them 1
    batch_b = tuple(1 if (rng.random() < 0.3) else d for d in batch_a)[int(rng.integers(0, len(batch_a) + 1)):]
    x = b.input("x", batch_a + (k + 1, m), "float32")  # stored transposed with an extra row
    y = b.input("y", batch_b + (k, n), "float32")
    a = x.slice(-2, 1, k + 1).transpose(-2, -1)  # [..., m, k], non-contiguous
    c = y.flip(-1) if rng.random() < 0.5 else y
    return b.build([a @ c])


def test_random_matmul_shapes_through_the_peephole():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    for t in range(12):
        g = _random_matmul_graph(rng)
        check_graph(g, seed + t, what=f"random matmul {g.input_types()} (case {t})")


@pytest.mark.parametrize("t", [1, 5])
def test_a_per_row_cache_write_is_one_scatter_of_windows(t):
    """index_copy_ per row (positions [R, T] broadcast over heads and features, through the negative-index wrap)
    scatters whole [H, D] windows: one index per (row, token), not one per element; values as the reference."""
    from egraft.measure.inputs import random_inputs

    r, h, s, d = 3, 2, 11, 4
    b = GraphBuilder()
    cache = b.input("cache", (r, h, s, d), "float32")
    slots = b.input("slots", (r, t), "int64")
    upd = b.input("upd", (r, h, t, d), "float32")
    pos = b.view(slots, (r, h, t, d), (t, 0, 1, 0))
    idx = pos.where(pos < 0, pos + s, pos)  # index_copy_'s wrap of a negative position
    g = b.build([cache.scatter(2, idx, upd) * 2.0])
    for seed in (fresh_seed(), fresh_seed()):
        ins = random_inputs(g, seed)
        assert all(len(set(row)) == t for row in ins[1].tolist())  # distinct slots per row (a Scatter's promise)
        ex = lower(g, "jax", "cpu")
        assert_close(ex(*ins), evaluate(g, ins), ["float32"], what=f"per-row put (seed={seed})")
        assert ex.stats["peephole_puts"] == 1
        scatters = [e for e in ex.jaxpr().jaxpr.eqns if e.primitive.name == "scatter"]
        assert len(scatters) == 1 and scatters[0].invars[1].aval.shape == (r, t, 2)  # (row, slot) per window
        off = lower(g, "jax", "cpu", {"peephole": False})  # negative control: the full grid, one index per element
        assert off.stats["peephole_puts"] == 0
        grid = [e for e in off.jaxpr().jaxpr.eqns if e.primitive.name == "scatter"]
        assert grid and grid[0].invars[1].aval.shape[:-1] == (r, h, t, d)
        assert_close(off(*ins), evaluate(g, ins), ["float32"], what=f"per-row put, full grid (seed={seed})")


def test_an_index_varying_along_every_axis_keeps_the_full_grid():
    from egraft.backends.jax.peephole import find

    b = GraphBuilder()
    x = b.input("x", (2, 5), "float32")
    idx = b.input("idx", (2, 3), "int64")
    upd = b.input("upd", (2, 3), "float32")
    g = b.build([x.scatter(1, idx, upd)])
    assert not find(g)


def test_a_tensor_constant_in_the_index_varies_with_its_values():
    """An index broadcast along rows plus a constant array whose rows differ varies along rows: no row windows."""
    from egraft.backends.jax.peephole import find

    b = GraphBuilder()
    x = b.input("x", (2, 5), "float32")
    pos = b.input("pos", (3,), "int64")
    upd = b.input("upd", (2, 3), "float32")
    idx = b.view(pos, (2, 3), (0, 1)) + b.tensor_constant(np.array([[0, 0, 0], [1, 1, 1]], np.int64))
    g = b.build([x.scatter(1, idx, upd)])
    assert not find(g)  # every axis varies: the full grid
    rng = np.random.default_rng(fresh_seed())
    ins = [rng.standard_normal((2, 5)).astype(np.float32), rng.permutation(3).astype(np.int64),
           rng.standard_normal((2, 3)).astype(np.float32)]
    assert_close(lower(g, "jax", "cpu")(*ins), evaluate(g, ins), ["float32"], what="row-varying constant index")
