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


class _OpTable(type):
    """The metaclass of :class:`Op`: read-only, iterable, and an unknown name fails naming the known ones."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"unknown IR op {name!r}; known ops: {', '.join(sorted(OPS))}")

    def __setattr__(cls, name, value):
        raise AttributeError(f"Op is generated from the op table; add {name!r} to ir/ops.py or ir/idioms.py instead")

    def __iter__(cls):
        return iter(OPS)


Op = _OpTable("Op", (), {
    "__doc__": """Every op's name, generated from the tables: ``Op.Add == "Add"`` (a plain str, so ``Node.op`` stays one).

    Code names an op as ``Op.Add`` or takes a :class:`Group`, never the string
    ``"Add"``: a misspelt ``Op.Addd`` fails (``tests/ir/test_op_names.py`` finds
    it statically, in function bodies too).
    """,
    **{name: name for name in OPS},
})


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


__all__ = ["Group", "OPS", "Op", "PRIMITIVES", "IDIOMS", "get_op"]
