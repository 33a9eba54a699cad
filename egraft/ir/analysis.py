"""Whole-graph analyses that several passes need, computed one way.

``weight_only``: a node is weight-only when everything it depends on is a
weight, a constant or an ``Iota``, i.e. when it does not depend on a model
input.  Such values are the same on every call, so weight folding computes
them once, and the layer splitter and the rewrite rules treat them as
parameters rather than as the activation stream.

``weight_operand``: a node that is a 2-D weight as stored or its plain
transpose (``nn.Linear``'s ``W.T``), and which: the products that read a
weight in another layout and the fold's widened weights recognise it so.
"""

from __future__ import annotations

from .graph import Graph
from .op_groups import Op


def weight_only(graph: Graph) -> list[bool]:
    """Per node: does it depend on no model input (only on weights, constants and iotas)?

    Its negation is "depends on a model input" (a model input counts as
    depending on itself).
    """
    mask: list[bool] = []
    for n in graph.nodes:
        if n.op == Op.Input:
            mask.append(n.attrs["role"] == "weight")
        elif not n.inputs:  # Constant, Iota: the same value on every call
            mask.append(True)
        else:
            mask.append(all(mask[j] for j in n.inputs))
    return mask


def weight_operand(graph: Graph, nid: int) -> tuple[str, bool] | None:
    """(weight name, transposed) when node `nid` is a 2-D weight as stored or the plain transpose of one."""
    n = graph.nodes[nid]
    if n.op == Op.Input:
        return (n.attrs["name"], False) if n.attrs["role"] == "weight" and len(n.shape) == 2 else None
    if n.op != Op.View or len(n.shape) != 2:
        return None
    src = graph.nodes[n.inputs[0]]
    k, m = n.shape
    if (src.op == Op.Input and src.attrs["role"] == "weight" and tuple(src.shape) == (m, k)
            and tuple(n.attrs["strides"]) == (1, k) and n.attrs["offset"] == 0):
        return src.attrs["name"], True
    return None
