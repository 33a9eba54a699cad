"""``ir.rows.row_axes``: rows along a varying axis proven independent, or the op that mixes them.

Each verdict is also checked numerically, so a wrong rule fails: a graph
built at ``n`` rows and the same graph built at ``N > n`` rows are evaluated
by the reference interpreter, the second on the input padded with random
rows.  For an "independent" verdict the first ``n`` rows of every output
must equal the unpadded evaluation (bitwise in float64 for the elementwise
graphs, within float32 rounding where a matmul's summation order could
change with the shape); for a "not independent" verdict some padding must
change a real row, so the refusal is not a false alarm on these graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import egraft
from egraft.errors import InputError
from egraft.ir import GraphBuilder, Op, evaluate
from egraft.ir.idiom_forms import attention_decomposed
from egraft.ir.rows import row_axes
from egraft.testing import fresh_seed

D = 8


def _mlp(b, n, rng_w):
    x = b.input("x", (n, D), "float32")
    w1 = b.weight("w1", rng_w.standard_normal((D, 16)).astype(np.float32))
    w2 = b.weight("w2", rng_w.standard_normal((16, D)).astype(np.float32))
    h = b.add(Op.MatMul, [x, w1])
    h = h * h.sigmoid()
    return [b.add(Op.MatMul, [h, w2]) + x]


def _norm(b, n, rng_w):
    x = b.input("x", (2, n, D), "float32")
    g = b.weight("g", rng_w.standard_normal((D,)).astype(np.float32))
    y = b.add(Op.RMSNorm, [x], axis=2, eps=1e-6) * g.expand((2, n, D))
    return [y, x.layer_norm(1e-5)]  # the idiom and the primitive form


def _rope(b, n, rng_w):
    """Rotary embedding over per-token positions: cos/sin of pos * inv_freq, rotate_half by a Gather."""
    x = b.input("x", (n, 2, D), "float32")
    pos = b.input("pos", (n,), "int64")
    inv = b.weight("inv", (1.0 / 10000 ** (np.arange(0, D, 2) / D)).astype(np.float32))
    ang = pos.float_().reshape((n, 1)) * inv.reshape((1, D // 2))
    ang = egraft.ir.cat([ang, ang], 1).reshape((n, 1, D))
    half = D // 2
    rot = egraft.ir.cat([-x.slice(2, half, D), x.slice(2, 0, half)], 2)
    return [x * ang.cos() + rot * ang.sin()]


def _merged_batch(b, n, rng_w):
    """[B, S, d] -> [B*S, d] -> linear -> [B, S, d], rows along B (a batch): each row is a block of the merged
    axis; plus a select and a slice within each row's block (position 0, positions 1..)."""
    x = b.input("x", (n, 3, D), "float32")
    w = b.weight("w", rng_w.standard_normal((D, D)).astype(np.float32))
    h = b.add(Op.MatMul, [x.reshape((n * 3, D)), w]).tanh().reshape((n, 3, D))
    flat = h.reshape((n * 3 * D,)).sigmoid().reshape((n, 3 * D))
    return [h, flat, h.select(1, 0) + h.slice(1, 1, 3).sum(1)]


def _iota_positions(b, n, rng_w):
    """Positions made inside the graph (arange(n)): row i's position is i at every length."""
    x = b.input("x", (n, D), "float32")
    return [x + b.iota(n, "int64").float_().reshape((n, 1))]


def _embed(b, n, rng_w):
    ids = b.input("ids", (n,), "int64")
    table = b.weight("table", rng_w.standard_normal((11, D)).astype(np.float32))
    return [table.index_select(0, ids).tanh()]


def _attention(b, n, rng_w):
    x = b.input("x", (1, n, D), "float32")
    return [b.add(Op.Attention, [x, x, x], scale=0.3, causal=False)]


def _causal(b, n, rng_w):
    """Causal attention: rows meet through the keys (and the mask i >= j mixes two row axes)."""
    x = b.input("x", (1, n, D), "float32")
    return [attention_decomposed(x, x, x, causal=True)]


def _sum_rows(b, n, rng_w):
    x = b.input("x", (n, D), "float32")
    return [x.sum(0)]


