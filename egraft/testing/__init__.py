"""Helpers for checking programs against the reference: random inputs and tolerances.

Used by the test suite, the benchmarks and the search's candidate validation,
so "matches the reference" means one thing everywhere.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..ir import dtypes
from ..ir.graph import Graph

# max |a - b| / max |b| allowed, by dtype of the output
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def rel_err(got, want, floor: float = 0.0) -> float:
    """Norm-relative error: max |got - want| / max(max |want|, floor) (inf/nan-aware).

    `floor` > 0 makes the check absolute for outputs smaller than it: an
    output that is mathematically zero (the sum of a layer norm's row) is
    rounding noise, and its noise relative to itself says nothing.
    """
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    same_nonfinite = (~np.isfinite(want)) & ((got == want) | (np.isnan(got) & np.isnan(want)))
    if np.any(~np.isfinite(want) & ~same_nonfinite) or np.any(~np.isfinite(got) & np.isfinite(want)):
        return float("inf")
    finite = np.isfinite(want)
    if not finite.any():
        return 0.0
    diff = np.abs(got[finite] - want[finite]).max(initial=0.0)
    scale = max(np.abs(want[finite]).max(initial=0.0), floor)
    return float(diff / scale) if scale > 0 else float(diff)


def tolerance(dtype: str) -> float:
    return TOLERANCE.get(dtype, 0.0)


def assert_close(got: Sequence, want: Sequence, dtypes_: Sequence[str] | None = None, tol: float | None = None, what="output"):
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        dt = dtypes_[k] if dtypes_ else dtypes.from_numpy(np.asarray(w).dtype)
        t = tol if tol is not None else tolerance(dt)
        if not dtypes.is_float(dt):
            assert np.array_equal(np.asarray(g), np.asarray(w)), f"{what} {k} ({dt}) differs exactly"
            continue
        e = rel_err(g, w)
        assert e <= t, f"{what} {k} ({dt}): relative error {e:.3g} > {t:.3g}"


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
    rng = np.random.default_rng(seed)
    return [random_array(s, d, rng) for s, d in graph.input_types()]


def fresh_seed() -> int:
    """A new seed per run, printed by failing tests; ``EGRAFT_SEED=<n>`` replays that run.

    Every randomised test takes its seed from here, so one variable replays
    any of them.
    """
    replay = os.environ.get("EGRAFT_SEED")
    if replay:
        return int(replay)
    return int(np.random.SeedSequence().entropy % (2**31))
