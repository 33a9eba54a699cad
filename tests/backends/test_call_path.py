"""The JAX runner's per-call fast path (the executable's and a loaded artifact's) agrees with the checking path."""

from __future__ import annotations

import numpy as np
import pytest

from egraft.backends import lower
from egraft.backends.base import Executable
from egraft.errors import InputError
from egraft.ir import GraphBuilder
from egraft.runtime.jax_fast_path import layout, numpy_casts, torch_plan

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
    assert ex.fast_path()((x, y)) is not None  # the fast path takes it
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
    assert not any(torch_plan(layout(ex.runner), numpy_casts(ex.runner))[3])
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
    assert ex.fast_path().np_dtypes is None  # computed in int32: every call is range-checked
    ids = np.arange(5, dtype=np.int64)
    out = ex(ids)[0]
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, ids * 2)
    tout = ex(torch.from_numpy(ids))[0]
    assert tout.dtype == torch.int64
    with pytest.raises(InputError, match="int32 range"):
        ex(np.full(5, 2**40, np.int64))


def test_outputs_never_alias_inputs_or_each_other():
    """XLA writes each output into a buffer of its own: an identity or repeated output is a copy."""
    b = GraphBuilder()
    x, y = b.input("x", (16, 24), "float32"), b.input("y", (16, 24), "float32")
    ex = lower(b.build([x, x * y, x * y, y.reshape([384])]), "jax", "cpu")
    rng = np.random.default_rng(4)
    xn, yn = _np(rng), _np(rng)
    xt, yt = torch.from_numpy(xn.copy()), torch.from_numpy(yn.copy())
    outs_np, outs_t = ex(xn, yn), ex(xt, yt)
    keep_np, keep_t = [o.copy() for o in outs_np], [o.clone() for o in outs_t]
    xn += 1.0  # the user mutates the inputs after the call
    xt.add_(1.0)
    yt.zero_()
    for o, k in zip(outs_np, keep_np):
        np.testing.assert_array_equal(o, k)
    assert not outs_np[0].flags.writeable  # numpy outputs are read-only views of XLA's buffers
    for o, k in zip(outs_t, keep_t):
        torch.testing.assert_close(o, k, rtol=0, atol=0)
    outs_t[1].zero_()  # torch outputs are writable and independent of the inputs and of each other
    torch.testing.assert_close(outs_t[2], keep_t[2], rtol=0, atol=0)
    assert xt.data_ptr() not in {o.data_ptr() for o in outs_t}


@pytest.mark.parametrize("order", ["torch-first", "numpy-first"])
def test_mixed_numpy_and_torch_inputs_take_checking_path(order):
    ex, rng = _exe(), np.random.default_rng(5)
    xn, yn = _np(rng), _np(rng)
    ins = (torch.from_numpy(xn), yn) if order == "torch-first" else (xn, torch.from_numpy(yn))
    assert ex.fast_path()(ins) is None
    out = ex(*ins)
    assert all(isinstance(o, torch.Tensor) for o in out)  # any tensor in: torch out
    np.testing.assert_array_equal(out[0].numpy(), xn * yn)


def test_output_cast_on_both_paths():
    """int64 computed in int32 (no x64): the output is cast back, on the numpy and the torch fast path."""
    b = GraphBuilder()
    x = b.input("x", (6, 5), "float32")
    ex = lower(b.build([x.argmax(-1), x * 2]), "jax", "cpu")
    xn = np.random.default_rng(6).standard_normal((6, 5)).astype(np.float32)
    assert ex.fast_path().np_dtypes is not None
    out = ex.fast_path()((xn,))
    assert out[0].dtype == np.int64 and out[1].dtype == np.float32
    np.testing.assert_array_equal(out[0], xn.argmax(-1))
    tout = ex.fast_path()((torch.from_numpy(xn),))
    assert tout is not None and tout[0].dtype == torch.int64
    np.testing.assert_array_equal(tout[0].numpy(), xn.argmax(-1))
    for f, s in zip(tout, _slow(ex, torch.from_numpy(xn))):
        torch.testing.assert_close(f, s, rtol=0, atol=0)


def test_float64_program_runs_under_x64_on_fast_path():
    ex = _exe("float64", (4, 6))
    assert ex._x64
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    for ins, conv in (((x, y), np.asarray), ((torch.from_numpy(x), torch.from_numpy(y)), lambda t: t.numpy())):
        fast = ex.fast_path()(ins)
        assert fast is not None and fast[0].dtype == ins[0].dtype  # float64, not canonicalised to float32
        np.testing.assert_array_equal(conv(fast[0]), x * y)


def test_tensor_subclass_and_requires_grad_fall_back_correctly():
    ex = _exe()
    p = torch.nn.Parameter(torch.randn(16, 24))  # requires grad: detached on the careful path
    y = torch.randn(16, 24)
    out = ex(p, y)
    assert not out[0].requires_grad
    torch.testing.assert_close(out[0], p.detach() * y, rtol=0, atol=0)


def test_executable_freed_without_garbage_collector():
    """The fast-path closure holds no reference to the executable: weights go when it does."""
    import gc
    import weakref

    b = GraphBuilder()
    x = b.input("x", (4,), "float32")
    ex = lower(b.build([x * b.weight("w", np.ones(4, np.float32))]), "jax", "cpu")
    ex(np.ones(4, np.float32))
    ex(torch.ones(4))
    ref = weakref.ref(ex)
    gc.disable()
    try:
        del ex
        assert ref() is None
    finally:
        gc.enable()


class _Echo(Executable):
    """A backend whose run_numpy hands back an input, a read-only view and one fresh array twice."""

    def run_numpy(self, inputs):
        x, y = inputs
        ro = (x * y).view()
        ro.flags.writeable = False
        s = x + y
        return [x, ro, s, s]


def test_generic_run_torch_outputs_own_their_memory():
    b = GraphBuilder()
    x, y = b.input("x", (3, 4), "float32"), b.input("y", (3, 4), "float32")
    ex = _Echo(b.build([x, x * y, x + y, x + y]), "echo", "cpu")
    xt, yn = torch.arange(12, dtype=torch.float32).reshape(3, 4), np.ones((3, 4), np.float32)
    for ins in ((xt, yn), (yn, xt)):  # the first input need not be the tensor
        outs = ex(*ins)
        assert all(isinstance(o, torch.Tensor) for o in outs)
        keep = [o.clone() for o in outs]
        xt.add_(1)  # mutating the input leaves the outputs alone
        for o, k in zip(outs, keep):
            torch.testing.assert_close(o, k, rtol=0, atol=0)
        outs[1].add_(1)  # the read-only view came out as a writable copy
        outs[2].zero_()  # the array returned twice came out as two tensors
        torch.testing.assert_close(outs[3], keep[3], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_first_call_with_wrong_shape_then_good_calls(kind):
    """Shapes are left to the compiled call; a mismatch, even on the very first call, is explained."""
    ex = _exe()
    mk = (lambda a: a) if kind == "numpy" else torch.from_numpy
    good, bad = mk(np.ones((16, 24), np.float32)), mk(np.ones((24, 16), np.float32))
    with pytest.raises(InputError, match="input 'y' has shape"):
        ex(good, bad)
    assert ex.fast_path()((good, bad)) is None
    out = ex(good, good)
    assert ex.fast_path()((good, good)) is not None
    np.testing.assert_array_equal(np.asarray(out[0]), np.ones((16, 24), np.float32))
