"""Whole-graph analyses that several passes need, computed one way.

``weight_only``: a node is weight-only when everything it depends on is a
weight, a constant or an ``Iota``, i.e. when it does not depend on a model
input.  Such values are the same on every call, so weight folding computes
them once, and the layer splitter and the rewrite rules treat them as
parameters rather than as the activation stream.
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
