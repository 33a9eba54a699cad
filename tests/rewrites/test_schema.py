"""The e-graph schema is generated from the op table, and the rule registry is pinned."""

import re
from dataclasses import replace

import egglog.bindings as eb
import pytest

from egraft.rewrites import schema

from egraft.ir import OPS, Group
from egraft.rewrites import all_rules
from egraft.rewrites.rules import views
from egraft.rewrites.schema import ARITY_CTOR, NOT_ENCODED, PRELUDE, SIGS, SORT_OF, SPECIAL, analysis_rule

SPECIAL_CTORS = {s.ctor for sigs in SPECIAL.values() for s in sigs}


def test_every_op_has_its_constructors():
    for name in Group.ALL:
        d = OPS[name]
        ctors = {s.ctor for s in SIGS.values() if s.op == name}
        if name in SPECIAL:
            assert ctors == {s.ctor for s in SPECIAL[name]}, name
            continue
        want = {name if k == 0 else ARITY_CTOR[(name, a)] for k, a in enumerate(sorted(d.arity))}
        assert ctors == want, (name, ctors, want)


def test_arities_and_attribute_sorts_agree_with_the_op_table():
    for s in SIGS.values():
        d = OPS[s.op]
        assert s.children in d.arity, s
        if s.ctor in SPECIAL_CTORS:
            continue
        want = tuple((a.name, SORT_OF[a.type]) for a in d.attrs if a.type not in NOT_ENCODED)
        assert s.attrs == want, (s, want)
    assert {s.op for s in SIGS.values()} == set(Group.ALL)


def test_every_constructor_is_declared_and_has_an_analysis_rule():
    for s in SIGS.values():
        args = " ".join(["T"] * s.children + [sort for _, sort in s.attrs])
        assert f"(constructor {s.ctor} ({args}) T)" in PRELUDE
        assert f':name "analysis:{s.ctor}")' in PRELUDE
        assert analysis_rule(s) in PRELUDE


def test_the_prelude_loads_in_egglog():
    eg = eb.EGraph()
    eg.run_program(*eg.parse_program(PRELUDE))


def test_view_rules_cover_every_elementwise_op():
    for op in Group.UNARY:
        assert f"(View ({op} a) s st o)" in views.PUSH_UNARY and f"({op} (View a s st o))" in views.PULL_UNARY
    for op in Group.BINARY:
        assert f"(View ({op} a b) s st o)" in views.PUSH_BINARY and f"(= e ({op} (View a" in views.PULL_BINARY
    for op in Group.ELEMENTWISE:
        assert f"(View ({op} " in views.PUSH_UNARY + views.PUSH_BINARY, op


def test_a_new_unary_primitive_needs_no_edit_in_rewrites(monkeypatch):
    """A unary op added to the table gets a constructor and an analysis rule from its kind alone."""
    monkeypatch.setattr(schema, "OPS", {**OPS, "Cos": replace(OPS["Sin"], name="Cos")})
    monkeypatch.setattr(Group, "UNARY", Group.UNARY | {"Cos"})
    monkeypatch.setattr(Group, "ELEMENTWISE", Group.ELEMENTWISE | {"Cos"})
    sigs = schema._generate()
    assert sigs["Cos"] == schema.Sig("Cos", "Cos", 1, ())
    rule = schema.analysis_rule(sigs["Cos"])
    assert "(= e (Cos c0))" in rule and "((set (shape e) sc0) (set (dtype e) dc0))" in rule


# the registry: a lost or misspelt rule module fails here
FAMILIES = {"algebra": 20, "views": 7, "reductions": 5, "idioms": 6, "models": 10, "state": 2}


def test_rule_families_and_counts_are_pinned():
    rules = all_rules()
    counts = {}
    for r in rules:
        counts[r.family] = counts.get(r.family, 0) + 1
    assert counts == FAMILIES


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.name)
def test_rule_names_are_family_dot_kebab_name(rule):
    assert re.fullmatch(r"[a-z][a-z0-9]*\.[a-z0-9]+(-[a-z0-9]+)*", rule.name)
    assert rule.family == rule.name.split(".")[0] in FAMILIES
