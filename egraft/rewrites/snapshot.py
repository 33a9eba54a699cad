"""The e-graph as plain Python: a :class:`Snapshot` of one moment of an egglog e-graph.

Read through egglog's frozen e-graph (one table per constructor: input
values, output e-class value), which is fast (~0.1 s for 40k e-nodes) and,
unlike the JSON serialisation, gives children as e-class values.  Class
values are renumbered to dense ints ``0..n_classes-1``; they index one
snapshot only (egglog's value ids change between runs).

Procedural rules read a Snapshot; ``egraft.search.Space`` is built from one.
Handle nodes ``(H i)`` are not e-nodes of the program: they are read into
``class_of_handle`` and dropped.
"""

from __future__ import annotations

from typing import Any

from ..ir.egraph import ENode, Snapshot
from .codec import Context, Decoder
from .schema import HANDLE, I64, SIGS, STR, VEC


def snapshot(egraph, ctx: Context) -> Snapshot:
    """Read the whole e-graph (after its analysis has run) into a Snapshot."""
    frozen = egraph.freeze()
    dec = Decoder(egraph, ctx)
    ids: dict[Any, int] = {}
    values: list[Any] = []

    def cid(v) -> int:
        i = ids.get(v)
        if i is None:
            i = ids[v] = len(values)
            values.append(v)
        return i

    nodes: list[ENode] = []
    for ctor in SIGS:
        fn = frozen.functions.get(ctor)
        if fn is None:
            continue
        for row in fn.rows:
            if row.subsumed:
                continue
            op, attrs, kids = dec.row(ctor, row.inputs)
            nodes.append(ENode(op, attrs, tuple(cid(k) for k in kids), cid(row.output)))
    class_of_handle = {}
    hf = frozen.functions.get(HANDLE)
    for row in (hf.rows if hf else []):
        class_of_handle[dec.prim(I64, row.inputs[0])] = cid(row.output)
    n = len(values)
    classes: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        classes[node.cls].append(i)
    shape: list = [None] * n
    dtype: list = [None] * n
    for fname, store, kind in (("shape", shape, VEC), ("dtype", dtype, STR)):
        fn = frozen.functions.get(fname)
        for row in (fn.rows if fn else []):
            c = ids.get(row.inputs[0])
            if c is not None:
                store[c] = dec.prim(kind, row.output)
    return Snapshot(nodes, classes, shape, dtype, class_of_handle, ctx, values)
