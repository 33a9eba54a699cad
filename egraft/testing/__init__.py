"""Helpers for checking programs against the reference: random inputs, tolerances, seeds.

Used by the test suite, the benchmarks and the search's candidate validation,
so "matches the reference" means one thing everywhere.  The comparison core
(:func:`rel_err`, the graph-derived float32 tolerance :func:`tolerance_for`
and the per-dtype :data:`TOLERANCE`, random non-zero inputs) lives in
:mod:`egraft.measure.tolerances` and :mod:`egraft.measure.inputs`, whose
docstring states the tolerance rule and why, so the search's candidate validation
can use it without importing this higher layer; it is re-exported here
unchanged.  This module adds :func:`assert_close` and :func:`fresh_seed`.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..ir import dtypes
from ..ir.graph import Graph
from ..measure.inputs import random_array, random_inputs
from ..measure.tolerances import (
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
