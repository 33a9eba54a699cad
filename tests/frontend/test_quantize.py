"""``quantize="int8"``: the quantised model (int8 weights, one scale per output channel) is the function every
compiled program must equal; the JAX program reads the int8 weights themselves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from egraft.errors import InputError
from egraft.frontend.quantize import QMAX, QuantizedLinear, int8_per_channel, quantize
from egraft.testing import fresh_seed


def test_int8_per_channel_rounds_each_row_to_its_own_scale():
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(24, 40, generator=g) * torch.logspace(-3, 2, 24)[:, None]  # rows of very different sizes
    w[5] = 0.0
    q, s = int8_per_channel(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and q.shape == w.shape and s.shape == (24,)
    assert int(q.abs().max()) <= QMAX and q[5].eq(0).all() and s[5] == 1.0
    rows = [i for i in range(24) if i != 5]
    assert torch.equal(q[rows].abs().amax(1), torch.full((23,), QMAX, dtype=torch.int8)), "each row's max is 127"
    err = (q.float() * s[:, None] - w).abs()
    assert bool((err <= s[:, None] * 0.5 * (1 + 1e-6)).all()), f"seed={seed}: rounding beyond half a step"


def _mlp(dtype=torch.float32):
    torch.manual_seed(fresh_seed())
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.SiLU(), torch.nn.Linear(256, 128, bias=False),
                               torch.nn.LayerNorm(128)).eval().to(dtype)


def test_quantize_copies_the_module_tree_and_leaves_the_model_alone():
    m = _mlp()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    qm, info = quantize(m, "int8")
    assert isinstance(qm[0], QuantizedLinear) and isinstance(qm[2], QuantizedLinear)
    assert type(m[0]) is torch.nn.Linear, "the model itself was changed"
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert qm[3].weight is m[3].weight, "a kept weight was copied"
    assert info["layers"] == 2 and info["weight_bytes_after"] < info["weight_bytes_before"] / 3.5
    x = torch.randn(3, 64)
    with torch.no_grad():  # the quantised model is the model with its weights dequantised
        want = torch.nn.functional.linear(torch.nn.functional.silu(
            torch.nn.functional.linear(x, qm[0].dequantized(), qm[0].bias)), qm[2].dequantized())
        assert torch.allclose(qm[:3](x), want, rtol=1e-5, atol=1e-5)
        assert (qm(x) - m(x)).abs().max() < 0.1  # and near the model


def test_gpt2_conv1d_layers_are_quantised_by_their_output_channels():
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(fresh_seed())
    layer = Conv1D(48, 32)  # GPT-2's linear layer: weight [in 32, out 48]
    torch.nn.init.normal_(layer.bias)
    qm, info = quantize(torch.nn.Sequential(layer), "int8")
    assert info["layers"] == 1 and qm[0].qweight.shape == (48, 32)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert torch.allclose(qm(x), layer(x), atol=0.05)
        want = x @ qm[0].dequantized().T + layer.bias
        assert torch.allclose(qm(x), want, rtol=1e-5, atol=1e-5)


def test_bad_quantize_requests_are_refused_before_any_work():
    import egraft

    with pytest.raises(InputError, match=r"quantize='int3'.*'int8'"):
        egraft.compile(_mlp(), quantize="int3")
    with pytest.raises(InputError, match="no nn.Linear"):
        quantize(torch.nn.Sequential(torch.nn.LayerNorm(8)), "int8")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_compiled_quantised_model_equals_it_and_reads_the_int8_weights(dtype):
    """The scale moves out of the product's sum (rewrites: reductions.sum-factor-inner), so the JAX program's
    products read the int8 weights as stored: no float copy of a quantised weight is bound."""
    import egraft
    from egraft.runtime.derived import provenance

    m = _mlp(dtype)
    x = torch.randn(1, 64, dtype=dtype)
    cm = egraft.compile(m, example_inputs=(x,), backend="jax", budget="2s", quantize="int8", cache=False, fitness="model",
                        progress=False)
    assert cm.quantization["layers"] == 2 and isinstance(cm.model[0], QuantizedLinear)
    with torch.no_grad():
        want = cm.model(x)
    got = cm(x)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
    ex = next(iter(cm.executables.values()))
    assert sorted(s.dtype for s in ex.program.kernels) == ["int8", "int8"], ex.program.kernels
    big = [a for a in ex._host if a.size >= 64 * 256]
    assert big and all(a.dtype == np.int8 and provenance(a) is None for a in big), [(a.dtype, a.shape) for a in big]


class _Dequantizing(torch.nn.Module):
    """A layer as other quantisers write it: the dequantised weight formed, then an ordinary product."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        q, s = int8_per_channel(linear.weight)
        self.register_buffer("q", q)
        self.register_buffer("s", s)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.q.to(torch.float32) * self.s[:, None])


