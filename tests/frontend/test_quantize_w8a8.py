"""``quantize="w8a8"`` (lossy, opt-in): int8 weights and each layer input rounded to int8 per row; the compiled
programs equal that model within the stated lossy bound, and its distance from the float model is measured
(``frontend.quality``), never assumed."""

from __future__ import annotations

import pytest
import torch

from egraft.errors import InputError
from egraft.frontend.quantize import AMIN, QMAX, QuantizedLinear, quantize, quantize_rows
from egraft.testing import fresh_seed


def test_quantize_rows_rounds_each_row_to_its_own_scale_half_away_from_zero():
    x = torch.tensor([[127.0, 2.5, -2.5, 0.5, -0.49, 0.0],
                      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                      [-1e-3, 5e-4, 2.5e-4, 0.0, 1e-3, -7.5e-4]])
    xq, sx = quantize_rows(x)
    assert xq.dtype == torch.int8 and sx.shape == (3, 1)
    assert xq[0].tolist() == [127, 3, -3, 1, 0, 0] and float(sx[0]) == 1.0
    assert xq[1].eq(0).all() and float(sx[1]) == pytest.approx(AMIN / QMAX)  # a row of zeros: zeros
    assert xq[2].tolist() == [-127, 64, 32, 0, 127, -95]  # 63.5 -> 64, 31.75 -> 32, -95.25 -> -95
    seed = fresh_seed()
    r = torch.randn(40, 96, generator=torch.Generator().manual_seed(seed)) * torch.logspace(-4, 3, 40)[:, None]
    rq, rs = quantize_rows(r)
    assert int(rq.abs().max()) <= QMAX and rq.abs().amax(1).eq(QMAX).all(), f"seed={seed}: each row's max is 127"
    assert bool(((rq.float() * rs - r).abs() <= rs * 0.5 * (1 + 1e-5)).all()), f"seed={seed}: off by over half a step"


def _mlp():
    torch.manual_seed(fresh_seed())
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.SiLU(), torch.nn.Linear(256, 128)).eval()


def test_a_w8a8_layer_multiplies_the_rounded_activation_by_the_int8_weight():
    m = _mlp()
    qm, info = quantize(m, "w8a8")
    assert info["mode"] == "w8a8" and info["lossy"] and "activations rounded to int8 per row" in info["scheme"]
    assert isinstance(qm[0], QuantizedLinear) and qm[0].activations == "int8" and "lossy" in repr(qm[0])
    x = torch.randn(5, 64)
    with torch.no_grad():
        xq, sx = quantize_rows(x)
        want = (xq.double() @ qm[0].qweight.double().T) * sx.double() * qm[0].scale.double() + qm[0].bias.double()
        assert torch.allclose(qm[0](x).double(), want, rtol=1e-6, atol=1e-6)
        weight_only, _ = quantize(m, "int8")
        assert not torch.equal(qm(x), weight_only(x)), "the activations were not rounded"
        assert (qm(x) - m(x)).abs().max() < 0.05 * m(x).abs().max()  # and near the model
    with pytest.raises(ValueError, match="only int8 activations with int8 weights"):
        QuantizedLinear(torch.zeros(8, 16, dtype=torch.int8), torch.ones(8, 1), None, 32, activations="int8")


def test_bad_w8a8_requests_name_what_was_wrong():
    import egraft

    with pytest.raises(InputError, match=r"quantize='w4a4'.*'w8a8'.*lossy"):
        egraft.compile(_mlp(), quantize="w4a4")
    with pytest.raises(InputError, match="group_size=64 is for quantize='int4'"):
        egraft.compile(_mlp(), quantize="w8a8", group_size=64)


def test_a_compiled_w8a8_model_equals_it_within_the_lossy_bound():
    import egraft
    from egraft.measure import rel_err
    from egraft.measure.tolerances import LOSSY_BOUND

    m = _mlp()
    x = torch.randn(1, 64)
    cm = egraft.compile(m, example_inputs=(x,), backend="jax", budget="2s", quantize="w8a8", cache=False,
                        fitness="model", progress=False)
    assert cm.quantization["mode"] == "w8a8" and "quality" not in cm.quantization  # not a causal LM: no logits
    with torch.no_grad():
        want = cm.model(x)
    assert rel_err(cm(x).numpy(), want.numpy()) <= LOSSY_BOUND


def test_the_quality_of_a_lossy_model_is_measured_against_the_float_model(monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "generation"))
    from family_models import tiny_family

    from egraft.frontend.quality import AGREEMENT_DROP, ERROR_FACTOR, logit_quality, measure_lossy

    model = tiny_family("llama")
    qm, _ = quantize(model, "w8a8")
    lines = []
    q = measure_lossy(model, qm, lines.append)
    w = q["weight_only"]  # the yardstick: the same int8 weights, activations unrounded
    assert q["within_bound"] and q["positions"] == 64 and 0 < w["logit_rel_err"] < q["logit_rel_err"]
    assert q["bound"] == {"logit_rel_err": ERROR_FACTOR * w["logit_rel_err"],
                          "top1_agreement": w["top1_agreement"] - AGREEMENT_DROP}
    assert all(m.activations == "int8" for m in qm.modules() if isinstance(m, QuantizedLinear)), "not restored"
    weight_only, _ = quantize(model, "int8")
    ids = torch.randint(0, 320, (1, 64), generator=torch.Generator().manual_seed(0))
    assert logit_quality(model, weight_only, ids) == w and "top-1 agreement" in lines[0]
    ids = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(fresh_seed()))
    assert logit_quality(model, model, ids) == {"logit_rel_err": 0.0, "top1_agreement": 1.0, "positions": 18}
    from egraft.frontend import quantize as module

    def coarse(x):  # activations rounded to 3 levels a sign, not 127: far outside the bound
        xq, sx = quantize_rows(x)
        return torch.round(xq.float() / 40) * 40, sx

    monkeypatch.setattr(module, "quantize_rows", coarse)
    with pytest.warns(UserWarning, match="outside the bound"):
        assert not measure_lossy(model, qm)["within_bound"]
    assert measure_lossy(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)) is None  # no vocabulary: not a causal LM
