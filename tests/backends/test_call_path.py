"""The JAX executable's per-call fast path agrees with the checking (slow) path in every respect."""

from __future__ import annotations

import numpy as np
import pytest

from egraft.backends import lower
from egraft.backends.base import Executable
from egraft.errors import InputError
from egraft.ir import GraphBuilder

torch = pytest.importorskip("torch")


def _exe(dt="float32", shape=(16, 24)):
    b = GraphBuilder()
    x, y = b.input("x", shape, dt), b.input("y", shape, dt)
    return lower(b.build([x * y, x + y]), "jax", "cpu")


def _slow(ex, *inputs):
    return Executable.__call__(ex, *inputs)  # the checking path, bypassing the fast one


def _np(rng, shape=(16, 24)):
    return rng.standard_normal(shape).astype(np.float32)


def test_numpy_fast_path_matches_slow_path():
    ex, rng = _exe(), np.random.default_rng(0)
    x, y = _np(rng), _np(rng)
    fast, slow = ex(x, y), _slow(ex, x, y)
    assert ex._fn is not ex._compiled  # the compiled call is bound after the first call
    for f, s in zip(fast, slow):
        assert isinstance(f, np.ndarray) and f.dtype == s.dtype == np.float32
        np.testing.assert_array_equal(f, s)
    np.testing.assert_array_equal(ex(x, y)[0], x * y)


def test_torch_fast_path_matches_slow_path():
    ex, rng = _exe(), np.random.default_rng(1)
    x, y = torch.from_numpy(_np(rng)), torch.from_numpy(_np(rng))
    fast, slow = ex(x, y), _slow(ex, x, y)
    for f, s in zip(fast, slow):
        assert isinstance(f, torch.Tensor) and f.dtype == s.dtype == torch.float32
        assert f.device == x.device
        torch.testing.assert_close(f, s, rtol=0, atol=0)
    torch.testing.assert_close(fast[0], x * y, rtol=0, atol=0)


@pytest.mark.parametrize("dt", ["bfloat16", "int32", "bool"])
def test_torch_fast_path_other_dtypes(dt):
    ex = _exe(dt, (4, 6))
    g = torch.Generator().manual_seed(2)
    if dt == "bool":
        x, y = torch.rand(4, 6, generator=g) > 0.5, torch.rand(4, 6, generator=g) > 0.5
    elif dt == "int32":
        x, y = (torch.randint(-50, 50, (4, 6), generator=g, dtype=torch.int32) for _ in range(2))
    else:
        x, y = (torch.randn(4, 6, generator=g).to(torch.bfloat16) for _ in range(2))
    fast, slow = ex(x, y), _slow(ex, x, y)
    for f, s in zip(fast, slow):
        assert f.dtype == s.dtype == getattr(torch, dt)
        torch.testing.assert_close(f, s, rtol=0, atol=0)


def test_large_torch_output_crosses_without_copy_path():
    ex = _exe(shape=(256, 256))  # 256 KiB outputs: handed over through DLPack
    assert not any(ex._torch_signature() and ex._torch_copy)
    x, y = torch.randn(256, 256), torch.randn(256, 256)
    out = ex(x, y)
    torch.testing.assert_close(out[0], x * y, rtol=0, atol=0)
    assert out[0].device == x.device
    out[0].add_(1)  # writable, and does not disturb the other output
    torch.testing.assert_close(out[1], x + y, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_wrong_shape_or_dtype_raises_same_message_on_both_paths(kind):
    ex = _exe()
    mk = (lambda a: a) if kind == "numpy" else torch.from_numpy
    good = mk(np.zeros((16, 24), np.float32))
    for bad in (mk(np.zeros((16, 23), np.float32)), mk(np.zeros((16, 24), np.float64))):
        with pytest.raises(InputError) as fast:
            ex(good, bad)
        with pytest.raises(InputError) as slow:
            _slow(ex, good, bad)
        assert str(fast.value) == str(slow.value)
        assert "input 'y'" in str(fast.value)
    with pytest.raises(InputError, match="takes 2 input"):
        ex(good)


def test_non_contiguous_and_grad_torch_inputs():
    ex = _exe()
    base = torch.randn(24, 16)
    x = base.t()  # a transposed view: not contiguous
    assert not x.is_contiguous()
    y = torch.randn(16, 24, requires_grad=True)
    out = ex(x, y)
    torch.testing.assert_close(out[0], x * y.detach(), rtol=0, atol=0)
    xs = torch.randn(16, 48)[:, ::2]  # a strided slice
    torch.testing.assert_close(ex(xs, y)[1], xs + y.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_repeated_calls_return_fresh_outputs(kind):
    ex, rng = _exe(), np.random.default_rng(3)
    a, b = _np(rng), _np(rng)
    c, d = _np(rng), _np(rng)
    if kind == "torch":
        a, b, c, d = (torch.from_numpy(v) for v in (a, b, c, d))
    first = ex(a, b)
    keep = [np.asarray(v).copy() for v in first]
    second = ex(c, d)
    for f, k in zip(first, keep):  # the first call's results are untouched by the second
        np.testing.assert_array_equal(np.asarray(f), k)
    np.testing.assert_array_equal(np.asarray(second[0]), np.asarray(c) * np.asarray(d))
    if kind == "torch":
        assert first[0].data_ptr() != second[0].data_ptr()
        second[0].zero_()
        np.testing.assert_array_equal(first[0].numpy(), keep[0])


def test_int64_in_int32_program_takes_checking_path():
    b = GraphBuilder()
    i = b.input("i", (5,), "int64")
    ex = lower(b.build([i + i]), "jax", "cpu")
    assert ex._np_sig is None  # computed in int32: every call is range-checked
    ids = np.arange(5, dtype=np.int64)
    out = ex(ids)[0]
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, ids * 2)
    tout = ex(torch.from_numpy(ids))[0]
    assert tout.dtype == torch.int64
    with pytest.raises(InputError, match="int32 range"):
        ex(np.full(5, 2**40, np.int64))
