"""The dtype table: each row's facts checked against numpy, ml_dtypes, torch and Triton; the torch<->numpy
bridge on every dtype; the fold policy read by weight folding."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from egraft.errors import IRError
from egraft.ir import GraphBuilder, dtypes, evaluate, tensors

ROWS = list(dtypes.ROWS.values())


@pytest.mark.parametrize("r", ROWS, ids=lambda r: r.name)
def test_row_facts_agree_with_numpy(r):
    assert r.numpy.name == r.name and dtypes.from_numpy(r.numpy) == r.name and dtypes.to_numpy(r.name) == r.numpy
    if r.kind == "float":
        finfo = ml_dtypes.finfo(r.numpy) if r.bits else np.finfo(r.numpy)
        assert r.eps == float(finfo.eps), "eps is the machine epsilon"
        assert r.tolerance is not None and r.tolerance > r.eps, "a tolerance is wider than one rounding"
        assert dtypes.row(r.compute).kind == "float" and dtypes.to_numpy(r.compute).itemsize >= r.numpy.itemsize
    else:
        assert r.eps == 0.0 and r.tolerance is None and r.compute == r.name
    if r.bits:  # the int dtype it crosses torch <-> numpy through has its width
        assert np.dtype(r.bits).itemsize == r.numpy.itemsize and np.issubdtype(np.dtype(r.bits), np.integer)


def test_names_are_unique_and_half_types_compute_in_float32():
    for field in ("torch", "triton", "triton_ptr", "safetensors"):
        names = [getattr(r, field) for r in ROWS]
        assert len(set(names)) == len(names), field
    assert {"float16", "bfloat16"} <= set(dtypes.HALF_DTYPES)
    assert all(dtypes.row(d).compute == "float32" for d in dtypes.HALF_DTYPES)
    assert not dtypes.is_half("float32") and not dtypes.is_half("int32") and not dtypes.is_half("nonsense")
    assert dtypes.compute_dtype("bfloat16") == np.float32 and dtypes.compute_name("int64") == "int64"
    with pytest.raises(IRError, match="unknown dtype 'float8'"):
        dtypes.row("float8")


def test_promotion_is_torchs():
    torch = pytest.importorskip("torch")
    for a, b in itertools.product(dtypes.DTYPES, repeat=2):
        try:
            want = str(torch.promote_types(getattr(torch, a), getattr(torch, b))).removeprefix("torch.")
        except RuntimeError:  # torch promotes no float8 type: egraft's rank decides those
            continue
        assert dtypes.promote(a, b) == want, (a, b)


@pytest.mark.parametrize("r", ROWS, ids=lambda r: r.name)
def test_torch_and_triton_names_exist(r):
    torch = pytest.importorskip("torch")
    t = getattr(torch, r.torch)
    assert dtypes.from_torch(t) == r.name and tensors.torch_dtype(r.name) is t
    assert t.itemsize == r.numpy.itemsize
    tl = pytest.importorskip("triton.language")
    assert isinstance(getattr(tl, r.triton), tl.dtype)


@pytest.mark.parametrize("r", ROWS, ids=lambda r: r.name)
def test_bridge_round_trips_every_dtype_bit_for_bit(r, rng):
    pytest.importorskip("torch")
    a = (rng.gen.standard_normal((3, 4)) * 5).astype(r.numpy)
    t = tensors.to_torch(a)
    assert dtypes.from_torch(t.dtype) == r.name
    back = tensors.to_numpy(t)
    assert back.dtype == r.numpy and back.tobytes() == a.tobytes()
    assert tensors.as_numpy(t[:, 1:]).tobytes() == np.ascontiguousarray(a[:, 1:]).tobytes()  # strided too
    w = tensors.widened(t)
    assert w.dtype == (dtypes.compute_dtype(r.name) if r.bits else r.numpy)
    np.testing.assert_array_equal(w.astype(np.float64), a.astype(np.float64))
    address = a.__array_interface__["data"][0]
    assert tensors.view_torch(a).data_ptr() == address, "view_torch shares the array's memory"
    assert tensors.to_torch(a, copy=False).data_ptr() == address and t.data_ptr() != address


def test_the_ir_bridge_does_not_import_torch():
    code = "import sys, egraft.ir.tensors, egraft.ir.dtypes; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _dequantised():
    """out = x * Cast(w16 -> float32): a weight-only Cast the per-call graph needs."""
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    w = b.weight("w16", (np.arange(12).reshape(3, 4) / 7).astype(np.float16))
    return b.build([x * w.cast("float32")])


def test_fold_policy_is_read_from_the_table(monkeypatch):
    from egraft.backends import fold

    g = _dequantised()
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    folded = fold.plan(g)
    assert folded.folded_names == ("__folded_0",), "float16 folds today: the Cast runs once, at build time"
    monkeypatch.setitem(dtypes.ROWS, "float16", dataclasses.replace(dtypes.ROWS["float16"], fold=False))
    kept = fold.plan(g)
    assert kept.fold is None and kept.folded_names == ()
    assert "Cast" in [n.op for n in kept.main.nodes], "the dequantise stays in the per-call program"
    main, values = fold.fold_weights(g)
    assert values == {} and main.weight_names() == ["w16"]
    np.testing.assert_array_equal(evaluate(main, [x])[0], evaluate(g, [x])[0])
