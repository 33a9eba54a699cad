"""Conversions to a narrower float type rounded once, whatever the installed numpy / ml_dtypes do.

numpy converts float64 to float16 with one rounding.  ml_dtypes converts
float64 and the integers to bfloat16 through float32 before version 0.7,
rounding twice: a value just above a tie between two bfloat16 neighbours
rounds to float32's exact tie and then to the even neighbour, where one
rounding gives the upper one (1 + 2**-8 + 2**-40 becomes 1.0, not
1.0078125).  The reference interpreter's answers must not depend on the
version installed, so :func:`round_once` rounds the source to *odd* at
float32's 24 bits first (an inexact value lands on the neighbour whose last
mantissa bit is 1) and then to nearest: rounding to odd at 24 bits and then
to nearest at 8 is one rounding to nearest (24 >= 8 + 2).  Integers wider
than float64's 53 bits round to odd at 53 bits first, for the same reason.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_BITS = {np.dtype(np.float32): np.dtype(np.int32), np.dtype(np.float64): np.dtype(np.int64)}


def _to_odd(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """`x` (float64 or an integer) in float type `to`, rounded to odd."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(to)
        if x.dtype.kind in "iu":
            big = f >= 2.0**63 if x.dtype.kind == "i" else f >= 2.0**64  # no integer holds it: above x, inexact
            back = np.where(big, 0, f).astype(x.dtype)
            inexact = big | (back != x)
            away = big | np.where(x > 0, back > x, back < x)  # |f| > |x|
        else:
            back = f.astype(x.dtype)
            inexact = (back != x) & np.isfinite(back)  # an overflow to inf is the ordinary rounding's: kept
            away = np.abs(back) > np.abs(x)
    bits = f.view(_BITS[np.dtype(to)])
    fix = inexact & ((bits & 1) == 0)
    # the other neighbour: one ulp toward zero when f overshot |x|, else away from zero (sign-magnitude bits)
    return np.where(fix, np.where(away, bits - 1, bits + 1), bits).astype(bits.dtype).view(to)


def round_once(x, target: np.dtype) -> np.ndarray:
    """`x` as numpy dtype `target`, rounded to nearest (ties to even) once."""
    x, target = np.asarray(x), np.dtype(target)
    if target == _BFLOAT16:
        if x.dtype.kind in "iu" and x.dtype.itemsize == 8:
            x = _to_odd(x, np.dtype(np.float64))
        if x.dtype == np.float64 or (x.dtype.kind in "iu" and x.dtype.itemsize >= 4):
            x = _to_odd(x.astype(np.float64) if x.dtype.kind in "iu" else x, np.dtype(np.float32))
    with np.errstate(over="ignore"):  # beyond the type's range is inf, as any conversion gives
        return x.astype(target)


__all__ = ["round_once"]