def test_a_written_out_dequantisation_has_its_scale_moved_out_of_the_product():
    """``x @ (q * s).T``: the e-graph's reductions.sum-factor-inner hoists the per-output-channel scale, so the
    extractions the search starts from (greedy and the cost model's best) form no dequantised weight, and their
    copy-free JAX programs read q as stored (int8 products, no float copy of q folded) and equal the model;
    ``egraft.compile`` of it equals the model too, and whatever program its search ends on holds no float copy
    of q (a deeper search picks a product written as a broadcast multiply and a sum, which the generated
    product does not read: its per-call program widens q where it reads it; which program a 2 s search ends on
    depends on how far it got, so the scale's hoisting is checked on the extractions)."""
    import egraft
    from egraft.backends import lower
    from egraft.rewrites import saturate
    from egraft.runtime.derived import provenance
    from egraft.search import Space
    from egraft.search.cost import node_cost

    m = _mlp()
    layers = torch.nn.Sequential(_Dequantizing(m[0]), torch.nn.SiLU(), _Dequantizing(m[2])).eval()
    x = torch.randn(1, 64)
    with torch.no_grad():
        want = layers(x)
    space = Space.from_egraph(saturate(egraft.trace(layers, (x,))))
    knobs = {"stream": "llvm", "stream_layout": "rows", "panels": 0, "fold_growing": False}
    for name, graph in (("greedy", space.greedy()), ("cost model", space.greedy(node_cost(device="cpu")))):
        formed = [n for n in graph.nodes if n.op == "Mul" and tuple(n.shape) in ((256, 64), (128, 256))]
        assert not formed, (name, formed)
        ex = lower(graph, "jax", "cpu", knobs=knobs)
        assert [(k.dtype, k.rows) for k in ex.program.kernels] == [("int8", 1)] * 2, name
        assert not [a for a in ex._host if provenance(a) is not None and a.size >= 64 * 128], name
        assert torch.allclose(torch.as_tensor(np.asarray(ex(x.numpy())[0])), want, rtol=1e-4, atol=1e-4), name
    cm = egraft.compile(layers, example_inputs=(x,), backend="jax", budget="2s", cache=False, fitness="model",
                        progress=False)
    with torch.no_grad():
        assert torch.allclose(cm(x), want, rtol=1e-4, atol=1e-4)
    ex = next(iter(cm.executables.values()))
    assert not [a for a in ex._host if provenance(a) is not None and a.size >= 64 * 128], ex.program.weight_names


# --- int4: group-wise, two values a byte ---------------------------------------------------------------------
def test_int4_packing_round_trips_every_byte_and_matches_the_ir_nibble():
    from egraft.frontend.quantize import pack_int4, unpack_int4
    from egraft.ir import GraphBuilder, evaluate

    every = torch.arange(-128, 128, dtype=torch.int8).reshape(4, 64)
    values = unpack_int4(every)
    assert values.shape == (4, 128) and int(values.min()) == -8 and int(values.max()) == 7
    assert torch.equal(pack_int4(values), every)
    u = (every.to(torch.int32) & 255).reshape(4, 4, 16)  # blocks of 16 bytes: bits 0-3 of each, then bits 4-7
    blocks = values.to(torch.int32).reshape(4, 4, 32)
    assert torch.equal(blocks[..., :16], ((u & 15) ^ 8) - 8) and torch.equal(blocks[..., 16:], ((u >> 4) ^ 8) - 8)
    b = GraphBuilder()
    g = b.build([b.input("p", (4, 64), "int8").unpack_int4()])
    assert np.array_equal(evaluate(g, [every.numpy()])[0], values.numpy())