def _mask(b, n, rng_w):
    """A causal mask built from positions alone, applied to a row tensor broadcast along a second row axis."""
    x = b.input("x", (n, D), "float32")
    i = b.iota(n, "int64").reshape((n, 1)).expand((n, n))
    j = b.iota(n, "int64").reshape((1, n)).expand((n, n))
    s = x.sum(1).reshape((1, n)).expand((n, n))
    return [egraft.ir.Tensor.where(j <= i, s, 0.0).sum(1)]


def _transposed(b, n, rng_w):
    """x^T x: the transpose makes the rows the contraction axis."""
    x = b.input("x", (n, D), "float32")
    return [b.add(Op.MatMul, [x.transpose(0, 1), x])]


def _last_row(b, n, rng_w):
    x = b.input("x", (n, D), "float32")
    return [x.select(0, n - 1) * 2.0]


def _count_rows(b, n, rng_w):
    """x * ones(n).sum(): a row-free value broadcast over the rows, then summed, counts the padded rows."""
    x = b.input("x", (n, D), "float32")
    return [x * b.constant(1.0, "float32", (n,)).sum(0)]


def _merged_under_outer(b, n, rng_w):
    """[2, S, d] -> [2*S, d]: the rows lie under the outer axis, then a reshape shifts them by one."""
    x = b.input("x", (2, n, D), "float32")
    return [x.reshape((2 * n * D,)).slice(0, D, 2 * n * D).reshape((2 * n - 1, D)).sum(0)]


def _softmax_rows(b, n, rng_w):
    x = b.input("x", (n, D), "float32")
    return [b.add(Op.Softmax, [x], axis=0)]


POSITIVE = {"mlp": (_mlp, {"x": 0}, [0]), "norm": (_norm, {"x": 1}, [1, 1]), "rope": (_rope, {"x": 0, "pos": 0}, [0]),
            "iota": (_iota_positions, {"x": 0}, [0]), "embed": (_embed, {"ids": 0}, [0]),
            "merged": (_merged_batch, {"x": 0}, [0, 0, 0])}
NEGATIVE = {"attention": (_attention, {"x": 1}, "attends across"), "causal": (_causal, {"x": 1}, ""),
            "sum": (_sum_rows, {"x": 0}, "reduces over the rows"), "mask": (_mask, {"x": 0}, ""),
            "transpose": (_transposed, {"x": 0}, "contracts over the rows"),
            "last_row": (_last_row, {"x": 0}, "selects"), "count": (_count_rows, {"x": 0}, "reduces over"),
            "under_outer": (_merged_under_outer, {"x": 1}, ""), "softmax": (_softmax_rows, {"x": 0}, "along the rows")}


def _graph(make, n, seed):
    b = GraphBuilder()
    return b.build(make(b, n, np.random.default_rng(seed)))


def _inputs(g, varying, rng, n_real, n):
    """Random inputs of `g` (built at `n` rows); real rows first, the rest random padding."""
    out = []
    for s in g.signature.call_inputs:
        if s.dtype == "int64":
            out.append(rng.integers(0, 11, s.shape).astype(np.int64))
        else:
            out.append(rng.standard_normal(s.shape).astype(np.float32))
    return out


def _real(arrs, specs, varying, n):
    return [np.take(a, np.arange(n), axis=varying[s.name]) if s.name in varying else a for a, s in zip(arrs, specs)]


def _run_padded(make, varying, seed, n=5, big=12):
    rng = np.random.default_rng(seed + 1)
    g_big, g_small = _graph(make, big, seed), _graph(make, n, seed)
    padded = _inputs(g_big, varying, rng, n, big)
    real = _real(padded, g_big.signature.call_inputs, varying, n)
    return g_big, evaluate(g_big, padded, np.float64), evaluate(g_small, real, np.float64)


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_independent_rows_and_padding_is_exact(name):
    seed = fresh_seed()
    make, varying, want_axes = POSITIVE[name]
    g_big, got, want = _run_padded(make, varying, seed)
    rows = row_axes(g_big, varying)
    assert rows.independent, rows.reason
    assert list(rows.axes) == want_axes and rows.length == 12
    for o, w, ax in zip(got, want, rows.axes):
        real = np.take(o, np.arange(w.shape[ax]), axis=ax)
        np.testing.assert_allclose(real, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_mixed_rows_are_refused_and_padding_changes_them(name):
    seed = fresh_seed()
    make, varying, words = NEGATIVE[name]
    g_big, got, want = _run_padded(make, varying, seed)
    rows = row_axes(g_big, varying)
    assert not rows.independent and words in rows.reason, rows.reason
    # the refusal is real: padding changes a real row of some output, or (a causal graph, where padding at the
    # end happens to be harmless) changing input row 0 changes another output row: row i meets row 0
    assert _padding_changes(got, want) or _row_zero_reaches_others(g_big, varying, seed), \
        f"{name}: neither padding nor another row changes a row, so this refusal tests nothing"


def _close(a, b):
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-9, atol=1e-9)


