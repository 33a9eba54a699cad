"""The reference interpreter: input checking, torch inputs, oracle mode, half-precision rounding, weights."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from egraft.errors import InputError, IRError
from egraft.ir import GraphBuilder, evaluate

from ir_testlib import rand


def _affine(dt="float32"):
    b = GraphBuilder()
    x = b.input("x", (2, 3), dt)
    w = b.weight("w", np.arange(3, dtype=np.float64).astype(x.node.dtype if dt != "bfloat16" else ml_dtypes.bfloat16) + 1)
    ids = b.input("ids", (4,), "int64")
    return b.build([x * w, ids + 1])


def test_wrong_input_count_names_the_inputs():
    g = _affine()
    with pytest.raises(InputError, match=r"takes 2 input\(s\) \(x, ids\), got 1"):
        evaluate(g, [np.ones((2, 3), np.float32)])


def test_wrong_input_shape_names_input_expected_and_got():
    g = _affine()
    with pytest.raises(InputError, match=r"input 'ids' has shape \(5,\), the graph expects \(4,\)"):
        evaluate(g, [np.ones((2, 3), np.float32), np.ones(5, np.int64)])


@pytest.mark.parametrize("bad", [np.ones((2, 3), np.float64), np.ones((2, 3), np.float16), np.ones((2, 3), np.int32)])
def test_wrong_input_dtype_names_input_expected_and_got(bad):
    g = _affine()
    with pytest.raises(InputError, match=rf"input 'x' has dtype {bad.dtype}, the graph expects float32"):
        evaluate(g, [bad, np.ones(4, np.int64)])


def test_int_input_dtype_is_exact_even_in_oracle_mode():
    g = _affine()
    with pytest.raises(InputError, match="input 'ids' has dtype int32"):
        evaluate(g, [np.ones((2, 3), np.float32), np.ones(4, np.int32)], dtype=np.float64)


def test_torch_inputs_accepted_including_bfloat16(rng):
    for dt, tdt in [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)]:
        g = _affine(dt)
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(rng.seed)).to(tdt)
        ids = torch.arange(4)
        y, i1 = evaluate(g, [x, ids])
        assert str(y.dtype) == dt and i1.dtype == np.int64
        want = (x.float() * torch.tensor([1.0, 2.0, 3.0])).to(tdt).float().numpy()
        assert np.array_equal(y.astype(np.float32), want), (dt, rng.tag)
        assert i1.tolist() == [1, 2, 3, 4]
    with pytest.raises(InputError, match="input 'x' has dtype"):
        evaluate(_affine(), [torch.ones(2, 3, dtype=torch.float64), torch.arange(4)])


def test_oracle_mode_returns_float64_and_accepts_float64_inputs(rng):
    b = GraphBuilder()
    x = b.input("x", (4,), "float32")
    h = b.input("h", (4,), "float16")
    g = b.build([(x * 3.0).sin(), h + 1.0, (x < 0)])
    x64 = rng.gen.standard_normal(4)
    h64 = rng.gen.standard_normal(4)
    s, hh, lt = evaluate(g, [x64, h64], dtype=np.float64)
    assert s.dtype == np.float64 and hh.dtype == np.float64 and lt.dtype == np.bool_
    assert np.allclose(s, np.sin(x64 * 3.0), rtol=1e-14, atol=0), rng.tag  # no float32 rounding anywhere
    assert np.allclose(hh, h64 + 1.0, rtol=1e-15, atol=0), rng.tag
    with pytest.raises(IRError, match="dtype"):
        evaluate(g, [x64.astype(np.float32), h64.astype(np.float16)], dtype=np.float32)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_graphs_compute_in_float32_and_round_after_each_op(dt, rng):
    b = GraphBuilder()
    x = b.input("x", (64,), dt)
    y = b.input("y", (64,), dt)
    out = ((x * y + x).exp2() * y.recip()).sum(0)
    g = b.build([out])
    nd = np.dtype(ml_dtypes.bfloat16) if dt == "bfloat16" else np.dtype(np.float16)
    xs = [rand((64,), dt, rng), rand((64,), dt, rng)]

    def op(v):  # float32 compute, then round to the half type
        return np.asarray(v, np.float32).astype(nd)

    f = lambda a: a.astype(np.float32)  # noqa: E731
    t = op(f(xs[0]) * f(xs[1]))
    t = op(f(t) + f(xs[0]))
    t = op(np.exp2(f(t)))
    r = op(np.reciprocal(f(xs[1])))
    t = op(f(t) * f(r))
    want = op(np.sum(f(t), dtype=np.float32))
    (got,) = evaluate(g, xs)
    assert got.dtype == nd
    assert np.array_equal(got.astype(np.float32), want.astype(np.float32), equal_nan=True), rng.tag
    # and it differs from computing the whole chain in float32 (the rounding is really per op)
    (oracle,) = evaluate(g, xs, dtype=np.float64)
    assert oracle.dtype == np.float64


def test_weights_override_and_bound_default(rng):
    g = _affine()
    x = rand((2, 3), "float32", rng)
    ids = np.arange(4, dtype=np.int64)
    (y, _) = evaluate(g, [x, ids])
    assert np.array_equal(y, x * np.array([1, 2, 3], np.float32))
    w2 = rand((3,), "float32", rng)
    (y2, _) = evaluate(g, [x, ids], weights={"w": w2})
    assert np.array_equal(y2, x * w2), rng.tag
    (y3, _) = evaluate(g, [x, ids], weights={"w": torch.from_numpy(w2)})
    assert np.array_equal(y3, y2)
    assert np.array_equal(g.weights["w"], np.array([1, 2, 3], np.float32)), "override must not rebind"


def test_weights_override_is_checked():
    g = _affine()
    args = [np.ones((2, 3), np.float32), np.ones(4, np.int64)]
    with pytest.raises(InputError, match=r"weight 'w' has shape \(4,\)"):
        evaluate(g, args, weights={"w": np.ones(4, np.float32)})
    with pytest.raises(InputError, match=r"weight 'w' has dtype int64"):
        evaluate(g, args, weights={"w": np.ones(3, np.int64)})
    # the oracle accepts a float64 weight for a float32 weight input
    evaluate(g, args, dtype=np.float64, weights={"w": np.ones(3, np.float64)})


def test_missing_weight_value_is_an_input_error():
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    w = b.input("w", (3,), "float32", role="weight")
    g = b.build([x + w])
    with pytest.raises(InputError, match="weight 'w' has no bound value"):
        evaluate(g, [np.ones(3, np.float32)])
    (y,) = evaluate(g, [np.ones(3, np.float32)], weights={"w": np.full(3, 2, np.float32)})
    assert y.tolist() == [3, 3, 3]


def test_outputs_do_not_alias_inputs():
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    g = b.build([x])
    a = np.ones(3, np.float32)
    (y,) = evaluate(g, [a])
    y[0] = 5
    assert a[0] == 1


@pytest.mark.parametrize("trial", range(3))
def test_oracle_contraction_equals_the_literal_product_sum(trial, rng, monkeypatch):
    """The oracle runs SumReduce(Mul(...)) as one contraction: the same numbers as the product, then the sum."""
    import importlib

    bsz, m, k, n = (int(v) for v in rng.gen.integers(1, 5, size=4))
    b = GraphBuilder()
    x = b.input("x", (bsz, m, k), "float32")
    w = b.input("w", (k, n), "float32")
    y = b.input("y", (bsz, m, k), "float32")
    d = b.input("d", (k,), "float32")
    # (d * d).sum(0): a 0-d result; the last: both factors broadcast along the summed axis (K equal terms)
    both = (b.view(d, (m, 3, k), (0, 0, 1)) * b.view(d, (m, 3, k), (0, 0, 1))).sum(1)
    g = b.build([x @ w, ((x * y).sum(2)), (x @ w).sum(1), (d * d).sum(0), both])
    xs = [rand((bsz, m, k), "float32", rng), rand((k, n), "float32", rng), rand((bsz, m, k), "float32", rng),
          rand((k,), "float32", rng)]
    fast = evaluate(g, xs, np.float64)
    assert any(nd.op == "SumReduce" for nd in g.nodes)
    module = importlib.import_module("egraft.ir.evaluate")
    assert len(module._contractions(g)) == 4  # x @ w (built once, read twice), (x * y).sum(2), (d * d).sum(0), both
    monkeypatch.setattr(module, "_contractions", lambda graph: {})  # the literal path: product, then sum
    slow = evaluate(g, xs, np.float64)
    x64 = [v.astype(np.float64) for v in xs]
    np.testing.assert_allclose(fast[0], x64[0] @ x64[1], rtol=1e-12, atol=1e-12)
    for f, s in zip(fast, slow):
        np.testing.assert_allclose(f, s, rtol=1e-12, atol=1e-12)


def test_view_reads_in_place_and_by_gather_alike(rng):
    """A View is read as a strided view when in bounds (broadcast, negative strides): the gather's elements."""
    from egraft.ir.strided import gather_index

    b = GraphBuilder()
    x = b.input("x", (4, 6), "float32")
    cases = [((4, 6, 3), (6, 1, 0), 0), ((6, 4), (-1, 6), 5), ((2, 3), (12, -2), 5), ((3, 3), (0, 0), 7)]
    g = b.build([b.view(x, s, st, off) for s, st, off in cases])
    xv = rand((4, 6), "float32", rng)
    got = evaluate(g, [xv])
    for (s, st, off), out in zip(cases, got):
        np.testing.assert_array_equal(out, xv.reshape(-1)[gather_index(s, st, off)])
        out += 1  # outputs are the caller's own arrays, writeable


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_oracle_reads_a_weight_in_its_own_dtype_and_widens_products_in_blocks(dt, rng, monkeypatch):
    """An embedding lookup and a tied output layer: the oracle gathers rows of the stored weight and widens
    it a block at a time in the product, so a model's weights are never held again in float64."""
    import importlib
    import tracemalloc

    module = importlib.import_module("egraft.ir.evaluate")
    vocab, hidden, rows = 1536, 64, 3
    np_dt = ml_dtypes.bfloat16 if dt == "bfloat16" else np.float32
    table = rand((vocab, hidden), "float32", rng).astype(np_dt)
    b = GraphBuilder()
    ids = b.input("ids", (rows, 1), "int64")
    emb = b.weight("emb", table)
    h = emb.index_select(0, ids.reshape((rows,)))  # [rows, hidden], the stored dtype
    scale = b.input("scale", (rows, hidden), dt)
    logits = (h * scale) @ emb.T
    g = b.build([logits, h])
    xs = [rng.gen.integers(0, vocab, size=(rows, 1)).astype(np.int64), rand((rows, hidden), dt, rng)]
    t64 = table.astype(np.float64)
    want_h = t64[xs[0][:, 0]]
    want = (want_h * xs[1].astype(np.float64)) @ t64.T
    monkeypatch.setattr(module, "_BLOCK_BYTES", 16 * hidden * 8)  # 16 rows of the table a block: 96 blocks
    tracemalloc.start()
    got, got_h = evaluate(g, xs, np.float64)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert got.dtype == got_h.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got_h, want_h)
    # the float64 table alone would be vocab * hidden * 8 bytes (786 KB); the evaluation holds far less
    assert peak < vocab * hidden * 8 / 4, f"peak {peak} bytes: a float64 copy of the weight was made"
    monkeypatch.setattr(module, "_BLOCK_BYTES", 1 << 40)  # one block: the same numbers
    whole, _ = evaluate(g, xs, np.float64)
    np.testing.assert_allclose(got, whole, rtol=1e-12, atol=1e-12)


def test_broadcast_view_of_a_strided_value_reads_it_in_place(rng):
    """A View that only adds broadcast or size-1 axes to a transposed value reads it where it lies, and
    every other View of it (an offset, a slice) still reads its elements in order: both give numpy's."""
    b = GraphBuilder()
    x = b.input("x", (4, 6), "float32")
    t = x.T  # [6, 4], a strided (transposed) value
    cases = [((3, 6, 4), (0, 4, 1), 0), ((6, 1, 4), (4, 0, 1), 0), ((6, 4, 2), (4, 1, 0), 0),
             ((5, 4), (4, 1), 4), ((6, 2), (4, 2), 0)]
    g = b.build([b.view(t, s, st, off) for s, st, off in cases])
    xv = rand((4, 6), "float32", rng)
    flat = np.ascontiguousarray(xv.T).reshape(-1)
    for dtype in (None, np.float64):
        for (s, st, off), out in zip(cases, evaluate(g, [xv], dtype)):
            want = np.lib.stride_tricks.as_strided(flat[off:], s, [k * flat.itemsize for k in st])
            np.testing.assert_array_equal(out, want)
