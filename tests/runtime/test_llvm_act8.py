"""The generated product of int8 activations and int8 weights (``runtime.llvm_act8``, the lossy ``w8a8`` mode's
decode products): exact integer sums against int64 numpy, through XLA's FFI, the spec's limits, and a traced w8a8
layer whose one-row products read the quantised activation as int8."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from egraft.errors import BackendError
from egraft.runtime import llvm_kernels as lk
from egraft.testing import fresh_seed

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backends"))
from jax_helpers import inputs_for  # noqa: E402


def _case(k, n, width, seed):
    """Every int8 value (-128 too) in x [1, k] and w [n, k]; the spec reading w where it is stored."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, k)).astype(np.int8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    return x, w, lk.KernelSpec("int8", 1, k, -(-n // width), width, "rows", n % width and n, act="int8")


def _exact(x, w):
    """The int64 sums, each rounded once to float32 (what the product's one conversion gives)."""
    return (x.astype(np.int64) @ w.astype(np.int64).T).astype(np.float32)


@pytest.mark.parametrize("k,n,width", [(32, 32, 16), (96, 48, 32), (576, 192, 64), (1536, 160, 64), (2048, 64, 32)])
def test_the_integer_product_equals_int64_numpy_exactly(k, n, width):
    """Sums past 2**24 (k = 1536, 2048 with values near 128) are rounded once, as int64 -> float32 rounds."""
    seed = fresh_seed()
    x, w, spec = _case(k, n, width, seed)
    out = np.full((1, spec.panels * width), np.nan, np.float32)
    lk.compiled(spec)(x.ctypes.data, w.ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out[:, :n], _exact(x, w), err_msg=f"{spec} seed={seed}")


def test_the_largest_sums_do_not_overflow():
    """Every product at its extreme, 128 * 128 = 16384 (and -127 * 128): k = 4096 sums to 2**26, exactly."""
    k = 4096
    x = np.full((1, k), -128, np.int8)
    w = np.where(np.arange(32)[:, None] % 2 == 0, np.int8(-128), np.int8(127)) * np.ones((1, k), np.int8)
    spec = lk.KernelSpec("int8", 1, k, 1, 32, "rows", act="int8")
    out = np.empty((1, 32), np.float32)
    lk.compiled(spec)(x.ctypes.data, w.ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out, _exact(x, w))
    assert out[0, 0] == 2.0 ** 26


def test_xla_calls_the_integer_product_through_its_ffi():
    import jax

    seed = fresh_seed()
    x, w, spec = _case(160, 96, 32, seed)
    f = jax.jit(lambda a, b: lk.call(spec, a, b) * 2.0)
    np.testing.assert_array_equal(np.asarray(f(x, w)) / 2.0, _exact(x, w))


def test_an_int8_x_spec_is_refused_where_it_has_no_product_and_keeps_its_act_in_json():
    with pytest.raises(BackendError, match="int8 or bfloat16 x only times weights of its own dtype"):
        lk.KernelSpec("float32", 1, 64, 2, 16, "rows", act="int8")
    with pytest.raises(BackendError, match="one row of x"):
        lk.KernelSpec("int8", 2, 64, 2, 16, "rows", act="int8")
    with pytest.raises(BackendError, match="a multiple of 32"):
        lk.KernelSpec("int8", 1, 48, 2, 16, "rows", act="int8")
    with pytest.raises(BackendError, match="stored rows"):
        lk.KernelSpec("int8", 1, 64, 2, 16, act="int8")
    with pytest.raises(BackendError, match="x of dtype"):
        lk.KernelSpec("int8", 1, 64, 2, 16, "rows", act="int16")
    spec = lk.KernelSpec("int8", 1, 64, 3, 16, "rows", 48, act="int8")
    assert lk.KernelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.name.endswith("_a8") and spec.name != lk.KernelSpec("int8", 1, 64, 3, 16, "rows", 48).name
    old = {k: v for k, v in spec.to_json().items() if k != "act"}  # a manifest written before activations
    assert lk.KernelSpec.from_json(old).act == "float32"


@pytest.mark.parametrize("rows", [1, 3])
def test_a_w8a8_layers_one_row_products_read_the_quantised_activation_as_int8(rows):
    """A traced w8a8 model (``quantize="w8a8"``): at one row each product is the integer product of the int8
    activation XLA rounds and the stored int8 weight; at three rows the float-x int8 product reads the widened
    activation.  Both equal the reference of the same graph within its derived (lossy) tolerance."""
    import torch

    from egraft.backends import lower
    from egraft.frontend.quantize import quantize
    from egraft.frontend.tracer import trace
    from egraft.ir.evaluate import evaluate
    from egraft.measure import rel_err, tolerance_for

    seed = fresh_seed()
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 160), torch.nn.SiLU(), torch.nn.Linear(160, 64, bias=False)).eval()
    qm, report = quantize(m, "w8a8")
    assert report["lossy"] and report["mode"] == "w8a8"
    g = trace(qm, (torch.randn(rows, 64),))
    ex = lower(g, "jax", "cpu", {"stream": "llvm", "stream_width": 32, "stream_layout": "rows", "fold_growing": False})
    assert [(s.dtype, s.act) for s in ex.program.kernels] == [("int8", "int8" if rows == 1 else "float32")] * 2
    ins = inputs_for(g, np.random.default_rng(seed))
    got, want = ex(*ins)[0], evaluate(g, ins)[0]
    assert rel_err(got, want) <= tolerance_for(g, 0), f"seed={seed}"
    x = torch.from_numpy(ins[0])
    assert rel_err(got, qm(x).detach().numpy()) <= tolerance_for(g, 0), f"against eager PyTorch, seed={seed}"
