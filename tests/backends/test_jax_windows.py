"""Sliding-window peepholes (backends/jax/windows.py): conv -> conv_general_dilated, pooling -> reduce_window.

Convolutions and pools are traced from torch modules (the exact primitive
form the torch lowering writes), run through the JAX backend and compared
with ir.evaluate on fresh random inputs; each test also checks that the
peephole fired (or, where the pattern must not match, that it did not).
The axis-map analysis the peephole rests on is fuzzed against the
reference definition of a View chain.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from jax_helpers import check_graph, jaxpr_primitives

import egraft
from egraft.backends import lower
from egraft.backends.jax import windows
from egraft.backends.jax.views import gather_index
from egraft.ir import GraphBuilder
from egraft.ir.shapes import contiguous_strides
from egraft.testing import fresh_seed, rel_err

nn = torch.nn


def _trace(model, *shapes, dtype=torch.float32):
    return egraft.trace(model.eval(), tuple(torch.randn(*s).to(dtype) for s in shapes))


def _randomise_bn(bn, gen):
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(bn.num_features, generator=gen))
        bn.running_var.copy_(torch.rand(bn.num_features, generator=gen) + 0.5)
        bn.weight.copy_(torch.randn(bn.num_features, generator=gen))
        bn.bias.copy_(torch.randn(bn.num_features, generator=gen))


# (in, out, kernel, stride, padding, dilation, groups, bias, batchnorm after, input spatial)
CONV2D = [
    (3, 5, 3, 1, 0, 1, 1, True, False, (9, 8)),
    (4, 6, 3, 2, 1, 1, 2, False, True, (9, 9)),
    (4, 4, 3, 1, 2, 2, 4, True, False, (8, 10)),  # depthwise, dilated
    (6, 6, 5, 2, 2, 1, 6, False, True, (11, 9)),  # depthwise, stride 2
    (3, 4, (2, 3), (2, 1), (1, 0), (1, 2), 1, True, False, (7, 9)),
    (4, 8, 1, 2, 0, 1, 1, False, True, (8, 8)),  # 1x1 stride-2 shortcut
    (4, 6, 3, 1, 1, 1, 2, True, True, (1, 5)),  # a size-1 spatial axis
]


@pytest.mark.parametrize("cfg", CONV2D, ids=lambda c: "conv{}->{} k{} s{} p{} d{} g{} b{} bn{}".format(*c[:9]))
def test_conv2d_is_one_conv_general_dilated(cfg):
    cin, cout, k, s, p, d, g, bias, bn, hw = cfg
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    conv = nn.Conv2d(cin, cout, k, s, p, d, g, bias)
    model = conv
    if bn:
        norm = nn.BatchNorm2d(cout)
        _randomise_bn(norm, gen)
        model = nn.Sequential(conv, norm)
    graph = _trace(model, (2, cin) + hw)
    ex = check_graph(graph, seed, what=f"conv2d {cfg}")
    assert ex.stats["peephole_convs"] == 1 and ex.stats["peephole_dots"] == 0, (cfg, ex.stats)
    assert ex.stats["view_stacks"] == 0 and ex.stats["view_gathers"] == 0, ex.stats
    assert "conv_general_dilated" in jaxpr_primitives(ex)
    if p and not isinstance(p, tuple):
        # the zero pad folded into the convolution: no pad gathers or slices are left
        assert ex.stats["peephole_slices"] == 0 and ex.stats["peephole_takes"] == 0, ex.stats
    off = check_graph(graph, seed, knobs={"windows": False}, what=f"conv2d {cfg}, windows off")
    assert off.stats["peephole_convs"] == 0 and "conv_general_dilated" not in jaxpr_primitives(off)


@pytest.mark.parametrize("dim", [1, 3])
def test_conv1d_and_conv3d(dim):
    seed = fresh_seed()
    torch.manual_seed(seed)
    if dim == 1:
        model, shape = nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2), (2, 4, 13)
    else:
        model, shape = nn.Conv3d(2, 3, (2, 3, 3), stride=(1, 2, 1), padding=(0, 1, 1)), (1, 2, 4, 6, 5)
    ex = check_graph(_trace(model, shape), seed, what=f"conv{dim}d")
    assert ex.stats["peephole_convs"] == 1


def test_conv_half_precision():
    seed = fresh_seed()
    torch.manual_seed(seed)
    model = nn.Conv2d(4, 6, 3, 2, 1, groups=2).to(torch.float16)
    graph = _trace(model, (2, 4, 8, 8), dtype=torch.float16)
    ex = check_graph(graph, seed, what="conv2d float16")
    assert ex.stats["peephole_convs"] == 1


@pytest.mark.parametrize("kind", ["reflect", "transposed"])
def test_conv_whose_input_is_not_a_zero_pad_still_matches(kind):
    """Reflect padding / the zero-stuffed input of a transposed conv are not folded: conv runs on them."""
    seed = fresh_seed()
    torch.manual_seed(seed)
    if kind == "reflect":
        model = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    else:
        model = nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)
    ex = check_graph(_trace(model, (2, 3, 6, 5)), seed, what=f"conv {kind}")
    assert ex.stats["peephole_convs"] == 1


def test_nonzero_pad_is_not_folded():
    """A window over a pad with fill 1.0: the convolution fires, the pad stays a pad."""
    seed = fresh_seed()
    b = GraphBuilder()
    x = b.input("x", (2, 3, 6, 6), "float32")
    w = b.input("w", (4, 3, 3, 3), "float32")
    xp = x.pad(2, 1, 1, 1.0).pad(3, 1, 1, 1.0)
    win = xp.view_as_strided((2, 6, 6, 3, 3, 3), (192, 8, 1, 64, 8, 1), 0)  # [n, oy, ox, c, ky, kx]
    cols = win.reshape((2, 36, 27))
    y = cols @ w.reshape((4, 27)).transpose(0, 1)
    ex = check_graph(b.build([y]), seed, what="conv over a 1.0 pad")
    assert ex.stats["peephole_convs"] == 1 and ex.stats["peephole_slices"] >= 1


def test_resnet_block_runs_as_convolutions():
    from egraft.models import MODELS

    seed = fresh_seed()
    spec = MODELS["resnet_block"]
    model = spec.build("tiny", seed=seed)
    args = spec.example_inputs(model, seed=seed)
    graph = egraft.trace(model, args)
    ex = lower(graph, "jax", "cpu")
    with torch.no_grad():
        want = model(*args)
    e = rel_err(ex(*args)[0].numpy(), want.numpy())
    assert e <= 1e-4, f"resnet_block relative error {e:.3g} (seed={seed})"
    n_convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert ex.stats["peephole_convs"] == n_convs and ex.stats["peephole_dots"] == 0, ex.stats
    assert "conv_general_dilated" in jaxpr_primitives(ex)
    check_graph(graph, seed, what="resnet_block vs ir.evaluate")


POOLS = [
    lambda: nn.MaxPool2d(3, 2, 1),
    lambda: nn.MaxPool2d(2, dilation=2),
    lambda: nn.MaxPool2d(3, 2, 1, ceil_mode=True),
    lambda: nn.AvgPool2d(3, 2, 1),
    lambda: nn.AvgPool2d(2),
    lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
    lambda: nn.MaxPool1d(3, 2, 1),
    lambda: nn.AvgPool1d(4, 3),
]


@pytest.mark.parametrize("k", range(len(POOLS)))
def test_pooling_is_reduce_window(k):
    seed = fresh_seed()
    model = POOLS[k]()
    shape = (2, 3, 9, 8) if "2d" in type(model).__name__ else (2, 3, 11)
    graph = _trace(model, shape)
    ex = check_graph(graph, seed, what=f"{model}")
    # (kernel == stride windows over a 9-row input do not nest in views.py's flat digit box either,
    # so every pool here is a window op; test_plain_reductions_are_not_pools has the nesting cases)
    assert ex.stats["peephole_pools"] == 1 and ex.stats["view_stacks"] == 0, (model, ex.stats)
    assert {"reduce_window_max", "reduce_window_sum", "reduce_window"} & jaxpr_primitives(ex)
    off = check_graph(graph, seed, knobs={"windows": False}, what=f"{model}, windows off")
    assert off.stats["peephole_pools"] == 0


def test_pool_over_int_and_half():
    seed = fresh_seed()
    for dt in ("int32", "float16"):
        b = GraphBuilder()
        x = b.input("x", (2, 7, 6), dt)
        lowest = -np.inf if dt == "float16" else int(np.iinfo(np.int32).min)
        xp = x.pad(1, 1, 1, lowest)  # [2, 9, 6]
        win = xp.view_as_strided((2, 4, 6, 3), (54, 12, 1, 6), 0)  # rows 0..8, window 3 stride 2
        ex = check_graph(b.build([win.max(3), win.sum(3)]) if dt == "float16" else b.build([win.max(3)]),
                         seed, what=f"pool {dt}")
        assert ex.stats["peephole_pools"] >= 1


def test_plain_reductions_are_not_pools():
    """A reduction of a permuted, strided or reshaped (non-overlapping) view stays a reduction."""
    seed = fresh_seed()
    b = GraphBuilder()
    x = b.input("x", (4, 5, 6), "float32")
    t = x.permute((2, 0, 1))
    win = x.view_as_strided((4, 5, 3, 2), (30, 6, 2, 1), 0)  # kernel-2 stride-2 windows along the last axis
    ys = [t.sum(1), t.max(2), x.slice(2, 0, 6, 2).sum(2), x.reshape((4, 5, 2, 3)).sum(3), win.max(3)]
    ex = check_graph(b.build(ys), seed, what="plain reductions")
    assert ex.stats["peephole_pools"] == 0 and ex.stats["peephole_convs"] == 0


def test_matmuls_stay_dots():
    """Matmuls whose roles could pass for a convolution with nothing sliding stay dot_generals."""
    seed = fresh_seed()
    b = GraphBuilder()
    a = b.input("a", (2, 3, 5, 7), "float32")
    c = b.input("c", (2, 3, 7, 4), "float32")
    d = b.input("d", (4, 7), "float32")
    q = b.input("q", (1, 4, 5, 8), "float32")  # batch-1 attention scores: heads look like conv groups
    k = b.input("k", (1, 4, 6, 8), "float32")
    x1 = b.input("x1", (3, 1, 7), "float32")  # a linear on one position
    ys = [a @ c, a @ d.transpose(0, 1), q @ k.transpose(-2, -1), x1 @ d.transpose(0, 1)]
    ex = check_graph(b.build(ys), seed, what="matmuls")
    assert ex.stats["peephole_dots"] == 4 and ex.stats["peephole_convs"] == 0, ex.stats


# --- the axis map ----------------------------------------------------------------------------------

def _random_chain(rng):
    """A source, an arbitrary (possibly overlapping) strided view of it, then a random reshape view."""
    b = GraphBuilder()
    src_shape = tuple(int(n) for n in rng.integers(1, 6, size=rng.integers(1, 4)))
    x = b.input("x", src_shape, "float32")
    numel = int(np.prod(src_shape))
    rank = int(rng.integers(1, 5))
    shape = tuple(int(n) for n in rng.integers(1, 5, size=rank))
    strides = [int(rng.choice([0, 1, 2, 3, numel // 2 or 1, rng.integers(0, numel)])) * int(rng.choice([1, 1, -1]))
               for _ in range(rank)]
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    if hi - lo >= numel:
        return None
    off = int(rng.integers(-lo, numel - hi))
    v = x.view_as_strided(shape, strides, off)
    if rng.random() < 0.3:
        v = v.flip(int(rng.integers(0, rank)))
    n = int(np.prod(shape))
    divs = [d for d in range(1, n + 1) if n % d == 0]
    d1 = int(rng.choice(divs))
    outer = (d1, n // d1) if rng.random() < 0.5 else (n,)
    if rng.random() < 0.5:  # then broadcast a new axis
        v = v.reshape(outer).unsqueeze(-1).expand(outer + (int(rng.integers(2, 4)),))
    else:
        v = v.reshape(outer)
    return b.build([v])


def test_axis_map_is_exact_on_random_view_chains():
    """Whenever axis_map describes a chain, its description gives exactly the chain's source indices."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    described = 0
    for _ in range(400):
        g = _random_chain(rng)
        if g is None:
            continue
        out = g.outputs[0]
        m = windows.axis_map(g, out)
        # the reference: compose the chain's views on the source's flat index
        idx = np.arange(int(np.prod(g.nodes[out].shape))).reshape(g.nodes[out].shape)
        nid = out
        while g.nodes[nid].op == "View":
            a = g.nodes[nid].attrs
            full = gather_index(a["shape"], a["strides"], a["offset"])
            idx = full.reshape(-1)[idx]
            nid = g.nodes[nid].inputs[0]
        if m is None:
            continue
        described += 1
        assert m.src == nid, f"seed={seed}"
        src_shape = g.nodes[nid].shape
        cs = contiguous_strides(src_shape)
        got = np.full(g.nodes[out].shape, sum(o * c for o, c in zip(m.offset, cs)), dtype=np.int64)
        for d, pieces in enumerate(m.pieces):
            n = g.nodes[out].shape[d]
            i = np.arange(n)
            place = n
            contrib = np.zeros(n, dtype=np.int64)
            for size, dim, step in pieces:  # outer -> inner digits
                place //= size
                if dim is not None:
                    contrib += (i // place) % size * step * cs[dim]
            got += contrib.reshape((n,) + (1,) * (len(g.nodes[out].shape) - d - 1))
        assert np.array_equal(got, idx), f"seed={seed}: {g.dump()}\n{m}"
    assert described > 50, f"seed={seed}: only {described} chains described"
