"""What "matches the reference" means: the norm-relative error and the tolerance rule.

Lives in ``egraft.measure`` (layer 3) rather than in ``egraft.testing`` because
the search's candidate validation needs it and must not import the test
tooling, which sits higher; ``egraft.testing`` re-exports every name here,
so the test suite, the benchmarks and the search's validation share one
definition.

Tolerances.  A backend output is compared with ``ir.evaluate`` by the
norm-relative error ``max|got - want| / max|want|`` (:func:`rel_err`).  For a
float32 (or float64) output the allowed error is derived from the graph by
:func:`tolerance_for`, a forward error budget walked along the longest path
to the output (idioms are first expanded to their primitive form with
``ir.decompose``, so a softmax is counted as the max, subtract, exp2, sum and
reciprocal it is made of)::

    budget(leaf, View, Gather, MaxReduce, Where, LessThan) = max budget of the inputs
    budget(Scatter)                             = max of the target's and the update's budgets (the
                                                  index is an int: 0); it moves values, rounds none
    budget(elementwise op rounding to dtype d)  = max budget of the inputs + ULPS_PER_OP * eps(d)
    budget(Cast to float d)                     = budget of the input + eps(d)   (narrowing or int->float)
    budget(SumReduce over n elements, dtype d)  = budget of the input + (ULPS_PER_OP + SUM_ULPS * n) * eps(d)
    budget(Cast of an inexact float to int8)    = max(budget of the input, LOSSY_BOUND)   (a quantiser)

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

A quantiser (the lossy ``quantize="w8a8"`` mode rounds each layer input to
int8) is where float rounding stops being small: two programs whose float
results differ by one ulp round a value near a half to different integers,
an error of a whole quantum, which the layers after it carry on and
multiply (a flip moves the next quantiser's input, which flips more).  No
ulp budget bounds that; a program of such a graph is checked against the
reference of the same graph within :data:`LOSSY_BOUND` (2^-4), a stated
bound with a margin over what was measured on the models the mode is
tested with: the 2-layer GPT-2, Llama and Qwen2 test models' w8a8 logits,
XLA against the float64 reference on 40 random prompts each, differed by
2e-7 to 4e-7 where nothing flipped and by up to 2.7e-2 in the 15 of 120
draws where something did.
Only a ``Cast`` to int8 of an inexact float counts: it is the quantised
dtype, while a cast of computed positions to int64 (whole numbers summed
exactly) stays exact.

Half types (float16, bfloat16) keep the flat per-dtype :data:`TOLERANCE`
(or the derived budget where that is larger): Triton computes a fused chain
in float32 and rounds once at the store while the reference rounds after
every op, and Triton's interpreter emulates bfloat16 loosely, so per-op
half-precision budgets would be tighter than what the backends are allowed
to do.  :data:`TOLERANCE` is also the documented bound for model-level tests,
which compare whole programs after rewrites.
"""

from __future__ import annotations

import numpy as np

from ..ir import Op, dtypes
from ..ir.graph import Graph

# max |a - b| / max |b| allowed, by dtype of the output, where no graph is at hand (model-level checks)
TOLERANCE = {d: r.tolerance for d, r in dtypes.ROWS.items() if r.tolerance is not None}  # the dtype table's

ULPS_PER_OP = 4  # ulps per rounding elementwise op on the path
SUM_ULPS = 1  # ulps per summed element (k in k * eps * n)
LOSSY_BOUND = dtypes.LOSSY_BOUND  # norm-relative error allowed downstream of a quantiser (module docstring)
FLOOR_ULPS = 4  # no output is checked tighter than this (a Cast or a movement of an input is exact)
HALF = dtypes.HALF_DTYPES
_MOVE_KINDS = ("leaf", "movement", "index", "select")
_EPS = {d: r.eps for d, r in dtypes.ROWS.items() if r.eps}


def eps(dtype: str) -> float:
    """Machine epsilon of a float dtype (0 for ints and bool, which are compared exactly)."""
    return _EPS.get(dtype, 0.0)


