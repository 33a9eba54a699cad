"""Every op of ``Group.ALL`` (primitives, leaves, View, idioms) has a lowering rule in every backend, and nothing else does."""

from __future__ import annotations

import pytest

from egraft.backends import NAMES, get_backend
from egraft.ir import OPS, Group


@pytest.mark.parametrize("name", NAMES)
def test_rule_table_covers_every_op(name):
    table = get_backend(name).rule_table()
    for op in sorted(Group.ALL):
        assert op in table, f"backend {name!r} has no lowering rule for op {op!r}: add one to its rule table"
        assert table[op] is not None, f"backend {name!r} has a None rule for op {op!r}"
    unknown = sorted(set(table) - Group.ALL)
    assert not unknown, f"backend {name!r} has rules for ops the IR does not define: {unknown}"


def test_group_all_is_the_registry():
    assert Group.ALL == set(OPS), "Group.ALL and the op registry disagree"
    grouped = (Group.ELEMENTWISE | Group.REDUCE | Group.INDEX | Group.MOVEMENT | Group.LEAF | Group.IDIOM)
    assert grouped == Group.ALL, f"ops in no group: {sorted(Group.ALL - grouped)}"
