"""Every registered rule (every family, every module): every form fires and is sound, and
every guarded rule keeps its guard.

* Each witness of a rule (``rule.forms``: one per operand order, literal
  spelling, egglog command, procedural branch) must make the rule fire, and
  every extraction of the witness's e-graph (greedy, random samples and one
  per alternative e-node) must equal the witness in float64 within 1e-9, on
  random inputs, for several random shapes.
* Every egglog command of a rule (both directions of a birewrite) must fire
  on some witness of that rule: a form without a witness fails here.
* Each near-miss (``rule.near_misses``: the left side with its guard
  violated) must not make the rule fire; every rule outside
  :data:`UNGUARDED` needs at least one.
"""

from collections import Counter

import numpy as np
import pytest

from egraft.rewrites import saturate
from egraft.rewrites.ruleset import all_rules
from egraft.rewrites.session import command_names
from egraft.testing import fresh_seed
from egraft.testing.equivalence import RULE_LIMITS, check_form, check_near_miss

RULES = all_rules()
FORMS = [(r, k) for r in RULES for k in range(len(r.forms))]
NEAR = [(r, k) for r in RULES for k in range(len(r.near_misses))]
EGGLOG = [r for r in RULES if r.egglog is not None]

# rules whose left side has no side condition (no guard to miss); every other rule needs a near-miss
UNGUARDED = {
    "algebra.mul-one", "algebra.exp2-mul", "algebra.recip-recip", "algebra.recip-mul", "algebra.recip-exp2",
    "algebra.recip-sqrt", "algebra.where-const", "algebra.factor", "algebra.expand", "algebra.comm",
    "algebra.assoc", "views.push-unary", "views.push-binary", "views.pull-unary", "models.reassoc-rev",
}


def test_registry_is_not_empty():
    fams = {r.family for r in RULES}
    assert {"algebra", "views", "reductions"} <= fams, fams


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_rule_has_witnesses_and_guarded_rules_have_near_misses(rule):
    assert rule.forms, f"rule {rule.name} has no soundness witness"
    assert rule.name in UNGUARDED or rule.near_misses, (
        f"rule {rule.name} has a guard but no near-miss: add near_misses=(...) (a program that looks like "
        "the left side but violates the guard), or list the rule in UNGUARDED if it has no side condition")


def test_unguarded_names_are_rules():
    assert UNGUARDED <= {r.name for r in RULES}


@pytest.mark.parametrize("rule,k", FORMS, ids=[f"{r.name}-form{k}" for r, k in FORMS])
def test_every_form_fires_and_is_sound(rule, k):
    base = fresh_seed()
    for j in range(3):  # several random shapes
        check_form(rule, rule.forms[k], base + j, what=f" (form {k})")


@pytest.mark.parametrize("rule", EGGLOG, ids=[r.name for r in EGGLOG])
def test_every_egglog_command_fires_on_some_witness(rule):
    fired: Counter = Counter()
    base = fresh_seed()
    for make in rule.forms:
        for j in range(2):
            res = saturate(make(np.random.default_rng(base + j)).lhs, rules=[rule], limits=RULE_LIMITS)
            fired.update(res.form_firings)
    missing = [c for c in command_names(rule) if not fired[c]]
    assert not missing, (f"rule {rule.name}: commands {missing} fired on none of its witnesses (seed {base}); "
                         "add a witness for that form (witnesses=(...))")


@pytest.mark.parametrize("rule,k", NEAR, ids=[f"{r.name}-near{k}" for r, k in NEAR])
def test_near_miss_does_not_fire(rule, k):
    base = fresh_seed()
    for j in range(3):
        check_near_miss(rule, rule.near_misses[k], base + j, what=f" {k}")