def error_budgets(graph: Graph) -> list[float]:
    """The forward error budget of every node of `graph` (idioms must already be primitives)."""
    from ..ir.op_groups import get_op

    budget: list[float] = []
    for n in graph.nodes:
        inherited = max((budget[j] for j in n.inputs), default=0.0)
        kind = get_op(n.op).kind
        e = eps(n.dtype)
        if kind in _MOVE_KINDS or n.op in (Op.MaxReduce, Op.LessThan):
            b = inherited
        elif kind == "type" and n.dtype == "int8" and dtypes.is_float(graph.nodes[n.inputs[0]].dtype) and inherited:
            b = max(inherited, LOSSY_BOUND)  # a quantiser of an inexact value: whole quanta may flip
        elif kind == "type":
            src = graph.nodes[n.inputs[0]].dtype
            rounds = dtypes.is_float(n.dtype) and (not dtypes.is_float(src) or eps(src) < e)
            b = inherited + (e if rounds else 0.0)
        elif n.op == Op.SumReduce:
            count = graph.nodes[n.inputs[0]].shape[n.attrs["axis"]]
            b = inherited + (ULPS_PER_OP + SUM_ULPS * count) * e
        elif kind in ("unary", "binary"):
            b = inherited + ULPS_PER_OP * e
        else:
            raise ValueError(f"error_budgets: {n.op} is not a primitive; decompose the graph first")
        budget.append(b)
    return budget


def tolerance_for(graph: Graph, output_index: int, dtype: str | None = None) -> float:
    """The allowed norm-relative error of output `output_index` of `graph` (rule: the module docstring)."""
    dt = dtype or graph.output_types()[output_index][1]
    return output_tolerances(graph, {output_index: dt})[output_index] if dtypes.is_float(dt) else 0.0


def output_tolerances(graph: Graph, which: dict[int, str] | None = None) -> dict[int, float]:
    """:func:`tolerance_for` of the outputs `which` (output index -> dtype; default every output at its own
    dtype), from one decomposition and one pass over the nodes (a step of 60 cache outputs checks them all)."""
    from ..ir.decompose import decompose

    which = dict(enumerate(d for _, d in graph.output_types())) if which is None else which
    out = {k: 0.0 for k, dt in which.items() if not dtypes.is_float(dt)}
    if len(out) < len(which):
        prim = decompose(graph)
        budgets = error_budgets(prim)
        for k, dt in which.items():
            if dtypes.is_float(dt):
                derived = max(budgets[prim.outputs[k]], FLOOR_ULPS * eps(dt))
                out[k] = max(derived, TOLERANCE[dt]) if dtypes.is_half(dt) else derived
    return out


def rel_err(got, want, floor: float = 0.0) -> float:
    """Norm-relative error: max |got - want| / max(max |want|, floor) (inf/nan-aware).

    `floor` > 0 makes the check absolute for outputs smaller than it: an
    output that is mathematically zero (the sum of a layer norm's row) is
    rounding noise, and its noise relative to itself says nothing.  A
    non-finite reference element must be matched exactly (NaN by NaN); a
    non-finite element where the reference is finite is an infinite error.
    Computed in float64, a block of :data:`_BLOCK` elements at a time (a KV
    cache of hundreds of MB is compared without float64 copies of it whole).
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    g, w = got.reshape(-1), want.reshape(-1)
    diff = scale = 0.0
    any_finite = False
    for s in range(0, w.size, _BLOCK):
        gb, wb = g[s:s + _BLOCK].astype(np.float64), w[s:s + _BLOCK].astype(np.float64)
        finite = np.isfinite(wb)
        if finite.all():
            if not np.isfinite(gb).all():
                return float("inf")
        else:
            same = (gb == wb) | (np.isnan(gb) & np.isnan(wb))
            if np.any(~finite & ~same) or np.any(~np.isfinite(gb) & finite):
                return float("inf")
            if not finite.any():
                continue
            gb, wb = gb[finite], wb[finite]
        any_finite = True
        diff = max(diff, float(np.abs(gb - wb).max()))
        scale = max(scale, float(np.abs(wb).max()))
    if not any_finite:
        return 0.0
    scale = max(scale, floor)
    return float(diff / scale) if scale > 0 else float(diff)


_BLOCK = 1 << 20


def tolerance(dtype: str) -> float:
    """The flat per-dtype bound of :data:`TOLERANCE` (0 for ints and bool: compared exactly)."""
    return TOLERANCE.get(dtype, 0.0)
