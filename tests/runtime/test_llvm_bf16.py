"""The generated product of a bfloat16 activation and bfloat16 weights (``runtime.llvm_bf16``: a bfloat16 model's
decode products, x not widened): float32 sums against float64 numpy with the CPU's bfloat16 dot instruction
(where the host has it) and with the widened form every host has, through XLA's FFI, the spec's limits, and a
traced bfloat16 model whose one-row products read their input as bfloat16."""

from __future__ import annotations

import json
import os
import sys

import ml_dtypes
import numpy as np
import pytest

from egraft.errors import BackendError
from egraft.runtime import llvm_bf16
from egraft.runtime import llvm_kernels as lk
from egraft.runtime.llvm_spec import ACT16_ROWS
from egraft.testing import fresh_seed

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backends"))
from jax_helpers import inputs_for  # noqa: E402

BF16 = ml_dtypes.bfloat16


def _case(k, n, width, seed, scale=1.0, rows=1):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, k)) * scale).astype(BF16)
    w = (rng.standard_normal((n, k)) * scale).astype(BF16)
    return x, w, lk.KernelSpec("bfloat16", rows, k, -(-n // width), width, "rows", n % width and n, act="bfloat16")


def _check(x, w, out, what):
    """float32 sums of exact products, in any order: within k float32 roundings of the float64 sum."""
    xf, wf = x.astype(np.float64), w.astype(np.float64)
    want, size = xf @ wf.T, np.abs(xf) @ np.abs(wf).T
    n = w.shape[0]
    err = np.abs(out[:, :n] - want)
    assert np.all(err <= x.shape[1] * 2.0 ** -24 * size + 1e-30), f"{what}: max error {err.max():.3g}"


# (the dot instruction's cases and the widened ones differ in shape: a process keeps one kernel per spec); more
# than one row: the tiles of weight pairs (runtime.llvm_tiles), rows in groups of four and a rest
WIDENED = [(32, 32, 16, 1), (96, 48, 32, 1), (576, 192, 64, 1), (1536, 160, 64, 1), (64, 48, 16, 2),
           (576, 80, 32, 7), (896, 64, 64, 4)]
DOT = [(64, 32, 16, 1), (160, 48, 32, 1), (896, 192, 64, 1), (2048, 144, 64, 1), (96, 48, 16, 3),
       (576, 96, 32, 5), (1536, 64, 64, 8)]


def _run(spec, x, w):
    out = np.full((spec.rows, spec.panels * spec.width), np.nan, np.float32)
    lk.compiled(spec)(x.ctypes.data, w.ctypes.data, out.ctypes.data)
    return out


@pytest.mark.parametrize("k,n,width,rows", WIDENED)
def test_the_widened_form_equals_float64_numpy(k, n, width, rows, monkeypatch):
    monkeypatch.setenv("EGRAFT_LLVM_BF16_DOT", "0")
    assert not llvm_bf16.dot_instruction()
    seed = fresh_seed()
    x, w, spec = _case(k, n, width, seed, rows=rows)
    assert "dpbf16ps" not in lk.module_ir(spec)
    _check(x, w, _run(spec, x, w), f"{spec} seed={seed}")


@pytest.mark.host_specific
@pytest.mark.skipif(not llvm_bf16.dot_instruction(), reason="this CPU has no AVX512-BF16 dot product")
@pytest.mark.parametrize("k,n,width,rows", DOT)
def test_the_dot_instruction_form_equals_float64_numpy(k, n, width, rows):
    seed = fresh_seed()
    x, w, spec = _case(k, n, width, seed, scale=3.0, rows=rows)
    assert "dpbf16ps" in lk.module_ir(spec)
    _check(x, w, _run(spec, x, w), f"{spec} seed={seed}")


def test_xla_calls_it_through_its_ffi_with_the_bfloat16_input_as_it_is():
    import jax

    seed = fresh_seed()
    x, w, spec = _case(320, 96, 32, seed)
    f = jax.jit(lambda a, b: lk.call(spec, a, b) * 2.0)
    _check(x, w, np.asarray(f(x, w)) / 2.0, f"seed={seed}")


def test_a_bfloat16_x_spec_is_refused_where_it_has_no_product_and_keeps_its_act_in_json():
    with pytest.raises(BackendError, match="weights of its own dtype"):
        lk.KernelSpec("float32", 1, 64, 2, 16, "rows", act="bfloat16")
    with pytest.raises(BackendError, match="not a multiple of 4 KB"):  # (a tile's rows would share an L1 set)
        lk.KernelSpec("bfloat16", 2, 2048, 2, 16, "rows", act="bfloat16")
    assert lk.KernelSpec("bfloat16", 1, 2048, 2, 16, "rows", act="bfloat16").rows == 1  # (one row: no tiles)
    with pytest.raises(BackendError, match="a multiple of 32"):
        lk.KernelSpec("bfloat16", 1, 48, 2, 16, "rows", act="bfloat16")
    with pytest.raises(BackendError, match="stored rows"):
        lk.KernelSpec("bfloat16", 1, 64, 2, 16, act="bfloat16")
    spec = lk.KernelSpec("bfloat16", 1, 64, 3, 16, "rows", 48, act="bfloat16")
    assert lk.KernelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.name.endswith("_a16") and spec.name != lk.KernelSpec("bfloat16", 1, 64, 3, 16, "rows", 48).name


@pytest.mark.parametrize("dot", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 12])
def test_a_bfloat16_models_products_read_their_input_as_bfloat16_up_to_eight_rows(rows, dot, monkeypatch):
    """A traced bfloat16 model on a CPU with a bfloat16 dot instruction (`dot`; without one here, the form it asks
    for is the widened one): at one row (a dot per weight row) and at three (tiles of weight pairs) each product
    reads the bfloat16 activation and weight as they are; at twelve rows (past ACT16_ROWS), and at any row count
    on a CPU without the instruction, the float32-x products read the activation widened once.  Each equals the
    reference of the same graph within its derived tolerance, and eager PyTorch."""
    import torch

    from egraft.backends import lower
    from egraft.backends.jax import panels

    monkeypatch.setattr(panels, "dot_instruction", lambda: dot)
    from egraft.frontend.tracer import trace
    from egraft.ir.evaluate import evaluate
    from egraft.measure import rel_err, tolerance_for

    seed = fresh_seed()
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 160), torch.nn.SiLU(), torch.nn.Linear(160, 64, bias=False))
    m = m.to(torch.bfloat16).eval()
    g = trace(m, (torch.randn(rows, 64).to(torch.bfloat16),))
    ex = lower(g, "jax", "cpu", {"stream": "llvm", "stream_width": 32, "stream_layout": "rows", "fold_growing": False})
    act = "bfloat16" if dot and rows <= ACT16_ROWS else "float32"
    assert [(s.dtype, s.act) for s in ex.program.kernels] == [("bfloat16", act)] * 2
    ins = inputs_for(g, np.random.default_rng(seed))
    got, want = ex(*ins)[0], evaluate(g, ins)[0]
    assert rel_err(got, want) <= tolerance_for(g, 0), f"seed={seed}"
    with torch.no_grad():
        eager = m(torch.from_numpy(np.asarray(ins[0]).astype(np.float32)).to(torch.bfloat16)).float().numpy()
    assert rel_err(np.asarray(got).astype(np.float32), eager) <= tolerance_for(g, 0), f"against eager, seed={seed}"
