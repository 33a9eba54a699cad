"""A model quantised with torchao compiles as it is: its weight-only int8 and int4 layers are read as egraft's own
QuantizedLinear (the same integers and scales), and the forms egraft does not read are refused naming the layer."""

from __future__ import annotations

import pytest
import torch

from egraft.errors import InputError
from egraft.frontend.adopt import adopt
from egraft.frontend.quantize import QuantizedLinear
from egraft.testing import fresh_seed

torchao = pytest.importorskip("torchao")
from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,  # noqa: E402
                                  IntxWeightOnlyConfig, quantize_)
from torchao.quantization.granularity import PerAxis, PerGroup  # noqa: E402
from torchao.quantization.quant_primitives import MappingType  # noqa: E402

CONFIGS = {
    "int8": lambda: Int8WeightOnlyConfig(),
    "intx-int8": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
    "intx-int4-g32": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    "intx-int4-row": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerAxis(0)),  # as int8
}


def _mlp(dtype=torch.float32):
    torch.manual_seed(fresh_seed())
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.SiLU(), torch.nn.Linear(256, 128, bias=False),
                               torch.nn.LayerNorm(128)).eval().to(dtype)


def _torchao(config: str, dtype=torch.float32):
    m = _mlp(dtype)
    quantize_(m, CONFIGS[config]())
    return m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_torchao_weight_only_layers_are_read_with_their_own_integers_and_scales(config, dtype):
    m = _torchao(config, dtype)
    out, info = adopt(m)
    assert isinstance(out[0], QuantizedLinear) and isinstance(out[2], QuantizedLinear)
    assert type(m[0].weight).__module__.startswith("torchao"), "the model itself was changed"
    assert out[3].weight is m[3].weight, "a kept weight was copied"
    group = 32 if config.endswith("g32") else 0
    assert info["source"] == "torchao" and info["layers"] == 2 and info["mode"] == ("int4" if group else "int8")
    assert info.get("group_size", 0) == group
    for i in (0, 2):
        w = m[i].weight
        s = w.scale.reshape(w.qdata.shape[0], -1).float()
        want = w.qdata.float() * s.repeat_interleave(w.qdata.shape[1] // s.shape[1], dim=1)
        assert torch.equal(out[i].dequantized(), want), "not q * s in float32"
        # torchao's own dequantisation: the same values, rounded to the model's dtype
        tol = 0 if dtype == torch.float32 else 2 ** -8
        assert torch.allclose(out[i].dequantized(), w.dequantize().float(), rtol=tol, atol=0)
        if not group:  # int8: the model's int8 tensor itself, not a copy
            assert out[i].qweight.data_ptr() == w.qdata.data_ptr()
    x = torch.randn(5, 64, dtype=dtype)
    with torch.no_grad():
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        assert torch.allclose(out(x).float(), m(x).float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("config", ["int8", "intx-int4-g32"])
def test_a_torchao_model_compiles_as_it_is_and_equals_the_adopted_model(config):
    import egraft

    m = _torchao(config)
    x = torch.randn(1, 64)
    cm = egraft.compile(m, example_inputs=(x,), backend="jax", budget="2s", cache=False, fitness="model",
                        progress=False)
    assert cm.quantization["source"] == "torchao" and isinstance(cm.model[0], QuantizedLinear)
    with torch.no_grad():
        want, theirs = cm.model(x), m(x)
    got = cm(x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    assert torch.allclose(got, theirs, rtol=1e-4, atol=1e-4)
    if config == "int8":  # the generated products read the int8 values as stored (as with quantize="int8")
        ex = next(iter(cm.executables.values()))
        assert sorted(s.dtype for s in ex.program.kernels) == ["int8", "int8"], ex.program.kernels


@pytest.mark.parametrize("make, why", [
    (lambda: Int8DynamicActivationInt8WeightConfig(), "quantises the activations too"),
    (lambda: Int8WeightOnlyConfig(granularity=PerGroup(32)), r"in blocks of \(1, 32\) holding values outside -8..7"),
    (lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(16)),
     r"in blocks of \(1, 16\); egraft reads one scale per row"),
    (lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32),
                                  mapping_type=MappingType.ASYMMETRIC), "zero points"),
])
def test_torchao_forms_egraft_does_not_read_are_refused_naming_the_layer(make, why):
    import egraft

    m = _mlp()
    quantize_(m, make())
    with pytest.raises(InputError, match=rf"layer '0' has a torchao \w+ weight .*{why}.*quantize='int8'"):
        egraft.compile(m, example_inputs=(torch.randn(2, 64),), budget="1s", progress=False)


def test_quantising_a_torchao_model_again_is_refused():
    import egraft

    with pytest.raises(InputError, match=r"quantised already \(torchao, 2 layers\).*quantize=None"):
        egraft.compile(_torchao("int8"), quantize="int8")


def test_a_model_with_no_quantised_layer_is_returned_as_it_is():
    m = _mlp()
    out, info = adopt(m)
    assert out is m and info is None
