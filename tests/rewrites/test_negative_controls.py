"""Negative controls: ``check_rule`` must reject an unsound rule, one per rule family.

Each rule below is deliberately wrong (and kept out of the registry); it does
fire on its witness and adds a well-typed but different program, so
``check_rule`` must fail with an extraction that differs from the original.
The ``state`` control is the rule the e-graph must never have: a read of a
buffer moved across a write to it (``rewrites/rules/state.py``).
"""

import numpy as np
import pytest

from egraft.ir import GraphBuilder, strided
from egraft.rewrites import all_rules
from egraft.rewrites.rule import RuleSpec, Witness, norm_strides, pair, program, rand_shape, term, view_attrs, view_term
from egraft.rewrites.ruleset import rule
from egraft.rewrites.rules import idioms, models_weights
from egraft.testing import fresh_seed
from egraft.testing.equivalence import check_rule


def _compose_wrong_offset(snap):
    """views.compose, but the composed view forgets the outer view's offset."""
    for v in snap.by_op("View"):
        for u in snap.nodes_of(v.children[0], "View"):
            src = u.children[0]
            comp = strided.compose_views(snap.shape[src], view_attrs(u), view_attrs(v))
            if comp is not None and comp[2] != 0:
                yield v.cls, view_term(src, comp[0], norm_strides(comp[0], comp[1]), 0)


def _w_slice_of_transpose(rng):
    s = rand_shape(rng, 2, lo=2)

    def build(x):
        tr = x.builder.add("View", (x,), shape=(s[1], s[0]), strides=(1, s[1]), offset=0)
        return x.builder.add("View", (tr,), shape=(s[1], s[0] - 1), strides=(s[0], 1), offset=1).sin()
    return Witness(program(build, s))


def _sum_drops_factor(snap):
    """sum(x * c) = sum(x): the factor c is ignored."""
    for r in snap.by_op("SumReduce"):
        ax = r.attrs["axis"]
        for m in snap.nodes_of(r.children[0], "Mul"):
            for x, c in (m.children, m.children[::-1]):
                if any(u.attrs["strides"][ax] == 0 for u in snap.nodes_of(c, "View")):
                    yield r.cls, term("SumReduce", x, axis=ax)


def _softmax_wrong_axis(snap):
    """idioms.softmax, but the Softmax node normalises over the other axis."""
    for cls, t in idioms._apply_softmax(snap):
        rank = len(snap.shape[cls])
        yield cls, term("Softmax", *t.children, axis=(t.attrs["axis"] + 1) % rank)


def _concat_wrong_order(snap):
    """models.shared-input, but the weights are concatenated in reverse order."""
    orig = models_weights.concat_columns
    models_weights.concat_columns = lambda parts, k, dt: orig(parts[::-1], k, dt)
    try:
        return list(models_weights._apply_shared_input(snap))
    finally:
        models_weights.concat_columns = orig


def _w_softmax(rng):
    return Witness(program(lambda x: x.softmax(-1), (3, 4)))


def _w_shared(rng):
    b_k, n1, n2 = 3, 2, 4

    def build(x):
        b = x.builder
        w1 = b.weight("w1", rng.standard_normal((b_k, n1)).astype(np.float32))
        w2 = b.weight("w2", rng.standard_normal((b_k, n2)).astype(np.float32))
        return [b.add("MatMul", [x, w1]), b.add("MatMul", [x, w2])]
    return Witness(program(build, (2, b_k)))


def _w_read_across_write(rng):
    """A write at some positions of each line, then a read of every position (j = arange(n), broadcast):
    the read sees the written values, so it cannot be moved before the write."""
    shape = rand_shape(rng, lo=2)
    ax = int(rng.integers(len(shape)))
    ishape = shape[:ax] + (int(rng.integers(1, shape[ax] + 1)),) + shape[ax + 1:]
    b = GraphBuilder()
    x = b.input("x", shape, "float32")
    i = b.input("i", ishape, "int64")
    new = x.scatter(ax, i, b.input("u", ishape, "float32") + 3.0)
    every = b.iota(shape[ax], "int64").reshape(tuple(shape[ax] if d == ax else 1 for d in range(len(shape))))
    return Witness(b.build([new.gather(ax, every.expand(shape)) * 2.0]))


UNSOUND = [
    RuleSpec("state.read-across-write", "(rewrite (Gather (Scatter x i u ax) j ax) (Gather x j ax))",
             witness=_w_read_across_write),
    RuleSpec("algebra.drop-constant", "(rewrite (Mul x (View (ScalarF c d) s st o)) x)",
             witness=lambda rng: pair(lambda x: x * 1.5, None, rand_shape(rng))),
    RuleSpec("views.compose-wrong-offset", apply=_compose_wrong_offset, witness=_w_slice_of_transpose),
    RuleSpec("reductions.sum-drops-factor", apply=_sum_drops_factor, witness=rule("reductions.sum-factor").witness),
    RuleSpec("idioms.softmax-wrong-axis", apply=_softmax_wrong_axis, witness=_w_softmax),
    RuleSpec("models.concat-wrong-order", apply=_concat_wrong_order, witness=_w_shared),
]


def test_one_negative_control_per_family():
    assert {r.family for r in UNSOUND} == {r.family for r in all_rules()}


@pytest.mark.parametrize("rule", UNSOUND, ids=[r.name for r in UNSOUND])
def test_check_rule_rejects_an_unsound_rule(rule):
    with pytest.raises(AssertionError, match="differs from the original"):
        check_rule(rule, fresh_seed())


def test_the_controls_are_not_registered():
    assert not {r.name for r in UNSOUND} & {r.name for r in all_rules()}

