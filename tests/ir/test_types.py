"""Type rules: every op's ``infer`` rejects ill-typed nodes with an IRError that names the op."""

from __future__ import annotations

import numpy as np
import pytest

from egraft.errors import IRError
from egraft.ir import OPS, GraphBuilder, Group, TensorValue
from egraft.ir.graph import infer_node

F = "float32"


def _t(shape, dt=F):
    return (tuple(shape), dt)


# (op, input types, attrs, substring the message must also contain)
BAD = [
    # elementwise binary
    ("Add", [_t((3,)), _t((4,))], {}, "identical shapes"),
    ("Mul", [_t((3, 1)), _t((3, 4))], {}, "identical shapes"),
    ("Add", [_t((3,)), _t((3,), "float16")], {}, "one dtype"),
    ("LessThan", [_t((3,), "int32"), _t((3,), "int64")], {}, "one dtype"),
    ("Mod", [_t((3,), "bool"), _t((3,), "bool")], {}, "bool"),
    ("Nibble", [_t((3,)), _t((3,))], {}, "int8"),
    ("Nibble", [_t((3,), "int8"), _t((4,), "int8")], {}, "identical shapes"),
    # float-only unary ops
    *[(op, [_t((3,), dt)], {}, "floating-point") for op in sorted(Group.UNARY)
      for dt in ("int32", "int64", "bool")],
    # select
    ("Where", [_t((3,), F), _t((3,)), _t((3,))], {}, "bool condition"),
    ("Where", [_t((4,), "bool"), _t((3,)), _t((3,))], {}, "shape"),
    ("Where", [_t((3,), "bool"), _t((3,)), _t((3,), "int32")], {}, "dtype"),
    # reductions
    ("SumReduce", [_t((3, 4))], {"axis": 2}, "axis"),
    ("SumReduce", [_t((3, 4))], {"axis": -1}, "axis"),
    ("MaxReduce", [_t((3, 4))], {"axis": 1.0}, "axis"),
    ("MaxReduce", [_t((3, 4))], {"axis": None}, "axis"),
    ("SumReduce", [_t(())], {"axis": 0}, "rank"),
    ("SumReduce", [_t((3,), "bool")], {"axis": 0}, "bool"),
    ("MaxReduce", [_t((3, 0))], {"axis": 1}, "empty"),
    # index
    ("Iota", [], {"n": -1, "dtype": "int64"}, "length"),
    ("Iota", [], {"n": 2.5, "dtype": "int64"}, "length"),
    ("Iota", [], {"n": 3, "dtype": "bool"}, "bool"),
    ("Iota", [], {"n": 3, "dtype": "uint8"}, "dtype"),
    ("Gather", [_t((3, 4)), _t((3, 4), F)], {"axis": 0}, "int32 or int64"),
    ("Gather", [_t((3, 4)), _t((3,), "int64")], {"axis": 0}, "rank"),
    ("Gather", [_t((3, 4)), _t((2, 5), "int64")], {"axis": 0}, "except on axis"),
    ("Gather", [_t((3, 4)), _t((3, 4), "int64")], {"axis": 2}, "axis"),
    ("Gather", [_t((3, 4)), _t((3, 4), "int64")], {"axis": -1}, "axis"),
    ("Scatter", [_t((3, 4)), _t((3, 2), F), _t((3, 2))], {"axis": 1}, "int32 or int64"),
    ("Scatter", [_t((3, 4)), _t((3, 2), "int64"), _t((3, 2), "float16")], {"axis": 1}, "Cast first"),
    ("Scatter", [_t((3, 4)), _t((3, 2), "int64"), _t((3, 3))], {"axis": 1}, "one shape"),
    ("Scatter", [_t((3, 4)), _t((6,), "int64"), _t((6,))], {"axis": 0}, "rank"),
    ("Scatter", [_t((3, 4)), _t((2, 2), "int64"), _t((2, 2))], {"axis": 1}, "except on axis"),
    ("Scatter", [_t((3, 4)), _t((3, 4), "int64"), _t((3, 4))], {"axis": 2}, "axis"),
    ("Scatter", [_t((3, 4)), _t((3, 4), "int64"), _t((3, 4))], {"axis": -1}, "axis"),
    # type
    ("Cast", [_t((3,))], {"dtype": "float8"}, "float8"),
    # movement
    ("View", [_t((3, 4))], {"shape": (12,), "strides": (1, 1), "offset": 0}, "rank"),
    ("View", [_t((3, 4))], {"shape": (-1,), "strides": (1,), "offset": 0}, "negative"),
    ("View", [_t((3, 4))], {"shape": (13,), "strides": (1,), "offset": 0}, "outside"),
    ("View", [_t((3, 4))], {"shape": (4,), "strides": (1,), "offset": 9}, "outside"),
    ("View", [_t((3, 4))], {"shape": (3,), "strides": (1,), "offset": -1}, "outside"),
    ("View", [_t((3, 4))], {"shape": (3,), "strides": (-4,), "offset": 4}, "outside"),
    ("View", [_t((3, 4))], {"shape": (2, 2), "strides": (0, 12), "offset": 0}, "outside"),
    # leaves
    ("Input", [], {"name": "x", "shape": (3,), "dtype": "complex64", "role": "input"}, "complex64"),
    ("Input", [], {"name": "x", "shape": (-2, 3), "dtype": F, "role": "input"}, "shape"),
    ("Constant", [], {"value": 1.0, "shape": (3,), "dtype": F}, "scalar"),
    ("Constant", [], {"value": "one", "shape": (), "dtype": F}, "scalar"),
    ("Constant", [], {"value": TensorValue(np.ones((2, 2))), "shape": (4,), "dtype": F}, "shape"),
    ("Constant", [], {"value": 1.5, "shape": (), "dtype": "int32"}, "int32"),
    ("Constant", [], {"value": 2 ** 40, "shape": (), "dtype": "int32"}, "int32"),
    # idioms
    ("MatMul", [_t((3, 4)), _t((5, 6))], {}, "[..., K, N]"),
    ("MatMul", [_t((2, 3, 4)), _t((3, 4, 5))], {}, "batch"),
    ("MatMul", [_t((4,)), _t((4, 5))], {}, "M, K"),
    ("MatMul", [_t((3, 4), "int32"), _t((4, 5), "int32")], {}, "floating-point"),
    ("MatMul", [_t((3, 4)), _t((4, 5), "float16")], {}, "one dtype"),
    ("Softmax", [_t((3, 4))], {"axis": 2}, "axis"),
    ("Softmax", [_t((3, 4), "int64")], {"axis": 1}, "floating-point"),
    ("LayerNorm", [_t((3, 4))], {"axis": -1, "eps": 1e-5}, "axis"),
    ("RMSNorm", [_t((3, 4), "bool")], {"axis": 1, "eps": 1e-5}, "floating-point"),
    ("Attention", [_t((2, 3, 8)), _t((2, 5, 7)), _t((2, 5, 8))], {"scale": 1.0, "causal": False}, "line up"),
    ("Attention", [_t((2, 3, 8)), _t((2, 5, 8)), _t((2, 4, 8))], {"scale": 1.0, "causal": False}, "line up"),
    ("Attention", [_t((2, 3, 8)), _t((1, 5, 8)), _t((1, 5, 8))], {"scale": 1.0, "causal": False}, "batch"),
    ("Attention", [_t((2, 3, 8)), _t((2, 5, 8)), _t((2, 5, 8)), _t((2, 3, 4))], {"scale": 1.0, "causal": False},
     "bias"),
    ("Attention", [_t((3, 8), "int32")] * 3, {"scale": 1.0, "causal": False}, "floating-point"),
]


