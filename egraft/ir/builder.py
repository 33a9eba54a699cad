"""A terse way to write IR: ``GraphBuilder`` plus operator-overloaded ``Tensor``.

Decompositions (torch lowering rules, idiom primitive forms, rewrite right
sides) are written against this API: ``(x - x.max(-1, keepdim=True)).exp()``.
The builder broadcasts and promotes dtypes the numpy way by inserting
explicit ``View`` / ``Cast`` nodes, folds chains of views into one view
where the composition is strided, and shares identical nodes (CSE).

``Tensor`` is assembled here from one mixin per concern: operators
(:mod:`.tensor_ops`), composite math (:mod:`.tensor_math`), movement
(:mod:`.tensor_movement`) and the idioms' primitive forms
(:mod:`.idiom_forms`) over the handle core (:mod:`.tensor_base`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from . import dtypes, shapes, strided
from .graph import Attrs, Graph, Node, infer_node
from .idiom_forms import IdiomMethods
from .op_groups import Op
from .ops import TensorValue
from .tensor_base import TensorBase, in_float32, promote
from .tensor_math import MathLib
from .tensor_movement import Movement, cat, stack
from .tensor_ops import Operators


class Tensor(Operators, MathLib, Movement, IdiomMethods, TensorBase):
    """A handle on one builder node; arithmetic on it appends IR nodes."""

    __slots__ = ()


class GraphBuilder:
    """Appends well-typed nodes, sharing identical ones; ``build`` makes the (pruned) :class:`Graph`."""

    def __init__(self):
        self.nodes: list[Node] = []
        self._cse: dict[tuple, int] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.input_order: list[int] = []
        self.state_order: list[int] = []

    # -- node creation -----------------------------------------------------------
    def add(self, op: str, inputs: Sequence[Tensor] = (), **attrs: Any) -> Tensor:
        ids = tuple(t.id for t in inputs)
        fattrs = Attrs(attrs)
        key = (op, ids, fattrs)
        if key in self._cse and op != Op.Input:
            return Tensor(self, self._cse[key])
        shape, dt = infer_node(op, [(self.nodes[i].shape, self.nodes[i].dtype) for i in ids], fattrs)
        self.nodes.append(Node(op, ids, fattrs, shape, dt))
        nid = len(self.nodes) - 1
        self._cse[key] = nid
        return Tensor(self, nid)

    def input(self, name: str, shape: Sequence[int], dtype: str, role: str = "input", value=None) -> Tensor:
        t = self.add("Input", (), name=name, shape=tuple(int(s) for s in shape), dtype=dtypes.check(dtype), role=role)
        if role == "input":
            self.input_order.append(t.id)
        elif role == "state":
            self.state_order.append(t.id)
        if value is not None:
            self.weights[name] = np.asarray(value)
        return t

    def weight(self, name: str, value: np.ndarray) -> Tensor:
        value = np.asarray(value)
        return self.input(name, value.shape, dtypes.from_numpy(value.dtype), role="weight", value=value)

    def constant(self, value, dtype: str, shape: Sequence[int] = ()) -> Tensor:
        """A scalar literal broadcast (as a stride-0 view) to `shape`."""
        dt = dtypes.check(dtype)
        if dt == "bool":
            value = bool(value)
        elif dtypes.is_int(dt):
            value = int(value)
        else:
            value = float(value)
        c = self.add("Constant", (), value=value, shape=(), dtype=dt)
        return c.expand(tuple(shape)) if tuple(shape) else c

    def tensor_constant(self, array) -> Tensor:
        arr = np.asarray(array)
        return self.add("Constant", (), value=TensorValue(arr), shape=tuple(arr.shape), dtype=dtypes.from_numpy(arr.dtype))

    def iota(self, n: int, dtype: str = "int64") -> Tensor:
        return self.add("Iota", (), n=int(n), dtype=dtype)

    def view(self, x: Tensor, shape, strides, offset: int = 0) -> Tensor:
        """A strided view of `x`; a view of a view is composed into one where that is strided."""
        shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
        strides = tuple(0 if n == 1 else s for n, s in zip(shape, strides))
        if shapes.is_identity_view(x.shape, shape, strides, offset):
            return x
        node = x.node
        if node.op == Op.View:
            src = self.nodes[node.inputs[0]]
            inner = (node.attrs["shape"], node.attrs["strides"], node.attrs["offset"])
            composed = strided.compose_views(src.shape, inner, (shape, strides, offset))
            if composed is not None:
                return self.view(Tensor(self, node.inputs[0]), *composed)
        return self.add("View", (x,), shape=shape, strides=strides, offset=int(offset))

    def build(self, outputs: Sequence[Tensor], aliases: Mapping[int, str] | None = None,
              sources: Mapping[str, str] | None = None) -> Graph:
        """The graph returning `outputs`; `aliases`: output index -> the state input it holds the new value of."""
        g = Graph(self.nodes, [t.id for t in outputs], self.input_order + self.state_order, self.weights,
                  aliases=aliases, sources=sources)
        return g.pruned()

    # -- helpers used by Tensor ----------------------------------------------------
    def lift(self, v, like: Tensor) -> Tensor:
        """`v` as a Tensor: a Tensor as is, a Python scalar as a constant of `like`'s dtype (or the one it needs)."""
        if isinstance(v, TensorBase):
            return v
        if isinstance(v, (bool, np.bool_)) and like.dtype != "bool" and not dtypes.is_float(like.dtype):
            return self.constant(v, like.dtype)
        dt = like.dtype
        if isinstance(v, float) and not dtypes.is_float(dt):
            dt = "float32"
        elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and dt == "bool":
            dt = "int64"  # as torch: bool_tensor * 2 is an int64 tensor, not a logical and
        return self.constant(v, dt)


__all__ = ["GraphBuilder", "Tensor", "cat", "in_float32", "promote", "stack"]
