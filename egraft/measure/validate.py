"""Is a candidate program right?  Compared with the float64 reference on random non-zero inputs.

A search that times candidates must first reject wrong ones, and must not
be taken down by one that crashes, so :func:`validate` never raises for the
candidate's sake: an exception is a failed :class:`Validation` with its
message kept.

The reference is ``ir.evaluate(graph, inputs, np.float64)`` cast to each
output's dtype, and each output's allowed error is
:func:`~egraft.measure.tolerances.tolerance_for` (the forward error budget
of the graph), so "valid" here means what the test suite means.

**Poisoning.**  A kernel that forgets to write part of its output can pass
by accident when the buffer happens to hold the right values from a
previous run.  Where a candidate exposes preallocated output buffers (an
attribute ``output_buffers``: a list of writable arrays it writes into),
every float buffer is filled with NaN before each run, so an unwritten
element reads NaN where the reference is finite and fails.  egraft's own
executables return fresh arrays, for which poisoning is a no-op; for them
the same failure is caught by checking that no output is NaN where the
reference is finite (which :func:`~egraft.measure.tolerances.rel_err`
counts as an infinite error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..ir import dtypes
from ..ir.evaluate import evaluate
from ..ir.graph import Graph
from ..ir.tensors import as_numpy
from .inputs import random_inputs
from .tolerances import rel_err, tolerance_for


@dataclass(frozen=True)
class Validation:
    """The verdict: `ok`, each output's error and allowed tolerance, and why it failed (if it did)."""

    ok: bool
    errors: tuple[float, ...] = ()
    tolerance: tuple[float, ...] = ()
    message: str = ""
    seed: int | None = None
    details: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok


def poison(candidate) -> int:
    """Fill the candidate's preallocated float output buffers with NaN; returns how many were poisoned.

    A candidate without ``output_buffers`` returns fresh arrays: nothing to poison (0).
    """
    count = 0
    for buf in getattr(candidate, "output_buffers", None) or ():
        if hasattr(buf, "fill_") and getattr(buf, "is_floating_point", lambda: False)():  # a torch tensor
            buf.fill_(float("nan"))
            count += 1
        elif isinstance(buf, np.ndarray) and np.issubdtype(buf.dtype, np.floating):
            buf.fill(np.nan)
            count += 1
    return count


def reference(graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The float64 oracle's outputs, cast to each output's own dtype."""
    want = evaluate(graph, inputs, np.float64)
    out = []
    for w, (_, dt) in zip(want, graph.output_types()):
        with np.errstate(all="ignore"):
            out.append(np.asarray(w).astype(dtypes.to_numpy(dt)))
    return out


def compare(graph: Graph, got: Sequence, want: Sequence[np.ndarray]) -> tuple[bool, list[float], list[float], list[str]]:
    """Per-output error and tolerance; ints and bools must match exactly (error 0 or inf)."""
    errs: list[float] = []
    tols: list[float] = []
    notes: list[str] = []
    if len(got) != len(want):
        return False, errs, tols, [f"{len(got)} outputs, the graph has {len(want)}"]
    for k, (g, w) in enumerate(zip(got, want)):
        dt = graph.output_types()[k][1]
        g = as_numpy(g)
        t = tolerance_for(graph, k, dt)
        if g.shape != w.shape:
            e = float("inf")
            notes.append(f"output {k}: shape {g.shape}, expected {w.shape}")
        elif not dtypes.is_float(dt):
            e = 0.0 if np.array_equal(g, w) else float("inf")
        else:
            e = rel_err(g, w)
            unwritten = np.isnan(g.astype(np.float64)) & np.isfinite(w.astype(np.float64))
            if unwritten.any():
                e = float("inf")
                notes.append(f"output {k}: {int(unwritten.sum())} NaN elements where the reference is finite")
        if e > t and not any(n.startswith(f"output {k}:") for n in notes):
            notes.append(f"output {k} ({dt}): relative error {e:.3g} > {t:.3g}")
        errs.append(e)
        tols.append(t)
    return all(e <= t for e, t in zip(errs, tols)), errs, tols, notes


def validate(candidate: Callable, graph: Graph, inputs: Sequence | None = None, seed: int | None = None) -> Validation:
    """Run `candidate(*inputs)` and compare with the reference; never raises for a bad candidate.

    `inputs` default to :func:`~egraft.measure.inputs.random_inputs` drawn
    from `seed`.  Output buffers are poisoned before the run (see the module
    docstring).
    """
    if inputs is None:
        inputs = random_inputs(graph, seed)
    inputs = [np.asarray(x) if not hasattr(x, "detach") else x for x in inputs]
    want = reference(graph, [as_numpy(x) for x in inputs])
    try:
        poison(candidate)
        got = candidate(*inputs)
        if not isinstance(got, (list, tuple)):
            got = [got]
        ok, errs, tols, notes = compare(graph, list(got), want)
    except Exception as exc:  # noqa: BLE001 - a crashing candidate is an invalid one, never the caller's crash
        msg = f"candidate raised {type(exc).__name__}: {exc}"
        return Validation(False, message=msg, seed=seed, details=[msg])
    return Validation(ok, tuple(errs), tuple(tols), "; ".join(notes), seed, notes)
