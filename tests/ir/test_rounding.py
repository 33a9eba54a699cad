"""Conversions to bfloat16 round once, whatever ml_dtypes version converts through float32 (before 0.7)."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np

from egraft.ir import GraphBuilder, evaluate
from egraft.ir.rounding import round_once
from egraft.testing import fresh_seed

BF16 = np.dtype(ml_dtypes.bfloat16)


def _neighbours(r: np.ndarray) -> list[np.ndarray]:
    bits = r.view(np.uint16)
    return [(bits + 1).astype(np.uint16).view(BF16), (bits - 1).astype(np.uint16).view(BF16)]


def _check_nearest_even(x: np.ndarray, r: np.ndarray) -> None:
    """Each r[i] is a bfloat16 nearest x[i] (exact arithmetic), the even one of a tie."""
    for i, v in enumerate(x.tolist()):
        want = Fraction(int(v)) if isinstance(v, int) else Fraction(v)
        got = r[i]
        d = abs(Fraction(float(got)) - want)
        for n in _neighbours(r[i:i + 1]):
            if not np.isfinite(float(n[0])):
                continue
            dn = abs(Fraction(float(n[0])) - want)
            assert d <= dn, f"{v!r}: {float(got)} is not the nearest bfloat16 ({float(n[0])} is nearer)"
            if d == dn:
                assert int(got.view(np.uint16)) % 2 == 0, f"{v!r}: a tie went to the odd neighbour {float(got)}"


def test_float64_near_ties_round_once():
    rng = np.random.default_rng(fresh_seed())
    lo = (rng.standard_normal(300) * 100).astype(BF16)
    mid = (lo.astype(np.float64) + _neighbours(lo)[0].astype(np.float64)) / 2
    x = np.concatenate([mid, mid + np.abs(mid) * 1e-12, mid - np.abs(mid) * 1e-12, [1.0 + 2.0**-8 + 2.0**-40]])
    r = round_once(x, BF16)
    assert float(r[-1]) == 1.0078125  # through float32 it is the tie 1 + 2**-8, and then 1.0
    _check_nearest_even(x, r)


def test_wide_integers_round_once():
    rng = np.random.default_rng(fresh_seed())
    k = rng.integers(20, 55, 300)
    x = np.concatenate([(rng.integers(2**7, 2**8, 300) << k) + (1 << (k - 1)) + 1,
                        -((rng.integers(2**7, 2**8, 50) << 40) + (1 << 39) + 1), [2**62 + 2**54 + 1, 7, -1, 0]])
    _check_nearest_even(x.astype(np.int64), round_once(x.astype(np.int64), BF16))
    x32 = np.array([2**24 + 2**16 + 1, 2**30 + 2**22 + 1, -(2**31), 2**31 - 1, 7], np.int32)
    _check_nearest_even(x32, round_once(x32, BF16))


def test_special_values_and_other_targets_are_plain_conversions():
    x = np.array([np.inf, -np.inf, np.nan, 3.5e38, -1e300, 1e-300, -1e-300, 0.0, -0.0])
    r = round_once(x, BF16).astype(np.float64)
    assert np.array_equal(r, [np.inf, -np.inf, np.nan, np.inf, -np.inf, 0.0, -0.0, 0.0, -0.0], equal_nan=True)
    assert np.array_equal(np.signbit(r), np.signbit(x))
    y = np.random.default_rng(fresh_seed()).standard_normal(50)
    assert np.array_equal(round_once(y, np.float16), y.astype(np.float16))
    assert np.array_equal(round_once(y, np.float32), y.astype(np.float32))


def test_the_reference_interpreter_casts_with_one_rounding():
    b = GraphBuilder()
    x = b.input("x", (2,), "float64")
    g = b.build([x.cast("bfloat16")])
    out = evaluate(g, [np.array([1.0 + 2.0**-8 + 2.0**-40, -(1.0 + 2.0**-8 + 2.0**-40)])])[0]
    assert out.astype(np.float64).tolist() == [1.0078125, -1.0078125]
