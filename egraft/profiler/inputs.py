"""Random, never-all-zero inputs for comparing a program with the reference.

All-zero inputs hide most wrong programs (a dropped term, a swapped operand
of a product), so every array drawn here has at least one non-zero element.
Lives in the profiler, below ``egraft.testing`` which re-exports it, because
candidate validation draws its inputs the same way the tests do.
"""

from __future__ import annotations

import numpy as np

from ..ir import dtypes
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


def random_inputs(graph: Graph, seed: int | None = None) -> list[np.ndarray]:
    """One random array per graph input, in order, drawn from `seed`."""
    rng = np.random.default_rng(seed)
    return [random_array(s, d, rng) for s, d in graph.input_types()]
