"""The check's eager reference with half-precision matrix products in float32, rounded once
(``egraft.api.half_products``): the same values as PyTorch's CPU kernel up to the order of float32 sums."""

from __future__ import annotations

import time

import pytest
import torch

import egraft
from egraft.api import half_products as hp

HALF = [torch.bfloat16, torch.float16]


def _rand(g, *shape, dtype):
    return (torch.randn(*shape, generator=g) * 0.5).to(dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [8, 24])
def test_products_are_float32_products_rounded_once(dtype, rows):
    g = torch.Generator().manual_seed(time.time_ns() % 2**31)
    a, b, bias = _rand(g, rows, 48, dtype=dtype), _rand(g, 48, 40, dtype=dtype), _rand(g, 40, dtype=dtype)
    x, y, z = _rand(g, 3, rows, 32, dtype=dtype), _rand(g, 3, 32, 16, dtype=dtype), _rand(g, 3, rows, 16, dtype=dtype)
    cases = {
        "mm": (lambda: a @ b, lambda: a.float() @ b.float()),
        "addmm": (lambda: torch.addmm(bias, a, b), lambda: torch.addmm(bias.float(), a.float(), b.float())),
        "linear": (lambda: torch.nn.functional.linear(a, b.T, bias), lambda: a.float() @ b.float() + bias.float()),
        "bmm": (lambda: torch.bmm(x, y), lambda: torch.bmm(x.float(), y.float())),
        "baddbmm": (lambda: torch.baddbmm(z, x, y), lambda: torch.baddbmm(z.float(), x.float(), y.float())),
    }
    for name, (run, want32) in cases.items():
        native = run()
        with hp.FloatProducts():
            got = run()
        assert got.dtype == dtype, name
        exact = want32().to(dtype)  # (float32 sums in another order: within a rounding of the result)
        assert torch.allclose(got.float(), exact.float(), rtol=2 ** -6, atol=1e-3), name
        assert torch.allclose(got.float(), native.float(), rtol=2 ** -6, atol=1e-3), name


def test_few_rows_scaled_products_and_float32_run_as_pytorch_runs_them():
    g = torch.Generator().manual_seed(time.time_ns() % 2**31)
    a, b = _rand(g, hp.MIN_ROWS - 1, 64, dtype=torch.bfloat16), _rand(g, 64, 32, dtype=torch.bfloat16)
    c = _rand(g, hp.MIN_ROWS - 1, 32, dtype=torch.bfloat16)
    seen = []

    class Spy(hp.FloatProducts):  # (records when the float32 form is taken)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            seen.append(func)
            return out

    a8 = _rand(g, hp.MIN_ROWS, 64, dtype=torch.bfloat16)
    with Spy():
        few = a @ b
        scaled = torch.addmm(c, a, b, beta=0.5)
        f32 = a.float() @ b.float()
    assert torch.equal(few, a @ b) and torch.equal(scaled, torch.addmm(c, a, b, beta=0.5))
    assert torch.equal(f32, a.float() @ b.float())
    with hp.FloatProducts():
        many = a8 @ b
    assert torch.equal(many, (a8.float() @ b.float()).to(torch.bfloat16))


def test_which_models_get_float_products(monkeypatch):
    monkeypatch.delenv(hp.ENV_VAR, raising=False)
    half = torch.nn.Linear(8, 8).to(torch.bfloat16)
    monkeypatch.setattr(hp, "slow_half_products", lambda dt: True)
    assert isinstance(hp.float_products_for(half), hp.FloatProducts)
    assert not isinstance(hp.float_products_for(torch.nn.Linear(8, 8)), hp.FloatProducts)  # float32: unchanged
    monkeypatch.setenv(hp.ENV_VAR, "1")
    assert not isinstance(hp.float_products_for(half), hp.FloatProducts)
    monkeypatch.delenv(hp.ENV_VAR)
    monkeypatch.setattr(hp, "slow_half_products", lambda dt: False)  # a CPU with a fast half kernel
    assert not isinstance(hp.float_products_for(half), hp.FloatProducts)


def test_slow_half_products_asks_onednn():
    assert hp.slow_half_products(torch.float32) is False
    for dt, name in ((torch.bfloat16, "_is_mkldnn_bf16_supported"), (torch.float16, "_is_mkldnn_fp16_supported")):
        if hasattr(torch.ops.mkldnn, name):
            assert hp.slow_half_products(dt) is (not getattr(torch.ops.mkldnn, name)())


def test_compile_checks_a_bfloat16_model_against_float_products(monkeypatch):
    """The compile's check runs the model under FloatProducts where the CPU lacks a fast kernel; the program
    still matches PyTorch's own bfloat16 kernel."""
    monkeypatch.delenv(hp.ENV_VAR, raising=False)
    monkeypatch.setattr(hp, "slow_half_products", lambda dt: True)
    calls = []
    real = hp.FloatProducts.__torch_dispatch__
    monkeypatch.setattr(hp.FloatProducts, "__torch_dispatch__",
                        lambda self, func, types, args=(), kwargs=None:
                        calls.append(func) or real(self, func, types, args, kwargs))
    torch.manual_seed(time.time_ns() % 2**31)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 16))
    model = model.to(torch.bfloat16).eval()
    x = torch.randn(12, 32).to(torch.bfloat16)
    cm = egraft.compile(model, "cpu", x, budget="2s", progress=False)
    assert torch.ops.aten.addmm.default in calls
    monkeypatch.setattr(hp, "slow_half_products", lambda dt: False)
    with torch.no_grad():
        want = model(x)
    assert torch.allclose(cm(x).float(), want.float(), rtol=2 ** -5, atol=2e-2)