@pytest.mark.parametrize("group", [32, 64])
def test_int4_per_group_rounds_each_group_to_its_own_scale(group):
    from egraft.frontend.quantize import QMAX4, int4_per_group, unpack_int4

    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(12, 128, generator=g) * torch.logspace(-3, 2, 128)[None, :]  # groups of very different sizes
    w[3, :group] = 0.0
    packed, s = int4_per_group(w, group)
    assert packed.dtype == torch.int8 and packed.shape == (12, 64) and s.shape == (12, 128 // group)
    q = unpack_int4(packed).float().reshape(12, -1, group)
    assert s[3, 0] == 1.0 and q[3, 0].eq(0).all()
    assert int(q.abs().max()) == QMAX4
    err = (q * s[:, :, None] - w.reshape(12, -1, group)).abs()
    assert bool((err <= s[:, :, None] * 0.5 * (1 + 1e-6)).all()), f"seed={seed}: rounding beyond half a step"


def test_int4_quantised_layers_compute_with_their_dequantised_weights():
    m = _mlp()
    qm, info = quantize(m, "int4", group_size=32)
    assert info["mode"] == "int4" and info["group_size"] == 32 and info["layers"] == 2
    assert info["weight_bytes_after"] < info["weight_bytes_before"] / 6, info  # 4 + 32 / 32 bits a weight
    assert qm[0].qweight.shape == (256, 32) and qm[0].scale.shape == (256, 2) and qm[0].in_features == 64
    x = torch.randn(3, 64)
    with torch.no_grad():
        want = torch.nn.functional.linear(x, qm[0].dequantized(), qm[0].bias)
        assert torch.allclose(qm[0](x), want, rtol=1e-6, atol=1e-6)
        assert (qm(x) - m(x)).abs().max() < 0.5  # and near the model (int4: a coarser step)


def test_bad_int4_requests_name_what_was_wrong():
    import egraft

    with pytest.raises(InputError, match=r"group_size=48.*32, 64, 128"):
        egraft.compile(_mlp(), quantize="int4", group_size=48)
    with pytest.raises(InputError, match=r"group_size=.*is for quantize='int4'"):
        egraft.compile(_mlp(), quantize="int8", group_size=32)
    odd = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.Linear(64, 8)).eval()
    with pytest.raises(InputError, match=r"group_size=128 does not divide the input width 96 of layer '0'.*"
                                         r"group_size=32 divides"):
        egraft.compile(odd, quantize="int4")
    assert type(odd[0]) is torch.nn.Linear


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_compiled_int4_model_equals_the_quantised_model(backend):
    """(Triton: tests/backends/test_triton_quantized.py)"""
    import egraft

    m = _mlp()
    x = torch.randn(2, 64)
    cm = egraft.compile(m, example_inputs=(x,), backend=backend, budget="2s", quantize="int4", group_size=64,
                        cache=False, fitness="model", progress=False)
    with torch.no_grad():
        want = cm.model(x)
    assert torch.allclose(cm(x), want, rtol=1e-4, atol=1e-4)


def test_a_model_quantised_by_another_library_is_refused_naming_the_layer():
    """GPTQ / AWQ / bitsandbytes layers and torchao's tensor subclasses hold packed layouts egraft does not read:
    one clear error naming the layer and what to do, before any tracing."""
    import egraft

    class QuantLinear(torch.nn.Module):  # as auto-gptq names its layer
        def __init__(self):
            super().__init__()
            self.register_buffer("qweight", torch.zeros(8, 8, dtype=torch.int32))

        def forward(self, x):
            return x

    QuantLinear.__module__ = "auto_gptq.nn_modules.qlinear.qlinear_cuda"
    with pytest.raises(InputError, match=r"'1' is auto_gptq\..*QuantLinear.*quantize='int8' or quantize='int4'"):
        egraft.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), QuantLinear()))

    class Packed(torch.Tensor):  # a tensor subclass from a quantiser's module (torchao's weights are such)
        pass

    Packed.__module__ = "torchao.dtypes.affine_quantized_tensor"
    layer = torch.nn.Linear(8, 8)
    layer.register_buffer("packed", torch.zeros(4).as_subclass(Packed))
    with pytest.raises(InputError, match=r"'0.packed' is torchao\."):
        egraft.compile(torch.nn.Sequential(layer))
    qm, _ = quantize(_mlp(), "int8")  # egraft's own quantised layers are not foreign; quantising twice is refused
    with pytest.raises(InputError, match="quantised already"):
        egraft.compile(qm, quantize="int8")
