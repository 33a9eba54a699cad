"""Repeated layers are saturated once and copied; the result stays sound."""

import numpy as np

from egraft.ir import GraphBuilder, evaluate
from egraft.rewrites import Limits, saturate
from egraft.testing.equivalence import check_space
from egraft.rewrites.blocks import cut_points, find_period, layer_blocks
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


# --- stitched saturation of a traced transformer stack -------------------------------------------

import functools  # noqa: E402

import pytest  # noqa: E402

from egraft.errors import SaturationError  # noqa: E402
from egraft.ir.graph import Attrs  # noqa: E402
from egraft.rewrites.codec import Context, constant_attrs  # noqa: E402
from egraft.rewrites.schema import SIGS, ctor_for  # noqa: E402
from egraft.rewrites.stitch import Stitcher  # noqa: E402

GPT2_LIMITS = Limits(iterations=8, seconds=30.0)


@functools.lru_cache(maxsize=None)
def _gpt2(n_layers=3):
    import egraft

    from egraft.models import MODELS

    spec = MODELS["gpt2_stack"]
    model = spec.build("tiny", n_layers=n_layers)
    return egraft.trace(model, spec.example_inputs(model))


@functools.lru_cache(maxsize=None)
def _gpt2_layered(rules_key="all"):
    g = _gpt2(3)
    res = saturate(g, rules=[] if rules_key == "none" else None, limits=GPT2_LIMITS)
    return g, res


def test_every_gpt2_layer_is_one_template():
    g = _gpt2(3)
    blocks, (start, period, count) = layer_blocks(g)
    assert count == 3, (start, period, count)  # the first layer joins the repeat (model input as a cut)


def test_layered_gpt2_stack_matches_the_original_in_float64():
    seed = fresh_seed()
    g, res = _gpt2_layered()
    assert res.layers and res.layers["repeats"] == 3 and res.layers["templates"] < res.layers["blocks"], res.layers
    assert res.egraph is None and res.history[-1].phase == "stitched"
    sp = Space.from_egraph(res)
    assert (res.nodes, res.classes) == (sp.n_nodes, sp.n_classes)
    assert res.nodes > len(g.nodes) and sum(res.firings.values()) > 0
    assert sp.stats()["choices"] > 0
    # greedy + 16 random samples + one extraction per alternative e-node (capped), all in float64 at 1e-9
    assert check_space(sp, g, seed, samples=16, per_class_cap=40, what="layered gpt2_stack(3)") >= 10


def test_layered_round_trip_keeps_the_structural_hash():
    g, res = _gpt2_layered("none")
    assert res.layers and res.stop_reason == "saturated"
    out = Space.from_egraph(res).extract()
    assert out.structural_hash() == g.structural_hash(), f"{g.dump()}\n---\n{out.dump()}"
    assert out.input_names() == g.input_names() and set(out.weight_names()) == set(g.weight_names())


def _original_choice(g, res, sp):
    """The genome that picks, in every class, the e-node of the original graph's node there."""
    snap = res.snapshot()
    ctx = res.ctx
    choices = {}
    for v, n in enumerate(g.nodes):
        if n.op == "Input" or v not in snap.class_of_handle:
            continue
        c = snap.class_of_handle[v]
        kids = tuple(snap.class_of_handle[j] for j in n.inputs)
        if n.op == "Constant":
            attrs = constant_attrs(n.attrs, ctx)
        else:
            sig = SIGS[ctor_for(n.op, len(n.inputs))]
            attrs = Attrs({k: n.attrs[k] for k, _ in sig.attrs})
        hit = [k for k, ni in enumerate(sp.classes[c])
               if sp.nodes[ni].op == n.op and sp.nodes[ni].children == kids and sp.nodes[ni].attrs == attrs]
        assert hit, f"node {v} ({n.op}) of the original is missing from its class {c}"
        choices[c] = hit[0]
    return choices


