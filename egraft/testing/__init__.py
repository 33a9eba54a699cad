"""Helpers for checking programs against the reference: random inputs and tolerances.

The comparison core (tolerances, :func:`rel_err`, random inputs) lives in
``egraft.profiler.tolerances`` / ``egraft.profiler.inputs`` so the
profiler's validation can use it without importing this higher layer; it
is re-exported here unchanged.  The rule is restated below for readers of
the tests.

Used by the test suite, the benchmarks and the search's candidate validation,
so "matches the reference" means one thing everywhere.

Tolerances.  A backend output is compared with ``ir.evaluate`` by the
norm-relative error ``max|got - want| / max|want|`` (:func:`rel_err`).  For a
float32 (or float64) output the allowed error is derived from the graph by
:func:`tolerance_for`, a forward error budget walked along the longest path
to the output (idioms are first expanded to their primitive form with
``ir.decompose``, so a softmax is counted as the max, subtract, exp2, sum and
reciprocal it is made of)::

    budget(leaf, View, Gather, MaxReduce, Where, LessThan) = max budget of the inputs
    budget(elementwise op rounding to dtype d)  = max budget of the inputs + ULPS_PER_OP * eps(d)
    budget(Cast to float d)                     = budget of the input + eps(d)   (narrowing or int->float)
    budget(SumReduce over n elements, dtype d)  = budget of the input + (ULPS_PER_OP + SUM_ULPS * n) * eps(d)

    tolerance_for(graph, k) = max(budget(output k), FLOOR_ULPS * eps(dtype of output k))

with ``eps(d)`` the machine epsilon of ``d`` (2**-23 for float32),
``ULPS_PER_OP = 4`` (both sides round once per op; the transcendental
kernels of XLA, Triton and numpy are within 2 ulps; the inputs the cases draw
amplify an incoming error by at most a small factor) and ``SUM_ULPS = 1``: a
sum of n terms carries at most about ``n * eps`` relative to the sum of the
magnitudes (the classical ``gamma_n`` bound, with summation order differing
between backends); this linear term is deliberately the worst case, not the
``sqrt(n)`` typical case, because the norm-relative check divides by the
largest output, which cancellation in a sum can make smaller than the sum of
magnitudes.  Nodes of a half type on the path count with their own eps.
The backends measure 1e-7 to 4e-7 on the conformance cases, inside this
budget; a one-ulp-scale bug in one elementwise op (``1 / (x + 1e-5)``) is
not.

Half types (float16, bfloat16) keep the flat per-dtype :data:`TOLERANCE`
(or the derived budget where that is larger): Triton computes a fused chain
in float32 and rounds once at the store while the reference rounds after
every op, and Triton's interpreter emulates bfloat16 loosely, so per-op
half-precision budgets would be tighter than what the backends are allowed
to do.  :data:`TOLERANCE` is also the documented bound for model-level tests,
which compare whole programs after rewrites.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..ir import dtypes
from ..ir.graph import Graph
from ..profiler.inputs import random_array, random_inputs
from ..profiler.tolerances import (
    _EPS,
    _MOVE_KINDS,
    FLOOR_ULPS,
    HALF,
    SUM_ULPS,
    TOLERANCE,
    ULPS_PER_OP,
    eps,
    error_budgets,
    rel_err,
    tolerance,
    tolerance_for,
)

__all__ = [
    "FLOOR_ULPS", "HALF", "SUM_ULPS", "TOLERANCE", "ULPS_PER_OP", "_EPS", "_MOVE_KINDS",
    "assert_close", "eps", "error_budgets", "fresh_seed", "random_array", "random_inputs",
    "rel_err", "tolerance", "tolerance_for",
]


def assert_close(got: Sequence, want: Sequence, dtypes_: Sequence[str] | None = None, tol: float | None = None,
                 what="output", graph: Graph | None = None):
    """Each output within `tol`, else within :func:`tolerance_for` when `graph` is given, else :data:`TOLERANCE`.

    Non-finite values must match exactly (NaN positions, infinities with their sign); ints and bools exactly.
    """
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        dt = dtypes_[k] if dtypes_ else dtypes.from_numpy(np.asarray(w).dtype)
        if tol is not None:
            t = tol
        elif graph is not None:
            t = tolerance_for(graph, k, dt)
        else:
            t = tolerance(dt)
        if not dtypes.is_float(dt):
            assert np.array_equal(np.asarray(g), np.asarray(w)), f"{what} {k} ({dt}) differs exactly"
            continue
        e = rel_err(g, w)
        assert e <= t, f"{what} {k} ({dt}): relative error {e:.3g} > {t:.3g}"


def fresh_seed() -> int:
    """A new seed per run, printed by failing tests; ``EGRAFT_SEED=<n>`` replays that run.

    Every randomised test takes its seed from here, so one variable replays
    any of them.
    """
    replay = os.environ.get("EGRAFT_SEED")
    if replay:
        return int(replay)
    return int(np.random.SeedSequence().entropy % (2**31))
