"""Generated CPU products over a view read where it lies (a batch of products, W at an offset, the "kn" layout)
and the form for short stored rows (egraft/runtime/llvm_short.py), against float64 numpy on fresh random values:
the kernel alone, through XLA's FFI, and shared with helper threads."""

from __future__ import annotations

import json
import os
import sys

import ml_dtypes
import numpy as np
import pytest

from egraft.errors import BackendError
from egraft.runtime import llvm_kernels as lk
from egraft.runtime.llvm_short import takes as short_takes
from egraft.testing import fresh_seed

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "generation"))
from runtime_helpers import kernel_on_cores  # noqa: E402

FLOATS = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _check(got, want64, bound64, what):
    """float32 sums of K products against float64: within K float32 roundings of the sum of magnitudes."""
    bad = np.abs(got.astype(np.float64) - want64) > bound64 + 1e-30
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} values off, e.g. {got[bad][:3]} vs {want64[bad][:3]}"


def _cache(rng, dtype, rows, heads, slots, dim):
    return rng.standard_normal((rows, heads, slots, dim)).astype(FLOATS[dtype])


def _run(spec, x, operand):
    """The kernel alone (NaN-filled output) and through XLA's FFI; both outputs."""
    out = np.full((spec.batch * spec.rows, spec.panels * spec.width), np.nan, np.float32)
    lk.compiled(spec)(x.ctypes.data, operand.ctypes.data, out.ctypes.data)
    import jax

    through = np.asarray(jax.jit(lambda a, b: lk.call(spec, a, b))(x, operand))
    return out, through


@pytest.mark.parametrize("dtype", list(FLOATS))
@pytest.mark.parametrize("rows,heads,slots,context,dim", [(1, 2, 80, 64, 16), (2, 3, 272, 256, 64),
                                                          (1, 1, 40, 32, 128), (2, 2, 48, 48, 320)])
@pytest.mark.parametrize("queries", [1, 3, 9])
def test_keys_of_a_cache_read_in_place_equal_float64_numpy(dtype, rows, heads, slots, context, dim, queries):
    """Scores q . K over a cache's first `context` slots: one product per (row, head), W the block's stored rows
    (short rows take llvm_short's form; 320 values take the tiles)."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    cache = _cache(rng, dtype, rows, heads, slots, dim)
    q = rng.standard_normal((rows * heads, queries, dim)).astype(np.float32)
    width = 64 if context >= 64 else 16
    panels = -(-context // width)
    spec = lk.KernelSpec(dtype, queries, dim, panels, width, "rows", 0 if panels * width == context else context,
                         batch=rows * heads, bstride=slots * dim)
    assert short_takes(spec) == (dim <= 256)
    keys = cache.astype(np.float64).reshape(rows * heads, slots, dim)[:, :context]
    want = np.einsum("bqd,bcd->bqc", q.astype(np.float64), keys)
    bound = dim * 2.0 ** -23 * np.einsum("bqd,bcd->bqc", np.abs(q.astype(np.float64)), np.abs(keys))
    for got, how in zip(_run(spec, q.reshape(-1, dim), cache), ("alone", "through XLA")):
        _check(got[:, :context].reshape(want.shape), want, bound, f"{spec} {how} seed={seed}")


@pytest.mark.parametrize("dtype", list(FLOATS))
@pytest.mark.parametrize("rows,heads,slots,context,dim", [(1, 2, 80, 64, 16), (2, 3, 272, 256, 64),
                                                          (1, 1, 40, 24, 128), (1, 2, 20, 20, 48)])
@pytest.mark.parametrize("queries", [1, 5])
def test_values_of_a_cache_read_as_kn_equal_float64_numpy(dtype, rows, heads, slots, context, dim, queries):
    """p . V over a cache's first `context` slots: W the block read as a [slots, dim] matrix, rows dim apart."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    cache = _cache(rng, dtype, rows, heads, slots, dim)
    p = rng.standard_normal((rows * heads, queries, context)).astype(np.float32)
    width = 32 if dim % 32 == 0 else 16
    spec = lk.KernelSpec(dtype, queries, context, dim // width, width, "kn", batch=rows * heads,
                         bstride=slots * dim, ldw=dim)
    vals = cache.astype(np.float64).reshape(rows * heads, slots, dim)[:, :context]
    want = np.einsum("bqc,bcd->bqd", p.astype(np.float64), vals)
    bound = context * 2.0 ** -23 * np.einsum("bqc,bcd->bqd", np.abs(p.astype(np.float64)), np.abs(vals))
    for got, how in zip(_run(spec, p.reshape(-1, context), cache), ("alone", "through XLA")):
        _check(got.reshape(want.shape), want, bound, f"{spec} {how} seed={seed}")


