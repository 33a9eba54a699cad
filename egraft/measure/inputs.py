"""The one random-input policy: never-all-zero inputs for comparing a program with its reference.

All-zero inputs hide most wrong programs (a dropped term, a swapped operand
of a product), so every array drawn here has at least one non-zero element
(:func:`random_array`): floats standard normal, integers uniform in a range,
bools random.  What differs between callers is only where an integer's
range comes from:

* a graph (:func:`random_inputs`): an index into a gathered table is drawn
  inside the table, a scatter's index also distinct along its axis within
  each line (a random permutation's prefix), other integers in ``[-8, 9)``;
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


def index_ranges(graph: Graph) -> dict[int, int]:
    """Input position -> n, for int inputs that reach a ``Gather`` or ``Scatter`` as its index: draw those
    from ``[0, n)``.

    Token ids are the common case: an embedding lookup rejects ids outside
    its table, so the small default int range (which includes negatives) is
    no input for it.  The index is followed through int-valued ops (views,
    casts, index arithmetic); `n` is the smallest indexed axis it reaches.
    """
    consumers = graph.consumers()
    out: dict[int, int] = {}
    for pos, nid in enumerate(graph.input_ids):
        if not dtypes.is_int(graph.nodes[nid].dtype):
            continue
        seen, todo, n = {nid}, [nid], None
        while todo:
            i = todo.pop()
            for c in consumers[i]:
                node = graph.nodes[c]
                if node.op in (Op.Gather, Op.Scatter) and node.inputs[1] == i:
                    size = graph.nodes[node.inputs[0]].shape[node.attrs["axis"]]
                    n = size if n is None else min(n, size)
                elif dtypes.is_int(node.dtype) and c not in seen:
                    seen.add(c)
                    todo.append(c)
        if n:
            out[pos] = n
    return out


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
    return [distinct_index(s, d, rng, bounds[k], lines[k]) if k in lines and k in bounds
            else random_array(s, d, rng, *((0, bounds[k]) if k in bounds else ()))
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
