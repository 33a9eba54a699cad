"""One exported program with symbolic sizes, read at one set of concrete input shapes.

``torch.export`` with ``dynamic_shapes`` gives one graph for a range of
sizes: the nodes' ``meta['val']`` hold shapes such as ``[4, s70, 8, 64]``,
and the sizes the model computes from them (``aten.sym_size``, python
``operator.sub``, ...) are nodes of the graph.  egraft's IR has concrete
shapes, so the tracer lowers such a program once per size it compiles: a
:class:`SizeBinding` binds each size symbol from the shapes of the call's
tensors (the placeholder dims that are a bare symbol), checks the export's
``range_constraints`` (the sizes torch.export proved the graph valid for),
and gives every node's value as it is at those sizes: a meta tensor of
concrete shape and strides for a tensor, an int or bool for a size.
torch.export raises (``Constraints violated``) when the model's own checks
on a size do not hold over the whole declared range, so every size the
binding accepts is one the graph was proven for.

Exporting once and lowering per size saves a ``torch.export`` and a core-ATen
decomposition (about 2 s each on a 4-layer model) for every size after the
first.  A symbol no input binds, or a size outside the range, raises
:class:`~egraft.errors.InputError`; the caller then exports at that size.
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from ..errors import InputError

_SYM = (torch.SymInt, torch.SymBool, torch.SymFloat)


def user_placeholders(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The placeholders of the caller's tensor inputs, in the program's order."""
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    return [n for n, s in zip(placeholders, ep.graph_signature.input_specs)
            if s.kind.name == "USER_INPUT" and isinstance(n.meta.get("val"), torch.Tensor)]


def is_symbolic(ep: torch.export.ExportedProgram) -> bool:
    """Whether any of `ep`'s tensor inputs has a symbolic size (it was exported with ``dynamic_shapes``)."""
    return any(isinstance(d, torch.SymInt) for n in user_placeholders(ep) for d in n.meta["val"].shape)


class SizeBinding:
    """`ep`'s size symbols bound from `shapes` (one per tensor input, in :func:`user_placeholders` order)."""

    def __init__(self, ep: torch.export.ExportedProgram, shapes: Sequence[Sequence[int]]):
        inputs = user_placeholders(ep)
        if len(shapes) != len(inputs):
            raise InputError(f"{len(shapes)} input shape(s) for a program of {len(inputs)} tensor input(s)")
        self.values: dict[sympy.Symbol, sympy.Integer] = {}
        for node, shape in zip(inputs, shapes):
            want = node.meta["val"].shape
            if len(want) != len(shape):
                raise InputError(f"input {node.name!r} has {len(shape)} dims; the exported program's has {len(want)}")
            for d, (w, s) in enumerate(zip(want, shape)):
                expr = w.node.expr if isinstance(w, torch.SymInt) else sympy.Integer(int(w))
                if isinstance(expr, sympy.Symbol):
                    if self.values.setdefault(expr, sympy.Integer(int(s))) != int(s):
                        raise InputError(f"input {node.name!r} dim {d} is {s}, but {expr} is already "
                                         f"{self.values[expr]} from another input")
        for node, shape in zip(inputs, shapes):  # fixed and derived dims must come out as the call's
            got = tuple(self.size(w) for w in node.meta["val"].shape)
            if got != tuple(int(s) for s in shape):
                raise InputError(f"input {node.name!r} is {tuple(shape)}; the exported program takes {got} there")
        for sym, vr in ep.range_constraints.items():
            if sym in self.values and not vr.lower <= int(self.values[sym]) <= vr.upper:
                raise InputError(f"size {sym} = {self.values[sym]} is outside the range [{vr.lower}, {vr.upper}] "
                                 "the program was exported for; export it at this size")
        self._metas: dict[torch.fx.Node, Any] = {}

    def size(self, v):
        """A size (SymInt/SymBool/SymFloat or a plain number) at the bound values."""
        if not isinstance(v, _SYM):
            return v
        expr = v.node.expr
        free = expr.free_symbols - set(self.values)
        if free:
            raise InputError(f"the size {expr} depends on {sorted(map(str, free))}, which no input binds")
        out = expr.xreplace(self.values)
        if isinstance(v, torch.SymBool):
            return bool(out)
        return int(out) if isinstance(v, torch.SymInt) else float(out)

    def value(self, v):
        """A node's ``meta['val']`` at the bound sizes: tensors as meta tensors of concrete shape and strides."""
        if isinstance(v, torch.Tensor):
            shape = [self.size(s) for s in v.shape]
            stride = [self.size(s) for s in v.stride()]
            return torch.empty_strided(shape, stride, dtype=v.dtype, device="meta")
        if isinstance(v, (list, tuple)):
            return type(v)(self.value(x) for x in v)
        return self.size(v)

    def meta(self, node: torch.fx.Node):
        """:meth:`value` of `node`'s ``meta['val']``, computed once."""
        if node not in self._metas:
            self._metas[node] = self.value(node.meta.get("val"))
        return self._metas[node]


def is_size(v) -> bool:
    """Whether a node's value is a size (a SymInt, SymBool or SymFloat) rather than a tensor."""
    return isinstance(v, _SYM)


__all__ = ["SizeBinding", "is_size", "is_symbolic", "user_placeholders"]
