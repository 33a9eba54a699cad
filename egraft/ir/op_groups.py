"""All op definitions (primitives, leaves, View and idioms) in one lookup, and their named groups."""

from __future__ import annotations

from ..errors import IRError
from .idioms import IDIOMS
from .ops import BASE_OPS, OpDef, PRIMITIVES

OPS: dict[str, OpDef] = {**BASE_OPS, **IDIOMS}


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise IRError(f"unknown IR op {name!r}; known ops: {', '.join(sorted(OPS))}") from None


def _kinds(*kinds: str) -> frozenset[str]:
    return frozenset(name for name, d in OPS.items() if d.kind in kinds)


class Group:
    """Named sets of op names, derived from the tables (in the spirit of tinygrad's ``GroupOp``).

    Backends, rules, the fuzzer and the tests take their op lists from here,
    never keep their own: a new unary primitive joins ``UNARY`` and
    ``ELEMENTWISE`` by its ``kind`` in the op table alone.
    """

    UNARY = _kinds("unary")
    BINARY = _kinds("binary")
    SELECT = _kinds("select")
    TYPE = _kinds("type")
    ELEMENTWISE = UNARY | BINARY | SELECT | TYPE  # one output element from the same index of each operand
    REDUCE = _kinds("reduce")
    INDEX = _kinds("index")
    MOVEMENT = _kinds("movement")
    LEAF = _kinds("leaf")
    PRIMITIVE = frozenset(PRIMITIVES)
    IDIOM = frozenset(IDIOMS)
    ROW_IDIOM = _kinds("row")  # one independent computation per row of one axis (softmax, norms)
    CONTRACTION = _kinds("contraction")
    ATTENTION = _kinds("attention")
    ALL = frozenset(OPS)  # every op a graph may hold; every backend has a rule for each


__all__ = ["Group", "OPS", "PRIMITIVES", "IDIOMS", "get_op"]