def test_a_view_at_an_offset_with_rows_further_apart_reads_only_its_values():
    """W starting `offset` values in, rows `ldw` apart (wider than W): the values around it are never read."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    big = np.full((7, 40), np.nan, np.float32)  # NaN everywhere but the view
    w = rng.standard_normal((5, 32)).astype(np.float32)
    big[1:6, 3:35] = w
    x = rng.standard_normal((2, 5)).astype(np.float32)
    spec = lk.KernelSpec("float32", 2, 5, 2, 16, "kn", offset=43, ldw=40)
    for got, how in zip(_run(spec, x, big), ("alone", "through XLA")):
        want = x.astype(np.float64) @ w.astype(np.float64)
        _check(got, want, 5 * 2.0 ** -23 * (np.abs(x) @ np.abs(w)), f"{how} seed={seed}")


@pytest.mark.parametrize("dtype", list(FLOATS))
@pytest.mark.parametrize("rows,k,n", [(1, 16, 16), (3, 64, 80), (9, 256, 64), (2, 144, 48)])
def test_short_stored_rows_of_a_weight_equal_float64_numpy(dtype, rows, k, n):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(FLOATS[dtype])
    x = rng.standard_normal((rows, k)).astype(np.float32)
    width = 64 if n >= 64 else 16
    panels = -(-n // width)
    spec = lk.KernelSpec(dtype, rows, k, panels, width, "rows", 0 if panels * width == n else n)
    assert short_takes(spec) and "@form_panel" not in lk.module_ir(spec)
    wa = w.astype(np.float64)
    for got, how in zip(_run(spec, x, w), ("alone", "through XLA")):
        _check(got[:, :n], x.astype(np.float64) @ wa.T, k * 2.0 ** -23 * (np.abs(x) @ np.abs(wa).T),
               f"{spec} {how} seed={seed}")


@pytest.mark.parametrize("cores", [1, 2])
def test_a_batch_shared_with_helper_threads_gives_the_same_values(cores, tmp_path):
    """Each (product, panel) job is computed by one thread in one order: one core or two, the same values."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    cache = _cache(rng, "bfloat16", 2, 3, 80, 64)
    q = rng.standard_normal((6 * 3, 64)).astype(np.float32)
    spec = lk.KernelSpec("bfloat16", 3, 64, 1, 64, "rows", batch=6, bstride=80 * 64)
    alone, _ = _run(spec, q, cache)
    np.testing.assert_array_equal(kernel_on_cores(spec, [q, cache], cores, tmp_path)[0], alone)


def test_view_specs_are_refused_with_what_is_wrong_and_keep_their_fields_in_json():
    with pytest.raises(BackendError, match="ldw >= its columns"):
        lk.KernelSpec("float32", 1, 8, 2, 16, "kn", ldw=16)  # 32 columns, rows 16 apart
    with pytest.raises(BackendError, match="only it"):
        lk.KernelSpec("float32", 1, 16, 1, 16, "rows", ldw=16)
    with pytest.raises(BackendError, match="float weights"):
        lk.KernelSpec("int8", 1, 32, 1, 16, "rows", batch=2, bstride=512)
    with pytest.raises(BackendError, match="offsets >= 0"):
        lk.KernelSpec("float32", 1, 16, 1, 16, "rows", batch=0)
    spec = lk.KernelSpec("float16", 3, 40, 2, 32, "kn", batch=6, bstride=5000, offset=7, ldw=96)
    assert lk.KernelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec and spec.jobs == 12
    names = {spec.name, lk.KernelSpec("float16", 3, 40, 2, 32, "kn", batch=6, bstride=5000, ldw=96).name,
             lk.KernelSpec("float16", 3, 40, 2, 32, "kn", batch=3, bstride=5000, ldw=96).name,
             lk.KernelSpec("float16", 3, 40, 2, 32, "kn", ldw=64).name}
    assert len(names) == 4  # each field that changes the code changes the custom call's name
    old = {k: v for k, v in lk.KernelSpec("float32", 2, 32, 1, 16, "rows").to_json().items()
           if k not in ("batch", "bstride", "offset", "ldw")}
    assert lk.KernelSpec.from_json(old) == lk.KernelSpec("float32", 2, 32, 1, 16, "rows")  # an older manifest
