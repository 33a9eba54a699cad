"""Which idiom nodes the Triton backend runs as primitives: those no one-kernel template fits.

A row idiom whose row is wider than one tile, or an attention whose head
dimension is too large for one ``tl.dot`` tile, is rewritten into its
primitive form by the IR's shared :func:`egraft.ir.decompose.decompose`;
the partitioner then runs it as several kernels (reductions materialised).
This module only decides which nodes; semantics are unchanged by
construction, since the primitive forms are the idioms' definitions.
"""

from __future__ import annotations

from typing import Callable

from ...ir import Op
from ...ir.decompose import decompose
from ...ir.graph import Graph
from ...ir.op_groups import Group
from .partition import MAX_ROW, pow2

MAX_HEAD_DIM = 256


def too_wide(graph: Graph, nid: int) -> bool:
    n = graph.nodes[nid]
    if n.op in Group.ROW_IDIOM:
        return pow2(n.shape[n.attrs["axis"]]) > MAX_ROW
    if n.op == Op.Attention:
        q, v = graph.nodes[n.inputs[0]], graph.nodes[n.inputs[2]]
        return max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM
    return False


def expand_idioms(graph: Graph, which: Callable[[Graph, int], bool] = too_wide) -> Graph:
    """`graph` with every idiom node for which `which(graph, id)` holds written in primitives."""
    return decompose(graph, which)
