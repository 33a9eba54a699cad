"""Saturation limits, stop reasons, stats and loud failures."""

import pytest

from egraft.errors import SaturationError
from egraft.ir import GraphBuilder
from egraft.rewrites import Limits, RuleSpec, saturate
from egraft.rewrites.ruleset import all_rules
from egraft.rewrites.rule import program
from egraft.rewrites.rules.algebra import RULES as ALGEBRA

COMM_ASSOC = [r for r in ALGEBRA if r.name in ("algebra.comm", "algebra.assoc")]


def _sum_chain(n=12):
    """x0 + x1 + ... + x_{n-1} and their product: comm/assoc explode on it."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", (2,), "float32") for i in range(n)]
    s, p = xs[0], xs[0]
    for x in xs[1:]:
        s, p = s + x, p * x
    return b.build([s, p])


def test_no_rules_saturates_immediately():
    g = program(lambda x: x.sin() * 2.0, (3,))
    res = saturate(g, rules=[], limits=Limits(repeated_layers=False))
    assert res.stop_reason == "saturated"
    assert res.nodes == len(g.nodes) and res.classes == len(g.nodes)
    assert res.history[0].phase == "start"


def test_drop_egraph_keeps_the_snapshot_and_lets_egglog_go():
    g = _sum_chain(6)
    res = saturate(g, rules=COMM_ASSOC, limits=Limits(iterations=2, repeated_layers=False))
    assert res.egraph is not None
    want = res.snapshot()
    assert res.drop_egraph() is res and res.egraph is None
    assert res.snapshot() is want and len(want.nodes) == res.nodes
    assert res.drop_egraph().snapshot() is want  # a second drop changes nothing


def test_the_search_drops_its_own_saturation_s_egraph(monkeypatch):
    from egraft.search import Budget, search
    from egraft.search import space

    seen = []
    real = space.Space.from_egraph.__func__

    def from_egraph(cls, result):
        seen.append(result.egraph)
        return real(cls, result)

    monkeypatch.setattr(space.Space, "from_egraph", classmethod(from_egraph))
    search(program(lambda x: x.sin() * 2.0, (3,)), budget=Budget(trials=2), fitness="model", cache=False,
           progress=False, limits=Limits(repeated_layers=False))
    assert seen == [None]


def test_node_limit_is_respected_within_one_bounded_step():
    g = _sum_chain()
    lim = Limits(nodes=300, match_limit=200, explosive_iterations=3, iterations=50, seconds=60, repeated_layers=False)
    res = saturate(g, rules=COMM_ASSOC, limits=lim)
    assert res.stop_reason == "node limit", res.summary()
    # one bounded step: <= explosive_iterations * rules * match_limit * 2^bans new matches, far below unbounded growth
    assert res.nodes <= lim.nodes + 3 * 4 * 200 * 4 * 3, res.summary()
    assert res.history[-1].nodes == res.nodes


def test_iteration_limit():
    g = _sum_chain(6)
    res = saturate(g, rules=all_rules(), limits=Limits(iterations=1, repeated_layers=False))
    assert res.stop_reason == "iteration limit"
    assert res.iterations == 1


def test_time_limit():
    g = _sum_chain(6)
    res = saturate(g, rules=all_rules(), limits=Limits(seconds=0.0, repeated_layers=False))
    assert res.stop_reason == "time limit"
    assert res.iterations <= 1


def test_explosive_phase_runs_after_safe_fixpoint_and_counts_firings():
    g = _sum_chain(5)
    res = saturate(g, rules=ALGEBRA, limits=Limits(explosive_iterations=2, repeated_layers=False))
    phases = [h.phase for h in res.history]
    assert "explosive" in phases and phases.index("explosive") > phases.index("safe")
    assert res.firings["algebra.comm"] > 0 and res.firings["algebra.assoc"] > 0
    assert res.nodes > len(g.nodes)


def test_conflicting_shape_facts_raise_saturation_error():
    bad = RuleSpec("bad.drop-reduce", "(rewrite (SumReduce x a) x)")
    g = program(lambda x: x.sum(0).sin(), (3, 4))
    with pytest.raises(SaturationError, match="shape or dtype"):
        saturate(g, rules=[bad], limits=Limits(repeated_layers=False))


def test_conflicting_dtype_facts_raise_saturation_error():
    bad = RuleSpec("bad.drop-cast", "(rewrite (Cast x d) x)")
    g = program(lambda x: x.cast("float64").sin(), (3,))
    with pytest.raises(SaturationError):
        saturate(g, rules=[bad], limits=Limits(repeated_layers=False))


def test_bad_rule_text_is_reported():
    with pytest.raises(ValueError, match="ruleset"):
        saturate(program(lambda x: x, (2,)), rules=[RuleSpec("bad.named", "(rewrite (Sin x) x :ruleset safe)")])
    with pytest.raises(SaturationError, match="egglog failed"):
        saturate(program(lambda x: x, (2,)), rules=[RuleSpec("bad.syntax", "(rewrite (NoSuchOp x) x)")])


def test_rule_spec_requires_one_body():
    with pytest.raises(ValueError, match="exactly one"):
        RuleSpec("bad.no-body")
    with pytest.raises(ValueError, match="exactly one"):
        RuleSpec("bad.two-bodies", "(rewrite (Sin x) x)", apply=lambda snap: [])


@pytest.mark.parametrize("name", ["x y", "x", "models/row_scale", "idioms.online_softmax", "Algebra.comm", "a.builder.c"])
def test_rule_names_are_family_dot_kebab_name(name):
    with pytest.raises(ValueError, match="family.kebab-name"):
        RuleSpec(name, "(rewrite (Sin x) x)")


def test_rule_family_is_the_name_prefix():
    assert RuleSpec("models.row-scale", apply=lambda snap: []).family == "models"
