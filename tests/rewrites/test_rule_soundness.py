"""Every registered rule (every family, every module) fires on its witness and is sound.

Soundness: all extractions of the witness's e-graph (greedy, random samples and
one per alternative e-node) equal the witness in float64 within 1e-9, on
random inputs, for several random shapes.  A rule without a witness fails.
"""

import pytest

from egraft.testing.equivalence import check_rule
from egraft.rewrites.registry import all_rules
from egraft.testing import fresh_seed

RULES = all_rules()


def test_registry_is_not_empty():
    fams = {r.family for r in RULES}
    assert {"algebra", "views", "reductions"} <= fams, fams


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_rule_is_sound(rule):
    assert rule.witness is not None, f"rule {rule.name} has no soundness witness"
    base = fresh_seed()
    for k in range(3):  # several random shapes
        check_rule(rule, base + k)
