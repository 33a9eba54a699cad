"""The one correctness check: outputs compared with a reference, output by output, against allowed errors.

Every place egraft decides "this program is right" compares through
:func:`outputs`: the search's candidate validation (against the float64
reference interpreter, :mod:`.validate`), the check of a compiled signature
against the user's eager model or the Dynamo graph in PyTorch
(``egraft.search.pipeline``), the Dynamo backend's check of a split graph,
and ``egraft run --check``.  They differ only in the reference they run and
the tolerance they allow each output, which the caller passes.

The rule, per output: the count, then the shape (and the dtype, when
``same_dtype``) must match; a float output may differ by its tolerance in
the norm-relative error of :func:`~egraft.measure.tolerances.rel_err` (a NaN
or infinity where the reference is finite is an infinite error, so an
element a kernel forgot to write fails); integer and bool outputs must match
exactly.  Torch tensors and numpy arrays are both accepted (bfloat16 is
widened to float32, which holds it exactly).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..ir.tensors import widened as as_numpy  # bfloat16 widened exactly to float32
from .tolerances import rel_err


@dataclass(frozen=True)
class Check:
    """The verdict: `ok`, each output's error and allowed error, and one note per failing output."""

    ok: bool
    errors: tuple[float, ...] = ()
    tolerances: tuple[float, ...] = ()
    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    @property
    def message(self) -> str:
        return "; ".join(self.notes)

    @property
    def max_error(self) -> float:
        return max(self.errors, default=0.0)


def dtype_name(x) -> str:
    """``"float32"``, ``"bfloat16"``, ``"int64"``... of a torch tensor or numpy array."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return np.asarray(x).dtype.name
    return str(dt).removeprefix("torch.") if not isinstance(dt, np.dtype) else dt.name


def _is_float(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)


def outputs(got: Sequence, want: Sequence, tolerances: Sequence[float], *, same_dtype: bool = False,
            names: Sequence[str] | None = None) -> Check:
    """Compare `got` with `want` output by output; ``tolerances[k]`` is output k's allowed relative error.

    `names` label the outputs in the notes (default ``"output k"``).
    """
    got, want = list(got), list(want)
    if len(got) != len(want):
        return Check(False, notes=[f"{len(got)} outputs, the reference gives {len(want)}"])
    errs: list[float] = []
    notes: list[str] = []
    for k, (g, w) in enumerate(zip(got, want)):
        what = names[k] if names is not None else f"output {k}"
        gn, wn = as_numpy(g), as_numpy(w)
        gd, wd = dtype_name(g), dtype_name(w)
        if gn.shape != wn.shape or (same_dtype and gd != wd):
            errs.append(float("inf"))
            notes.append(f"{what}: {_shape(gn.shape)} {gd}, the reference gives {_shape(wn.shape)} {wd}")
            continue
        if _is_float(wn):
            e = rel_err(gn, wn)
            unwritten = 0 if e <= tolerances[k] else int(np.count_nonzero(np.isnan(gn.astype(np.float64))
                                                                          & np.isfinite(wn.astype(np.float64))))
            if unwritten:
                notes.append(f"{what}: {unwritten} NaN elements where the reference is finite")
            elif not e <= tolerances[k]:
                notes.append(f"{what} ({wd}): relative error {e:.3g} > {tolerances[k]:.3g}")
        else:
            diff = int(np.count_nonzero(gn != wn))
            e = 0.0 if diff == 0 else float("inf")
            if diff:
                notes.append(f"{what} ({wd}): {diff} elements differ (an exact match is required)")
        errs.append(e)
    tols = tuple(float(t) for t in tolerances[:len(errs)])
    return Check(all(e <= t for e, t in zip(errs, tols)), tuple(errs), tols, notes)


def _shape(shape) -> str:
    return "x".join(str(int(d)) for d in shape) or "scalar"
