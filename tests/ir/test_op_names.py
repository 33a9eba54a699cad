"""Ops are named through the op table, never spelt as strings: a misspelt op fails in CI.

Every module in ``egraft/`` is parsed and two things are checked, in function
bodies too (where a typo would otherwise fail only when that line runs):

* no string literal is compared with an op (``node.op == "Add"``,
  ``op in ("Add", "Mul")``, ``"View" != n.op``) and no literal that names an op
  is compared with anything or used as a lookup key (``ix.by_op["Mul"]``,
  ``ix.nodes(c, "Exp2")``, where a typo silently finds nothing): such code reads ``ir.Op.Add`` or an ``ir.Group`` set.
  The one other kind of ``.op`` egraft reads is a ``torch.fx`` node's opcode,
  which is torch's own fixed set (:data:`FX_OPCODES`): a literal compared with
  an op is one of those or it is reported (``"placeholdr"`` too);
* every ``Op.<name>`` is an op of the table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from egraft.ir import OPS, Op

ROOT = Path(__file__).resolve().parents[2] / "egraft"

# torch.fx.Node.op values (torch/fx/node.py): a torch graph's node kinds, not IR ops
FX_OPCODES = frozenset({"placeholder", "call_function", "call_method", "call_module", "get_attr", "output", "root"})


def _op_like(e: ast.expr) -> bool:
    """An expression that holds an op name: ``op``, ``x_op``, ``node.op``, ``self.root_op``."""
    name = e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else None
    return name is not None and (name == "op" or name.endswith("_op"))


def _op_table(e: ast.expr) -> bool:
    """A lookup keyed by op name: ``ix.by_op``, ``RULES_BY_OP``, ``per_op``."""
    name = e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else ""
    return name.lower() == "by_op" or name.lower().endswith(("_op", "_by_op"))


def _literals(e: ast.expr) -> list[str]:
    """The string literals of `e`: itself, or the items of a tuple/list/set display."""
    items = e.elts if isinstance(e, (ast.Tuple, ast.List, ast.Set)) else [e]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def violations(source: str, filename: str = "<src>") -> list[str]:
    """Each op spelt as a string, or ``Op.<name>`` not in the table, in `source` as ``file:line: what``."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for (a, b), cmp in zip(zip(sides, sides[1:]), node.ops):
                if not isinstance(cmp, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                # ``x in "..."`` on an op is a substring test of the op's name, not a comparison of it
                pairs = ((a, b),) if isinstance(cmp, (ast.In, ast.NotIn)) else ((a, b), (b, a))
                lits = _literals(a) + _literals(b)
                if any(s in OPS for s in lits) or any(
                        _op_like(x) and _literals(y) and not set(_literals(y)) <= FX_OPCODES for x, y in pairs):
                    out.append(f"{filename}:{node.lineno}: {ast.unparse(node)} (use Op.<name> or a Group)")
        elif isinstance(node, ast.Subscript) and _literals(node.slice):
            key = _literals(node.slice)[0]
            if key in OPS or (_op_table(node.value) and key not in FX_OPCODES):  # ix.by_op["Mull"] finds nothing
                out.append(f"{filename}:{node.lineno}: {ast.unparse(node)} (use Op.<name>)")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "nodes"
              and len(node.args) == 2 and _literals(node.args[1])):  # Index.nodes(cls, "Exp2"): the e-nodes of one op
            out.append(f"{filename}:{node.lineno}: {ast.unparse(node)} (use Op.<name>)")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Op":
            if node.attr not in OPS:
                out.append(f"{filename}:{node.lineno}: Op.{node.attr} is not an op of the table")
    return out


def test_no_op_is_spelt_as_a_string():
    bad = [v for p in sorted(ROOT.rglob("*.py")) for v in violations(p.read_text(), str(p.relative_to(ROOT.parent)))]
    assert not bad, "ops compared as strings, or unknown Op names:\n" + "\n".join(bad)


@pytest.mark.parametrize("planted", [
    'def f(n):\n    return n.op == "Add"\n',
    'def f(node):\n    return node.op in ("View", "Cast")\n',
    'def f(op):\n    if "Mull" != op:\n        return 1\n',
    'def f(name):\n    return name in {"MatMul"}\n',
    'def f(n):\n    return n.op == Op.Addd\n',
    'X = Op.Viwe\n',
    'def f(node):\n    return node.op == "placeholdr"\n',
    'def f(ctor):\n    return ctor == "Input"\n',
    'def f(ix):\n    return ix.by_op["Mull"]\n',
    'def f(table):\n    return table["Softmax"]\n',
    'def f(ix, c):\n    return ix.nodes(c, "Exp22")\n',
])
def test_the_check_sees_a_planted_violation(planted):
    """Negative control: every form the check exists for is reported, typos inside function bodies included."""
    assert violations(planted), planted


def test_the_check_passes_table_names():
    ok = ('def f(n, ctx, ix, opts):\n    return (n.op == Op.Add or n.op in Group.UNARY or n.kind == "unary"\n'
          '            or n.op == "call_function" or "with_indices" in ctx.op or ix.by_op[Op.Mul] or opts["cache"])\n')
    assert not violations(ok)


def test_op_names_are_the_table():
    """``Op.X`` is the plain string ``"X"`` (``Node.op`` stays a str), one per op; an unknown name fails clearly."""
    assert Op.Add == "Add" and type(Op.MatMul) is str
    assert sorted(Op) == sorted(OPS)
    with pytest.raises(AttributeError, match="unknown IR op 'Addd'"):
        Op.Addd  # noqa: B018
    with pytest.raises(AttributeError):
        Op.Add = "Sub"
