"""The one random-input policy: never-all-zero inputs for comparing a program with its reference.

All-zero inputs hide most wrong programs (a dropped term, a swapped operand
of a product), so every array drawn here has at least one non-zero element
(:func:`random_array`): floats standard normal, integers uniform in a range,
bools random.  What differs between callers is only where an integer's
range comes from:

* a graph (:func:`random_inputs`): an index into a gathered table is drawn
  inside the table, other integers in ``[-8, 9)``; the search's candidate
  validation and the tests draw this way;
* an example input set (:func:`like`): each integer input within the
  example's own range ``[min, max]``, so token ids, positions and masks stay
  valid; the check of a compiled signature against the model draws its
  fresh set this way (``egraft.compile``, the Dynamo backend);
* shapes and dtypes only (:func:`from_specs`): integers in ``[0, int_high)``,
  for ``egraft run`` / ``egraft bench`` where only the user knows the range.

Lives in ``egraft.measure``, below ``egraft.testing`` which re-exports it.
torch is imported only by the functions that make torch tensors.
"""

from __future__ import annotations

import numpy as np

from ..ir import Op, dtypes
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
    """Input position -> n, for int inputs that reach a ``Gather`` as its index: draw those from ``[0, n)``.

    Token ids are the common case: an embedding lookup rejects ids outside
    its table, so the small default int range (which includes negatives) is
    no input for it.  The index is followed through int-valued ops (views,
    casts, index arithmetic); `n` is the smallest gathered axis it reaches.
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
                if node.op in (Op.Gather, Op.Scatter) and len(node.inputs) > 1 and node.inputs[1] == i:
                    size = graph.nodes[node.inputs[0]].shape[node.attrs["axis"]]
                    n = size if n is None else min(n, size)
                elif dtypes.is_int(node.dtype) and c not in seen:
                    seen.add(c)
                    todo.append(c)
        if n:
            out[pos] = n
    return out


def random_inputs(graph: Graph, seed: int | None = None) -> list[np.ndarray]:
    """One random array per graph input, in order, drawn from `seed`; gather indices within their table.

    State inputs get random contents like any input (never zeros); an int input that reaches a Scatter's
    index (a cache position list) is drawn as distinct positions, since a Scatter's writes must not collide.
    """
    rng = np.random.default_rng(seed)
    bounds = index_ranges(graph)
    scattered = _scatter_positions(graph)
    out = []
    for k, (s, d) in enumerate(graph.input_types()):
        size = int(np.prod(s))
        if k in scattered and k in bounds and size <= bounds[k]:
            out.append(rng.permutation(bounds[k])[:size].reshape(s).astype(dtypes.to_numpy(d)))
        else:
            out.append(random_array(s, d, rng, *((0, bounds[k]) if k in bounds else ())))
    return out


def _scatter_positions(graph: Graph) -> set[int]:
    """Input positions whose values reach a Scatter's index operand."""
    reach: set[int] = set()
    for n in graph.nodes:
        if n.op == Op.Scatter:
            todo = [n.inputs[1]]
            while todo:
                i = todo.pop()
                if i not in reach:
                    reach.add(i)
                    todo.extend(graph.nodes[i].inputs)
    return {k for k, nid in enumerate(graph.input_ids) if nid in reach}


def _to_torch(a: np.ndarray, like=None):
    import torch  # noqa: F401 - these inputs are torch tensors: load torch before the bridge hands one out

    from ..ir.tensors import to_torch

    t = to_torch(a)
    if like is not None:
        t = t.to(device=like.device, dtype=like.dtype)
    return t


def like(args, kwargs: dict | None = None, seed: int = 0) -> tuple[tuple, dict]:
    """A fresh random input set shaped like an example (args, kwargs): same shapes, dtypes and devices.

    Integer inputs are drawn within the example's own ``[min, max]``; python
    values are kept as they are.
    """
    rng = np.random.default_rng([int(seed), 0x65677261])

    def draw(t):
        if not hasattr(t, "detach"):
            return t
        dt = dtypes.from_torch(t.dtype)
        low = high = None
        if dtypes.is_int(dt) and t.numel():
            low, high = int(t.min()), int(t.max()) + 1
        return _to_torch(random_array(tuple(t.shape), "float32" if dt == "bfloat16" else dt, rng, low, high), t)

    return tuple(draw(a) for a in args), {k: draw(v) for k, v in (kwargs or {}).items()}


def from_specs(specs, seed: int = 0, int_high: int = 100) -> tuple:
    """One random torch tensor per (shape, dtype): normal floats, integers in ``[0, int_high)``, random bools."""
    rng = np.random.default_rng(seed)
    return tuple(_to_torch(random_array(tuple(shape), dtypes.check(dt), rng,
                                        **({"low": 0, "high": int_high} if dtypes.is_int(dt) else {})))
                 for shape, dt in specs)
