"""The one random-input policy: never-all-zero inputs for comparing a program with its reference.

All-zero inputs hide most wrong programs (a dropped term, a swapped operand
of a product), so every array drawn here has at least one non-zero element
(:func:`random_array`): floats standard normal, integers uniform in a range,
bools random.  What differs between callers is only where an integer's
range comes from:

* a graph (:func:`random_inputs`): an index into a gathered table is drawn
  so that every index it makes lies inside the table (:func:`index_ranges`:
  a start the graph adds positions to stays that many short of the end), a
  scatter's index also distinct along its axis within each line (a random
  permutation's prefix), other integers in ``[-8, 9)``;
  the search's candidate validation and the tests draw this way;
* an example input set (:func:`like`): each integer input within the
  example's own range ``[min, max]`` (distinct where the example's values
  are), so token ids, positions and masks stay valid; the check of a
  compiled signature against the model draws its fresh set this way
  (``egraft.compile``, the Dynamo backend);
* shapes and dtypes only (:func:`from_specs`): integers in ``[0, int_high)``,
  for ``egraft run`` / ``egraft bench`` where only the user knows the range.

Lives in ``egraft.measure``, below ``egraft.testing`` which re-exports it.
torch is imported only by the functions that make torch tensors.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import Op, dtypes, shapes
from ..ir.graph import Graph


def random_array(shape, dtype: str, rng: np.random.Generator, low=None, high=None) -> np.ndarray:
    """Random data that is never all zeros: normal floats, ints in a small range, random bools."""
    if dtype == "bool":
        a = rng.random(shape) < 0.5
        if a.size:
            a.flat[0] = True
        return a
    if dtypes.is_int(dtype):
        lo = -8 if low is None else low
        hi = 9 if high is None else high
        return rng.integers(lo, hi, size=shape).astype(dtypes.to_numpy(dtype))
    a = rng.standard_normal(shape)
    if low is not None or high is not None:
        lo = -1.0 if low is None else low
        hi = 1.0 if high is None else high
        a = rng.uniform(lo, hi, size=shape)
    return a.astype(dtypes.to_numpy(dtype))


def index_ranges(graph: Graph) -> dict[int, range]:
    """Input position -> the range to draw it from, for int inputs that reach a ``Gather`` or ``Scatter`` as its
    index: every index they make then lies inside the axis it indexes.

    Token ids are the common case: an embedding lookup rejects ids outside
    its table, so the small default int range (which includes negatives) is
    no input for it.  The index is followed through int-valued ops (views,
    casts, index arithmetic).  What an ``Add`` of a value that no input
    feeds (an ``Iota``, a constant) contributes is kept: a start position
    that the graph adds ``0 .. T-1`` to, to write T cache slots of n, is
    drawn from ``[0, n - T + 1)``.  The plus branch of a negative-index wrap
    (``x < 0 ? x + n : x``) is not followed: draws are not negative.  The
    range is the intersection over every index the input reaches; where it
    would be empty, ``[0, n)`` of the smallest axis (the program itself is
    then invalid for every input).
    """
    consumers = graph.consumers()
    out: dict[int, range] = {}
    for pos, nid in enumerate(graph.input_ids):
        if not dtypes.is_int(graph.nodes[nid].dtype):
            continue
        shift = {nid: (0, 0)}  # node -> (least, most) it adds to the input's value
        low, high, smallest = 0, None, None
        for i in range(nid, len(graph.nodes)):  # topological order: a node's inputs come before it
            if i not in shift:
                continue
            lo, hi = shift[i]
            for c in consumers[i]:
                node = graph.nodes[c]
                if node.op in (Op.Gather, Op.Scatter) and node.inputs[1] == i:
                    size = graph.nodes[node.inputs[0]].shape[node.attrs["axis"]]
                    low, high = max(low, -lo), size - hi if high is None else min(high, size - hi)
                    smallest = size if smallest is None else min(smallest, size)
                elif dtypes.is_int(node.dtype):
                    add = _added(graph, node, i)
                    if add is None:
                        continue
                    old = shift.get(c)
                    new = (lo + add[0], hi + add[1])
                    shift[c] = new if old is None else (min(old[0], new[0]), max(old[1], new[1]))
        if smallest:
            out[pos] = range(low, high) if low < high else range(smallest)
    return out


def _added(graph: Graph, node, via: int) -> tuple[int, int] | None:
    """What `node` adds to the value of its input `via` (least, most): (0, 0) for a view, a cast or other index
    arithmetic, the range of the other operand of an ``Add`` that no input feeds; None for the plus branch of a
    negative-index wrap (``x < 0 ? x + n : x``, taken only for negative x)."""
    if node.op == Op.Add:
        other = [j for j in node.inputs if j != via]
        r = _constant_range(graph, other[0]) if len(other) == 1 else None
        return r or (0, 0)
    if node.op == Op.Where and _wraps(graph, node) and via == node.inputs[1] != node.inputs[2]:
        return None
    return (0, 0)


def _constant_range(graph: Graph, nid: int) -> tuple[int, int] | None:
    """(least, most) of an int value no input feeds (a Constant, an Iota, their views, casts and sums); None
    where unknown."""
    node = graph.nodes[nid]
    if not dtypes.is_int(node.dtype):
        return None
    if node.op == Op.Constant:
        v = node.attrs["value"]
        a = np.asarray(v.array if hasattr(v, "array") else v)
        return (int(a.min()), int(a.max())) if a.size else None
    if node.op == Op.Iota:
        return (0, node.attrs["n"] - 1) if node.attrs["n"] > 0 else None
    if node.op in (Op.View, Op.Cast):
        return _constant_range(graph, node.inputs[0])
    if node.op == Op.Add:
        parts = [_constant_range(graph, j) for j in node.inputs]
        return None if None in parts else (parts[0][0] + parts[1][0], parts[0][1] + parts[1][1])
    return None


def _source_axis(graph: Graph, nid: int, axis: int) -> tuple[int, int | None] | None:
    """Follow a Scatter index back through Casts, Views and a negative-index wrap to an Input: (that input's node
    id, the input axis the Scatter's axis reads, or None when a View mixes it with others); None if other ops
    compute it."""
    while True:
        node = graph.nodes[nid]
        if node.op == Op.Input:
            return nid, axis
        if node.op == Op.Cast and dtypes.is_int(node.dtype):
            nid = node.inputs[0]
        elif node.op == Op.Where and _wraps(graph, node):
            nid = node.inputs[2]  # x < 0 ? x + n : x, a negative index wrapped: x itself for draws in [0, n)
        elif node.op == Op.View:
            src = graph.nodes[node.inputs[0]]
            if axis is not None:  # the source axis whose step is the view's step along `axis`
                cs = shapes.contiguous_strides(src.shape)
                st, k = node.attrs["strides"][axis], node.attrs["shape"][axis]
                hit = [d for d in range(len(src.shape)) if src.shape[d] >= k > 1 and cs[d] == abs(st)]
                axis = hit[0] if hit else None
            nid = node.inputs[0]
        else:
            return None


def _wraps(graph: Graph, node) -> bool:
    """`node` is ``Where(x < 0, x + c, x)``: how the lowering wraps a negative index (``index_copy_`` and kin)."""
    cond, plus, x = (graph.nodes[i] for i in node.inputs)
    return (cond.op == Op.LessThan and cond.inputs[0] == node.inputs[2] and plus.op == Op.Add
            and node.inputs[2] in plus.inputs)


def distinct_lines(graph: Graph) -> dict[int, int | None]:
    """Input position -> axis, for int inputs a ``Scatter`` reads as its index (through Casts and Views): its
    values along that axis must be distinct within each line.  The axis is None where a View mixes the
    input's axes: then every value of the input is drawn distinct."""
    pos = {nid: k for k, nid in enumerate(graph.input_ids)}
    out: dict[int, int | None] = {}
    for node in graph.nodes:
        if node.op == Op.Scatter:
            found = _source_axis(graph, node.inputs[1], node.attrs["axis"])
            if found is not None and found[0] in pos:
                out[pos[found[0]]] = found[1]
    return out


def distinct_index(shape, dtype: str, rng: np.random.Generator, n: int, axis: int | None) -> np.ndarray:
    """Int values in ``[0, n)``, distinct along `axis` within each line (each line a random permutation's
    prefix), or distinct over the whole array when `axis` is None; never all zero.  Where the line is
    longer than `n` no such draw exists and values are drawn in ``[0, n)`` (the program itself is invalid)."""
    shape = tuple(shape)
    flat = (math.prod(shape),) if axis is None else shape
    ax = 0 if axis is None else axis
    k = flat[ax] if flat else 1
    if not flat or k > n or k == 0:
        return random_array(shape, dtype, rng, 0, n)
    rest = flat[:ax] + flat[ax + 1:]
    lines = np.argsort(rng.random((math.prod(rest), n)), axis=1)[:, :k]  # one permutation prefix per line
    a = np.moveaxis(lines.reshape(rest + (k,)), -1, ax).reshape(shape)
    if a.size and not a.any() and n > 1:  # lines of one element, all drawn 0
        a.flat[0] = 1
    return a.astype(dtypes.to_numpy(dtype))


def random_inputs(graph: Graph, seed: int | None = None) -> list[np.ndarray]:
    """One random array per graph input, in order, drawn from `seed`; gather and scatter indices within
    their axis, scatter indices distinct along it (:func:`distinct_lines`)."""
    rng = np.random.default_rng(seed)
    bounds, lines = index_ranges(graph), distinct_lines(graph)
    return [distinct_index(s, d, rng, len(bounds[k]), lines[k]) + np.asarray(bounds[k].start, dtypes.to_numpy(d))
            if k in lines and k in bounds
            else random_array(s, d, rng, *((bounds[k].start, bounds[k].stop) if k in bounds else ()))
            for k, (s, d) in enumerate(graph.input_types())]


def _to_torch(a: np.ndarray, like=None):
    import torch  # noqa: F401 - these inputs are torch tensors: load torch before the bridge hands one out

    from ..ir.tensors import to_torch

    t = to_torch(a)
    if like is not None:
        t = t.to(device=like.device, dtype=like.dtype)
    return t


_DISTINCT_RANGE = 1 << 20  # a distinct example int input over at most this range is drawn distinct


def like(args, kwargs: dict | None = None, seed: int = 0) -> tuple[tuple, dict]:
    """A fresh random input set shaped like an example (args, kwargs): same shapes, dtypes and devices.

    Integer inputs are drawn within the example's own ``[min, max]``, and
    distinct where the example's values are (positions a ``Scatter`` writes
    a cache at must not repeat); python values are kept as they are.
    """
    rng = np.random.default_rng([int(seed), 0x65677261])

    def draw(t):
        if not hasattr(t, "detach"):
            return t
        dt = dtypes.from_torch(t.dtype)
        low = high = None
        if dtypes.is_int(dt) and t.numel():
            low, high = int(t.min()), int(t.max()) + 1
            n = t.numel()
            if 1 < n <= high - low <= _DISTINCT_RANGE and len(set(t.reshape(-1).tolist())) == n:
                # distinct in the example (positions a cache is written at): distinct here too
                vals = rng.choice(high - low, size=n, replace=False) + low
                return _to_torch(vals.reshape(tuple(t.shape)).astype(dtypes.to_numpy(dt)), t)
        return _to_torch(random_array(tuple(t.shape), "float32" if dt == "bfloat16" else dt, rng, low, high), t)

    return tuple(draw(a) for a in args), {k: draw(v) for k, v in (kwargs or {}).items()}


def from_specs(specs, seed: int = 0, int_high: int = 100) -> tuple:
    """One random torch tensor per (shape, dtype): normal floats, integers in ``[0, int_high)``, random bools."""
    rng = np.random.default_rng(seed)
    return tuple(_to_torch(random_array(tuple(shape), dtypes.check(dt), rng,
                                        **({"low": 0, "high": int_high} if dtypes.is_int(dt) else {})))
                 for shape, dt in specs)
