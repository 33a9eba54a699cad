"""Rewrite idiom nodes of a graph into their primitive form: the one expansion every backend uses.

A backend that has no kernel for an idiom (the JAX backend under the knob
``idioms="primitive"``, the Triton backend for rows too long for one
kernel) runs it as its primitive form instead.  Which idioms to expand is
the backend's choice; how they expand is decided here, once, from
:data:`~egraft.ir.idiom_forms.DECOMPOSITIONS` (the forms tests/ir checks
against each idiom's numpy semantics), so semantics are unchanged by
construction.
"""

from __future__ import annotations

from typing import Callable, Collection, Union

from .builder import GraphBuilder, Tensor
from .graph import Graph
from .idiom_forms import (
    DECOMPOSITIONS,
    attention_decomposed,
    layernorm_decomposed,
    matmul_decomposed,
    rmsnorm_decomposed,
    softmax_decomposed,
)

# which idiom nodes to expand: None (all), a collection of idiom names, or a test (graph, node id) -> bool
Which = Union[None, Collection[str], Callable[[Graph, int], bool]]


def _selected(graph: Graph, which: Which) -> set[int]:
    if which is None:
        test = lambda g, i: True  # noqa: E731
    elif callable(which):
        test = which
    else:
        names = frozenset(which)
        test = lambda g, i: g.nodes[i].op in names  # noqa: E731
    return {i for i, n in enumerate(graph.nodes) if n.op in DECOMPOSITIONS and test(graph, i)}


def expand_node(op: str, inputs: list[Tensor], attrs: dict) -> Tensor:
    """The primitive form of idiom `op` over `inputs` (positional) with the node's `attrs` (by keyword)."""
    return DECOMPOSITIONS[op](*inputs, **attrs)


def decompose(graph: Graph, which: Which = None) -> Graph:
    """`graph` with the chosen idiom nodes written in primitives; the same graph object if none is chosen.

    Other nodes are copied as they are (identical ones shared); each
    expansion's result is cast back to the idiom node's dtype.  Inputs keep
    their order and weights their values, so the result is called exactly
    as `graph` is.
    """
    targets = _selected(graph, which)
    if not targets:
        return graph
    b = GraphBuilder()
    m: dict[int, Tensor] = {}
    for i, n in enumerate(graph.nodes):
        ins = [m[j] for j in n.inputs]
        if i in targets:
            m[i] = expand_node(n.op, ins, n.attrs.as_dict()).cast(n.dtype)
        else:
            m[i] = b.add(n.op, ins, **n.attrs.as_dict())
    g = graph.rebuilt(b.nodes, [m[o].id for o in graph.outputs], [m[i].id for i in graph.input_ids])
    return g.pruned()


__all__ = [
    "DECOMPOSITIONS", "attention_decomposed", "decompose", "expand_node", "layernorm_decomposed",
    "matmul_decomposed", "rmsnorm_decomposed", "softmax_decomposed",
]