def _id(case):
    op, ts, attrs, _ = case
    return f"{op}-" + "-".join(f"{s}{d}" for s, d in ts) + "-" + ",".join(f"{k}={v}" for k, v in attrs.items())


@pytest.mark.parametrize("case", BAD, ids=[_id(c) for c in BAD])
def test_infer_rejects(case):
    op, ts, attrs, needle = case
    with pytest.raises(IRError) as e:
        infer_node(op, ts, attrs)
    msg = str(e.value)
    assert op in msg, f"message does not name the op {op}: {msg}"
    assert needle.lower() in msg.lower(), f"message does not mention {needle!r}: {msg}"


def test_every_op_has_a_rejection_case():
    assert {c[0] for c in BAD} == set(OPS)


def _good_attrs(op):
    return {a: {"axis": 0, "dtype": F, "n": 3, "shape": (3,), "strides": (1,), "offset": 0, "name": "x",
                "role": "input", "value": 0.0, "eps": 1e-5, "scale": 1.0, "causal": False}[a] for a in OPS[op].attr_names}


@pytest.mark.parametrize("op", sorted(OPS))
def test_bad_arity(op):
    n = max(OPS[op].arity) + 1
    with pytest.raises(IRError, match=rf"{op} takes .* inputs, got {n}"):
        infer_node(op, [_t((3,))] * n, _good_attrs(op))


@pytest.mark.parametrize("op", sorted(o for o in OPS if OPS[o].attr_names))
def test_missing_attribute(op):
    attrs = _good_attrs(op)
    attrs.pop(OPS[op].attr_names[0])
    with pytest.raises(IRError, match=rf"{op} is missing attribute"):
        infer_node(op, [_t((3,))] * min(OPS[op].arity), attrs)


def test_unknown_op_is_named():
    with pytest.raises(IRError, match="'Conv2d'"):
        infer_node("Conv2d", [_t((3,))], {})


def test_builder_add_checks_types_too():
    b = GraphBuilder()
    x = b.input("x", (3,), "int32")
    with pytest.raises(IRError, match="Sqrt"):
        b.add("Sqrt", (x,))
    y = b.input("y", (4,), "int32")
    with pytest.raises(IRError, match="Add"):
        b.add("Add", (x, y))
    assert [n.op for n in b.nodes] == ["Input", "Input"], "a rejected node must not be appended"
