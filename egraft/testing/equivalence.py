"""Numerical soundness checks for rules and e-graphs (used by tests/rewrites and the fuzzer).

``check_rule(rule, seed)`` saturates each of the rule's witnesses (one per form,
``rule.forms``) with that rule alone, requires that it fired, and evaluates variants of the e-graph -- greedy, random
samples, and one extraction per alternative e-node of every class -- in float64
against the witness's LHS.  ``check_space(space, graph, seed)`` does the same for
any saturated graph; ``check_near_miss`` requires that a rule does NOT fire on a
program that violates its guard.  Failures raise AssertionError naming the seed to replay.
"""

from __future__ import annotations

import numpy as np

from ..ir.evaluate import evaluate
from ..search.space import Space
from . import random_inputs, rel_err
from ..rewrites import Limits, RuleSpec, saturate

TOL = 1e-9
# Errors are relative to max(|output|, SCALE_FLOOR): a float64 rewrite that
# reassociates a sum whose exact value is 0 (e.g. the sum over a layer norm's
# row) changes rounding noise of ~1e-16 by 100%, which is not unsoundness.
SCALE_FLOOR = 1.0
RULE_LIMITS = Limits(iterations=6, nodes=20_000, seconds=30.0, explosive_iterations=1, repeated_layers=False)


def variants(space: Space, rng: np.random.Generator, samples: int = 16, per_class_cap: int = 200):
    """(label, graph) pairs: greedy, random samples, and one per alternative e-node (capped)."""
    yield "greedy", space.greedy()
    for k in range(samples):
        yield f"sample{k}", space.sample(rng)
    n = 0
    for c, usable in enumerate(space.usable):
        if len(usable) < 2:
            continue
        for ni in usable:
            if n >= per_class_cap:
                return
            ch = list(space.safe)
            ch[c] = ni
            n += 1
            yield f"class{c}:node{ni}({space.nodes[ni].op})", space.build(ch)


def check_space(space: Space, graph, seed: int, samples: int = 16, per_class_cap: int = 200, what: str = "") -> int:
    """Every variant of `space` equals `graph` in float64; returns how many were checked."""
    rng = np.random.default_rng(seed)
    inputs = random_inputs(graph, seed)
    want = evaluate(graph, inputs, np.float64)
    seen, count = set(), 0
    for label, g in variants(space, rng, samples, per_class_cap):
        h = g.structural_hash()
        if h in seen:
            continue
        seen.add(h)
        got = evaluate(g, inputs, np.float64)
        for k, (a, b) in enumerate(zip(got, want)):
            e = rel_err(a, b, SCALE_FLOOR)
            assert e <= TOL, (f"{what}: extraction {label} differs from the original on output {k}: "
                              f"rel err {e:.3g} (seed {seed})\n{g.dump()}")
        count += 1
    return count


def check_form(rule: RuleSpec, make, seed: int, samples: int = 8, what: str = ""):
    """One witness `make` of `rule`: it fires, and every extraction equals the LHS.

    Returns ``(result, checked)``: the saturation (its ``form_firings`` say which
    egglog commands fired) and how many distinct extractions were checked."""
    what = f"rule {rule.name}{what}"
    rng = np.random.default_rng(seed)
    w = make(rng)
    if w.rhs is not None:
        inputs = random_inputs(w.lhs, seed)
        for k, (a, b) in enumerate(zip(evaluate(w.rhs, inputs, np.float64), evaluate(w.lhs, inputs, np.float64))):
            e = rel_err(a, b, SCALE_FLOOR)
            assert e <= TOL, f"{what}: witness rhs differs from lhs (rel err {e:.3g}, seed {seed})"
    res = saturate(w.lhs, rules=[rule], limits=RULE_LIMITS)
    assert res.firings.get(rule.name, 0) > 0, f"{what} did not fire on its witness (seed {seed}):\n{w.lhs.dump()}"
    return res, check_space(Space.from_egraph(res), w.lhs, seed, samples=samples, what=what)


def check_rule(rule: RuleSpec, seed: int, samples: int = 8) -> int:
    """The rule fires on each of its witnesses (``rule.forms``) and every resulting extraction
    equals the witness; returns how many extractions were checked."""
    assert rule.forms, f"rule {rule.name} has no soundness witness"
    return sum(check_form(rule, make, seed, samples, f" (form {k})")[1] for k, make in enumerate(rule.forms))


def check_near_miss(rule: RuleSpec, make, seed: int, samples: int = 8, what: str = "") -> int:
    """A near-miss (guard violated): the rule must not fire on it (unless built with
    ``may_fire=True``), and every extraction equals it; returns the firing count."""
    w = make(np.random.default_rng(seed))
    res = saturate(w.lhs, rules=[rule], limits=RULE_LIMITS)
    n = res.firings.get(rule.name, 0)
    assert w.may_fire or n == 0, (
        f"rule {rule.name} fired {n}x on near-miss{what} whose guard is violated (seed {seed}):\n{w.lhs.dump()}")
    if n:
        check_space(Space.from_egraph(res), w.lhs, seed, samples=samples, what=f"rule {rule.name} near-miss{what}")
    return n
