"""Random, never-all-zero inputs for comparing a program with the reference.

All-zero inputs hide most wrong programs (a dropped term, a swapped operand
of a product), so every array drawn here has at least one non-zero element.
Lives in the profiler, below ``egraft.testing`` which re-exports it, because
candidate validation draws its inputs the same way the tests do.
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
                if node.op == Op.Gather and len(node.inputs) > 1 and node.inputs[1] == i:
                    size = graph.nodes[node.inputs[0]].shape[node.attrs["axis"]]
                    n = size if n is None else min(n, size)
                elif dtypes.is_int(node.dtype) and c not in seen:
                    seen.add(c)
                    todo.append(c)
        if n:
            out[pos] = n
    return out


def random_inputs(graph: Graph, seed: int | None = None) -> list[np.ndarray]:
    """One random array per graph input, in order, drawn from `seed`; gather indices within their table."""
    rng = np.random.default_rng(seed)
    bounds = index_ranges(graph)
    return [random_array(s, d, rng, *((0, bounds[k]) if k in bounds else ()))
            for k, (s, d) in enumerate(graph.input_types())]