def test_saturated_stitched_egraph_still_holds_the_original():
    """Every node of the original sits in its own class, over its children's classes.

    (Extracting those choices need not give the original back: rules may prove two
    original nodes equal, e.g. a constant-only Mul and the constant it folds to.)
    """
    from egraft.ir.evaluate import evaluate
    from egraft.testing import random_inputs, rel_err

    seed = fresh_seed()
    g, res = _gpt2_layered()
    sp = Space.from_egraph(res)
    out = sp.extract(_original_choice(g, res, sp))
    inputs = random_inputs(g, seed)
    for a, b in zip(evaluate(out, inputs, np.float64), evaluate(g, inputs, np.float64)):
        assert rel_err(a, b) <= 1e-9, f"seed {seed}"


def _layered(g, what: str):
    """`g`'s layers found (5 repeats or more), saturated as layers, and its e-graph sound: (blocks, result)."""
    blocks, (start, period, count) = layer_blocks(g)
    assert count >= 5
    seed = fresh_seed()
    res = saturate(g, limits=Limits(iterations=6, seconds=30))
    assert res.layers["repeats"] == count
    assert check_space(Space.from_egraph(res), g, seed, samples=16, per_class_cap=0, what=what) >= 2
    return blocks, res


def test_an_input_every_layer_reads_does_not_hide_the_layers():
    rng = np.random.default_rng(0)
    d = 8
    b = GraphBuilder()
    x = b.input("x", (2, 4, d), "float32")
    m = b.input("m", (2, 4, d), "float32")
    for k in range(6):
        w = b.weight(f"h.{k}.w", (rng.standard_normal((d, d)) / d ** 0.5).astype(np.float32))
        x = x + ((x.layer_norm(1e-5) * m) @ w).relu()
    _layered(b.build([x]), "masked stack")


def test_a_value_computed_for_every_layer_and_outputs_inside_layers_do_not_hide_them():
    # a generation step's shape: a value every layer reads that another input computes (a rotary embedding's
    # cos / sin from the positions), and an output inside each layer (its cache update); before, neither reading
    # of the cut points found a layer, and the 494 M model's step was saturated whole (37 s instead of 2 s)
    rng = np.random.default_rng(0)
    d = 8
    b = GraphBuilder()
    x = b.input("x", (2, 4, d), "float32")
    pos = b.input("pos", (2, 4, d), "float32")
    angle = (pos * 0.5).sin() + 1.0  # computed from an input, read by every layer
    updates = []
    for k in range(6):
        w = b.weight(f"h.{k}.w", (rng.standard_normal((d, d)) / d ** 0.5).astype(np.float32))
        h = (x.layer_norm(1e-5) @ w) * angle
        updates.append(h.exp2())  # an output of the layer, read by nothing after it
        x = x + h.relu()
        if k == 1:
            updates.append(x)  # a layer's output that is also a graph output (hidden states)
    g = b.build([x.rms_norm(1e-6), *updates])
    blocks, res = _layered(g, "step-like stack")
    assert res.layers["templates"] < res.layers["blocks"]
    owned = [o for outs, _ in blocks for o in outs if o in g.outputs]
    assert sorted(owned) == sorted(g.outputs), "every output belongs to exactly one block"
    # the search splices per-block programs back: each block's own program in, the same function out
    from egraft.search.per_block import splice
    from egraft.testing import random_inputs

    assert res.parts
    xs = random_inputs(g, fresh_seed())
    for got, want in zip(evaluate(splice(g, res.parts, {}), xs), evaluate(g, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_stitcher_merges_by_congruence_and_rejects_mismatched_types():
    st = Stitcher()
    a, b = st.new_class((3,), "float32"), st.new_class((3,), "float32")
    st.add("Input", Attrs({"name": "a"}), (), a)
    st.add("Input", Attrs({"name": "b"}), (), b)
    fa, fb = st.new_class((3,), "float32"), st.new_class((3,), "float32")
    st.add("Exp2", Attrs({}), (a,), fa)
    st.add("Exp2", Attrs({}), (b,), fb)
    st.union(a, b)
    snap = st.snapshot({0: fa, 1: fb}, Context())
    assert snap.class_of_handle[0] == snap.class_of_handle[1]  # exp2(a) == exp2(b) once a == b
    assert snap.n_classes == 2 and len(snap.nodes) == 3
    c = st.new_class((4,), "float32")
    with pytest.raises(SaturationError, match="different shape"):
        st.union(a, c)
