"""Constant pads a window reduction can absorb (backend-neutral: it reads an ``ir.Graph`` only).

The torch lowering writes a constant pad as ``Where(mask, Gather(x, idx,
axis), fill)`` whose mask and index are known at build (folded weights or
constants).  When they equal those of a constant pad (mask ``[F]*lo +
[T]*n + [F]*hi``, index ``arange(n)`` where the mask holds) and the fill is
the reduction's identity (0 for a sum / convolution, the lowest value for a
max), the pad is peeled into the windowed op's padding, which is exactly
how XLA (and cuDNN) pad.
"""

from __future__ import annotations

import numpy as np

from ..ir import Op, dtypes
from ..ir.graph import Graph
from ..ir.ops import TensorValue
from ..ir.strided import gather_index
from .fold import FOLDED_PREFIX


def _known(graph: Graph, nid: int):
    """Values known at build: a folded weight or a constant."""
    n = graph.nodes[nid]
    if n.op == Op.Input and n.attrs["name"].startswith(FOLDED_PREFIX) and n.attrs["name"] in graph.weights:
        return np.asarray(graph.weights[n.attrs["name"]])
    if n.op == Op.Constant:
        v = n.attrs["value"]
        return np.broadcast_to(v.array if isinstance(v, TensorValue) else np.asarray(v), n.shape)
    return None


def _along(graph: Graph, nid: int, axis: int):
    """A known-valued node broadcast along every axis but `axis`: its 1-D values along `axis`."""
    n = graph.nodes[nid]
    if n.op == Op.View:
        shape, st, off = n.attrs["shape"], n.attrs["strides"], n.attrs["offset"]
        if any(s != 0 and sz > 1 for d, (sz, s) in enumerate(zip(shape, st)) if d != axis):
            return None
        vals = _known(graph, n.inputs[0])
        if vals is None:
            return None
        return vals.reshape(-1)[gather_index((shape[axis],), (st[axis],), off)]
    vals = _known(graph, nid)
    if vals is None:
        return None
    sl = tuple(slice(None) if d == axis else 0 for d in range(vals.ndim))
    line = vals[sl]
    return line if np.all(np.moveaxis(vals, axis, -1) == line) else None


def _fill(graph: Graph, nid: int):
    """The scalar a node holds everywhere, if known, else None."""
    n = graph.nodes[nid]
    if n.op == Op.View and all(s == 0 for s in n.attrs["strides"]):
        vals = _known(graph, n.inputs[0])
    else:
        vals = _known(graph, nid)
    if vals is None or vals.size == 0:
        return None
    flat = np.asarray(vals).reshape(-1)
    return flat[0] if np.all(flat == flat[0]) else None


def _is_identity(v, kind: str, dt: str) -> bool:
    if kind == "sum":
        return v == 0 and not np.signbit(v)
    if dtypes.is_float(dt):
        return bool(np.isneginf(v))
    return int(v) == int(np.iinfo(dtypes.to_numpy(dt)).min)


def peel_pads(graph: Graph, nid: int, kind: str):
    """Strip constant pads whose fill is the reduction's identity: (unpadded node, {axis: [lo, hi]})."""
    pads: dict[int, list[int]] = {}
    while True:
        n = graph.nodes[nid]
        if n.op != Op.Where:
            break
        cond, g, fill = n.inputs
        gn = graph.nodes[g]
        if gn.op != Op.Gather or tuple(gn.shape) != tuple(n.shape):
            break
        v = _fill(graph, fill)
        if v is None or not _is_identity(v, kind, n.dtype):
            break
        ax = gn.attrs["axis"]
        mask, idx = _along(graph, cond, ax), _along(graph, gn.inputs[1], ax)
        if mask is None or idx is None or mask.dtype != np.bool_:
            break
        src = gn.inputs[0]
        sshape = graph.nodes[src].shape
        if any(a != b for d, (a, b) in enumerate(zip(sshape, n.shape)) if d != ax):
            break
        total, length = n.shape[ax], sshape[ax]
        lo = int(np.argmax(mask)) if mask.any() else total
        hi = total - lo - length
        if hi < 0 or not mask[lo:lo + length].all() or mask[:lo].any() or mask[lo + length:].any():
            break
        if not np.array_equal(idx[lo:lo + length], np.arange(length)):
            break
        p = pads.setdefault(ax, [0, 0])
        p[0] += lo
        p[1] += hi
        nid = src
    return nid, pads
