"""Helpers shared by the IR tests: one-op graphs, random data per dtype, elementwise comparison."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from egraft.ir import GraphBuilder, dtypes, evaluate
from egraft.testing import random_array

FLOATS = ("float32", "float16", "bfloat16", "float64")
INTS = ("int32", "int64")
ALL_DTYPES = FLOATS + INTS + ("bool",)

# elementwise relative tolerance when comparing an op (computed in float32 for
# half types and rounded once) with an exact float64 reference rounded to the
# dtype: a couple of units in the last place.
RTOL = {"float64": 1e-13, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def one_op(op: str, types: Sequence[tuple[tuple[int, ...], str]], **attrs):
    """A graph with one input per entry of `types` and a single `op` node as its output."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", s, d) for i, (s, d) in enumerate(types)]
    return b.build([b.add(op, xs, **attrs)])


def run1(g, inputs, **kw):
    (out,) = evaluate(g, inputs, **kw)
    return out


def rand(shape, dtype, rng, low=None, high=None):
    return random_array(shape, dtype, rng.gen, low, high)


def positive(shape, dtype, rng):
    return random_array(shape, dtype, rng.gen, 0.1, 4.0)


def assert_elementwise(got, want, dtype: str, tag: str, what: str = "", scale=None):
    """Exact for ints/bools; for floats nan/inf where the reference has them, else relative error <= RTOL.

    The error is relative to ``|want|``, or to ``scale`` where given: a sum's rounding error is bounded
    relative to the sum of its terms' magnitudes, not to a result that cancelled to near zero.
    """
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}; {tag}"
    assert dtypes.from_numpy(got.dtype) == dtype, f"{what}: dtype {got.dtype} != {dtype}; {tag}"
    if not dtypes.is_float(dtype):
        assert np.array_equal(got, want), f"{what}: {got} != {want}; {tag}"
        return
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    nan_w, nan_g = np.isnan(w), np.isnan(g)
    assert np.array_equal(nan_w, nan_g), f"{what}: nan at {np.argwhere(nan_g != nan_w)[:4].tolist()}; {tag}"
    inf_w = np.isinf(w)
    assert np.array_equal(g[inf_w], w[inf_w]) and not np.isinf(g[~inf_w]).any(), f"{what}: inf mismatch; {tag}"
    fin = np.isfinite(w)
    tiny = float(np.finfo(dtypes.to_numpy(dtype)).smallest_normal) if dtype != "bfloat16" else 1.2e-38
    err = np.abs(g[fin] - w[fin])
    ref = np.abs(w) if scale is None else np.broadcast_to(np.asarray(scale, np.float64), w.shape)
    bound = RTOL[dtype] * ref[fin] + tiny
    bad = err > bound
    assert not bad.any(), (
        f"{what} ({dtype}): got {g[fin][bad][:4]} want {w[fin][bad][:4]}; {tag}"
    )


def round_to(x_exact, dtype: str) -> np.ndarray:
    """An exact (float64 / python) result rounded to `dtype`."""
    return np.asarray(x_exact, dtype=np.float64).astype(dtypes.to_numpy(dtype))
