"""Is a candidate program right?  Compared with the float64 reference on random non-zero inputs.

A search that times candidates must first reject wrong ones, and must not
be taken down by one that crashes, so :func:`validate` never raises for the
candidate's sake: an exception is a failed :class:`Validation` with its
message kept.

The reference is ``ir.evaluate(graph, inputs, np.float64)`` cast to each
output's dtype, and each output's allowed error is
:func:`~egraft.measure.tolerances.tolerance_for` (the forward error budget
of the graph), so "valid" here means what the test suite means.

The comparison itself is :func:`egraft.measure.check.outputs`, the one
check every part of egraft uses: a NaN where the reference is finite (an
element a kernel forgot to write) is an infinite error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..ir import dtypes
from ..ir.evaluate import evaluate
from ..ir.graph import Graph
from .check import Check, as_numpy, outputs
from .inputs import random_inputs
from .tolerances import tolerance_for


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


def reference(graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The float64 oracle's outputs, cast to each output's own dtype."""
    want = evaluate(graph, inputs, np.float64)
    out = []
    for w, (_, dt) in zip(want, graph.output_types()):
        with np.errstate(all="ignore"):
            out.append(np.asarray(w).astype(dtypes.to_numpy(dt)))
    return out


def compare(graph: Graph, got: Sequence, want: Sequence[np.ndarray]) -> Check:
    """`got` against the reference outputs `want` by the one check, each output held to
    :func:`~egraft.measure.tolerances.tolerance_for`."""
    if len(got) != len(want):
        return Check(False, notes=[f"{len(got)} outputs, the graph has {len(want)}"])
    return outputs(got, want, [tolerance_for(graph, k, dt) for k, (_, dt) in enumerate(graph.output_types())])


def validate(candidate: Callable, graph: Graph, inputs: Sequence | None = None, seed: int | None = None) -> Validation:
    """Run `candidate(*inputs)` and compare with the reference; never raises for a bad candidate.

    `inputs` default to :func:`~egraft.measure.inputs.random_inputs` drawn
    from `seed`.
    """
    if inputs is None:
        inputs = random_inputs(graph, seed)
    inputs = [np.asarray(x) if not hasattr(x, "detach") else x for x in inputs]
    want = reference(graph, [as_numpy(x) for x in inputs])
    # a state input is updated in place by the call (backends.base.Executable): the candidate gets its own copy
    states = set(range(len(graph.input_ids) - len(graph.state_ids), len(graph.input_ids)))
    try:
        got = candidate(*[(x.clone() if hasattr(x, "detach") else np.array(x, copy=True)) if k in states else x
                          for k, x in enumerate(inputs)])
        if not isinstance(got, (list, tuple)):
            got = [got]
        c = compare(graph, list(got), want)
    except Exception as exc:  # noqa: BLE001 - a crashing candidate is an invalid one, never the caller's crash
        msg = f"candidate raised {type(exc).__name__}: {exc}"
        return Validation(False, message=msg, seed=seed, details=[msg])
    return Validation(c.ok, c.errors, c.tolerances, c.message, seed, list(c.notes))
