"""Repeated layers are saturated once and copied; the result stays sound."""

import numpy as np

from egraft.ir import GraphBuilder
from egraft.rewrites import Limits, saturate
from egraft.rewrites.check import check_space
from egraft.rewrites.layers import cut_points, find_period, layer_blocks
from egraft.search import Space
from egraft.testing import fresh_seed


def _stack(n_layers, d=8):
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (2, 4, d), "float32")
    for k in range(n_layers):
        w = b.weight(f"h.{k}.w", (rng.standard_normal((d, d)) / d ** 0.5).astype(np.float32))
        g = b.weight(f"h.{k}.g", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        h = x.layer_norm(1e-5) * g
        x = x + (h @ w).relu() * 0.5
    return b.build([x.rms_norm(1e-6)])


def test_find_period():
    assert find_period(list("pabababs")) == (1, 2, 3)
    assert find_period(list("abcd")) is None


def test_blocks_of_a_stack():
    g = _stack(6)
    assert len(cut_points(g)) >= 6
    blocks, (start, period, count) = layer_blocks(g)
    assert count >= 4 and len(blocks) >= count


def test_layered_saturation_is_sound_and_reuses_templates():
    seed = fresh_seed()
    g = _stack(6)
    lim = Limits(iterations=6, explosive_iterations=1, seconds=60)
    res = saturate(g, limits=Limits(**{**lim.__dict__, "repeated_layers": True}))
    assert res.layers and res.layers["templates"] < res.layers["blocks"], res.layers
    plain = saturate(g, limits=lim)
    assert res.nodes > len(g.nodes) and plain.nodes > len(g.nodes)
    sp = Space.from_egraph(res)
    assert check_space(sp, g, seed, samples=16, per_class_cap=0, what="layered stack") >= 2


def test_small_graphs_fall_back_to_plain_saturation():
    g = _stack(1)
    res = saturate(g, limits=Limits(repeated_layers=True))
    assert res.layers == {}