def _padding_changes(got, want) -> bool:
    for o, w in zip(got, want):
        ax = next((d for d, (a, b) in enumerate(zip(o.shape, w.shape)) if a != b), None)
        if not _close(o if ax is None else np.take(o, np.arange(w.shape[ax]), axis=ax), w):
            return True
    return False


def _row_zero_reaches_others(g, varying, seed) -> bool:
    """Whether changing row 0 of the varying inputs changes rows 1.. of an output (along its axis of the rows'
    length)."""
    rng = np.random.default_rng(seed + 2)
    specs = g.signature.call_inputs
    n = next(s.shape[varying[s.name]] for s in specs if s.name in varying)
    xs = _inputs(g, varying, rng, 0, 0)
    ys = []
    for x, s in zip(xs, specs):
        x = np.array(x)
        if s.name in varying:
            row = [slice(None)] * x.ndim
            row[varying[s.name]] = 0
            row = tuple(row)
            x[row] = (x[row] + 1) % 11 if x.dtype == np.int64 else rng.standard_normal(x[row].shape)
        ys.append(x)
    for b, a in zip(evaluate(g, xs, np.float64), evaluate(g, ys, np.float64)):
        ax = next((d for d, size in enumerate(b.shape) if size == n), None)
        rest = np.arange(1, n)
        if ax is not None and not _close(np.take(b, rest, axis=ax), np.take(a, rest, axis=ax)):
            return True
    return False


class _Block(nn.Module):
    """A GPT-2/llama MLP + norm piece: RMSNorm, gated SiLU MLP, residual, LayerNorm."""

    def __init__(self, d=16):
        super().__init__()
        self.g = nn.Linear(d, 32, bias=False)
        self.u = nn.Linear(d, 32, bias=False)
        self.o = nn.Linear(32, d)
        self.ln = nn.LayerNorm(d)
        self.w = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return self.ln(x + self.o(nn.functional.silu(self.g(h)) * self.u(h)))


def test_traced_block_over_tokens():
    seed = fresh_seed()
    torch.manual_seed(seed)
    m = _Block().eval()
    graphs = {n: egraft.trace(m, (torch.randn(1, n, 16),)) for n in (3, 10)}
    name = graphs[10].signature.call_inputs[0].name
    rows = row_axes(graphs[10], {name: 1})
    assert rows.independent and rows.axes == (1,), rows.reason
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 10, 16)).astype(np.float32)
    (big,) = evaluate(graphs[10], [x], np.float64)
    (small,) = evaluate(graphs[3], [x[:, :3]], np.float64)
    np.testing.assert_allclose(big[:, :3], small, rtol=1e-12, atol=1e-12)


def test_traced_attention_is_refused():
    seed = fresh_seed()
    torch.manual_seed(seed)
    m = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    g = egraft.trace(lambda_module(m), (torch.randn(1, 6, 16),))
    rows = row_axes(g, {g.signature.call_inputs[0].name: 1})
    assert not rows.independent


def lambda_module(m):
    class Self(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x, x, x, need_weights=False)[0]

    return Self().eval()


def test_bad_requests_are_named():
    b = GraphBuilder()
    g = b.build(_mlp(b, 4, np.random.default_rng(0)))
    with pytest.raises(InputError, match="not an input"):
        row_axes(g, {"y": 0})
    with pytest.raises(InputError, match="out of range"):
        row_axes(g, {"x": 2})
    assert "length 1" in row_axes(_graph(_mlp, 1, 0), {"x": 0}).reason
