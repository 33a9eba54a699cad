"""The one correctness check (measure.check.outputs) and the one random-input policy (measure.inputs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from egraft.measure import from_specs, like, outputs
from egraft.testing import fresh_seed


def test_floats_within_their_tolerance_pass_and_beyond_fail():
    rng = np.random.default_rng(fresh_seed())
    want = rng.standard_normal((4, 5)).astype(np.float32)
    ok = outputs([want * np.float32(1 + 1e-6)], [want], [1e-5])
    assert ok and ok.errors[0] <= 1e-5 and ok.max_error == ok.errors[0]
    bad = outputs([torch.from_numpy(want * np.float32(1 + 1e-3))], [want], [1e-5])  # torch against numpy
    assert not bad and "output 0 (float32): relative error" in bad.message


def test_nan_where_the_reference_is_finite_fails_even_with_a_loose_tolerance():
    want = np.ones((3, 3), np.float32)
    got = want.copy()
    got[1, 1] = np.nan
    c = outputs([got], [want], [1.0])
    assert not c and "1 NaN elements" in c.message


def test_ints_must_match_exactly_and_shapes_dtypes_count():
    a = torch.arange(6).reshape(2, 3)
    assert outputs([a.clone()], [a], [0.0])
    b = a.clone()
    b[0, 0] = 5
    assert "1 elements differ" in outputs([b], [a], [0.0]).message
    assert "the reference gives 2x3" in outputs([a.T], [a], [0.0]).message
    assert "int32, the reference gives 2x3 int64" in outputs([a.int()], [a], [0.0], same_dtype=True).message
    assert outputs([a.int()], [a], [0.0]).ok  # dtypes only when asked
    assert "2 outputs, the reference gives 1" in outputs([a, a], [a], [0.0]).message


def test_like_keeps_shapes_dtypes_and_integer_ranges():
    ids = torch.tensor([[3, 7, 5], [4, 4, 6]])
    x = torch.randn(2, 3, dtype=torch.bfloat16)
    (ids2, x2), kw = like((ids, x), {"scale": 2.0, "mask": torch.ones(2, 3, dtype=torch.bool)}, seed=fresh_seed())
    assert ids2.dtype == ids.dtype and ids2.shape == ids.shape and 3 <= int(ids2.min()) and int(ids2.max()) <= 7
    assert x2.dtype == torch.bfloat16 and x2.shape == x.shape and bool(x2.abs().sum() > 0)
    assert kw["scale"] == 2.0 and kw["mask"].dtype == torch.bool and bool(kw["mask"].any())
    again, _ = like((ids, x), None, seed=3)
    assert torch.equal(again[0], like((ids, x), None, seed=3)[0][0])  # drawn from the seed


def test_from_specs_draws_in_zero_to_int_high():
    a, b = from_specs([((64,), "int64"), ((2, 2), "float16")], seed=fresh_seed(), int_high=5)
    assert a.dtype == torch.int64 and 0 <= int(a.min()) and int(a.max()) < 5
    assert b.dtype == torch.float16 and b.shape == (2, 2)
    with pytest.raises(Exception, match="dtype"):
        from_specs([((2,), "float8")])
