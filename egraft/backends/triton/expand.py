"""Replace idiom nodes by their primitive forms where no one-kernel template fits.

A row idiom whose row is wider than one tile, or an attention whose head
dimension is too large for one ``tl.dot`` tile, is rewritten into the
primitives of ``egraft.ir.idioms.DECOMPOSITIONS``; the partitioner then runs
it as several kernels (reductions materialised).  Semantics are unchanged by
construction: the decompositions are the idioms' definitions, tested
against the idioms' own numpy semantics in tests/ir.
"""

from __future__ import annotations

from typing import Callable

from ...ir.builder import GraphBuilder, Tensor
from ...ir.graph import Graph
from ...ir.idioms import DECOMPOSITIONS
from .partition import MAX_ROW, ROW_IDIOMS, pow2

MAX_HEAD_DIM = 256


def too_wide(graph: Graph, nid: int) -> bool:
    n = graph.nodes[nid]
    if n.op in ROW_IDIOMS:
        return pow2(n.shape[n.attrs["axis"]]) > MAX_ROW
    if n.op == "Attention":
        q, v = graph.nodes[n.inputs[0]], graph.nodes[n.inputs[2]]
        return max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM
    return False


def expand_idioms(graph: Graph, which: Callable[[Graph, int], bool] = too_wide) -> Graph:
    """`graph` with every idiom node for which `which(graph, id)` holds written in primitives."""
    targets = [i for i, n in enumerate(graph.nodes) if n.op in DECOMPOSITIONS and which(graph, i)]
    if not targets:
        return graph
    b = GraphBuilder()
    m: dict[int, Tensor] = {}
    for i, n in enumerate(graph.nodes):
        ins = [m[j] for j in n.inputs]
        if i in targets:
            a = n.attrs
            if n.op == "MatMul":
                t = DECOMPOSITIONS["MatMul"](*ins)
            elif n.op == "Attention":
                t = DECOMPOSITIONS["Attention"](*ins[:3], ins[3] if len(ins) == 4 else None, a["scale"], a["causal"])
            elif n.op == "Softmax":
                t = DECOMPOSITIONS["Softmax"](ins[0], a["axis"])
            else:
                t = DECOMPOSITIONS[n.op](ins[0], a["axis"], a["eps"])
            m[i] = t.cast(n.dtype)
        elif n.op == "Input":
            m[i] = b.add("Input", (), **n.attrs.as_dict())
        else:
            m[i] = b.add(n.op, ins, **n.attrs.as_dict())
    g = Graph(b.nodes, [m[o].id for o in graph.outputs], [m[i].id for i in graph.input_ids], graph.weights)
    return g.pruned()
