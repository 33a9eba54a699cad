"""Sanity tests for the reference workloads in eager PyTorch (no egraft tracing here)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from egraft.models import MODELS, WorkloadSpec, get, make
from egraft.models.attention import Attention, attention_mask
from egraft.models.gpt2_block import gpt2_stack
from egraft.models.resnet_block import resnet_block

REQUIRED = {"mlp", "gpt2_block", "gpt2_stack", "llama_block", "resnet_block", "rmsnorm_linear",
            "lora_linear", "gated_mlp", "gqa_attention", "qknorm_attention", "mask_attention"}


# expected output shape given the (tiny) inputs
def _expected_shape(name: str, model: torch.nn.Module, args: tuple[torch.Tensor, ...]):
    x = args[0]
    if name == "mlp":
        return (x.shape[0], model.layers[-1].out_features)
    if name == "resnet_block":
        out_ch = model.conv1.out_channels
        stride = model.conv1.stride[0]
        return (x.shape[0], out_ch, x.shape[2] // stride, x.shape[3] // stride)
    if name in ("rmsnorm_linear",):
        return (*x.shape[:-1], model.proj.out_features)
    if name == "lora_linear":
        return (*x.shape[:-1], model.weight.shape[0])
    return tuple(x.shape)


def test_registry_has_required_workloads():
    assert REQUIRED <= set(MODELS)
    for name, spec in MODELS.items():
        assert isinstance(spec, WorkloadSpec) and spec.name == name
        assert spec.description
    with pytest.raises(KeyError, match="unknown workload"):
        get("no_such_model")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tiny_model_runs_finite_with_expected_shape(name):
    model, args = make(name)
    assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(isinstance(a, torch.Tensor) for a in args)
    with torch.no_grad():
        y = model(*args)
    assert y.dtype == torch.float32
    assert tuple(y.shape) == _expected_shape(name, model, args)
    assert torch.isfinite(y).all()
    assert y.abs().mean() > 1e-3  # not degenerate


@pytest.mark.parametrize("name", sorted(MODELS))
def test_deterministic_given_seed(name):
    spec = MODELS[name]
    state = torch.random.get_rng_state()
    m1, m2, m3 = spec.build(seed=3), spec.build(seed=3), spec.build(seed=4)
    assert torch.equal(state, torch.random.get_rng_state()), "factory touched global RNG"
    for (k, p1), (_, p2), (_, p3) in zip(m1.state_dict().items(), m2.state_dict().items(),
                                         m3.state_dict().items()):
        assert torch.equal(p1, p2), k
    assert any(not torch.equal(a, b) for a, b in zip(m1.parameters(), m3.parameters()))
    a1 = spec.example_inputs(m1, seed=5)
    a2 = spec.example_inputs(m2, seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a1, a2))
    with torch.no_grad():
        assert torch.equal(m1(*a1), m2(*a2))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_batch_and_seq_are_honoured(name):
    spec = MODELS[name]
    model = spec.build()
    args = spec.example_inputs(model, batch=3, seq=4)
    assert args[0].shape[0] == 3
    if name != "mlp":
        assert args[0].shape[2 if name == "resnet_block" else 1] == 4
    with torch.no_grad():
        assert torch.isfinite(model(*args)).all()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bench_presets_are_consistent(name):
    """Bench sizes are accepted by the constructor (built on the meta device: no memory)."""
    spec = MODELS[name]
    assert set(spec.bench) == set(spec.tiny)
    assert set(spec.bench_inputs) == set(spec.tiny_inputs) == {"batch", "seq"}
    with torch.device("meta"):
        model = spec.build("bench")
    assert next(model.parameters()).device.type == "meta"
    with pytest.raises(ValueError):
        spec.sizes("huge")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_bench_size_runs(name):
    model, args = make(name, size="bench")
    with torch.no_grad():
        assert torch.isfinite(model(*args)).all()


def test_gpt2_stack_bench_is_gpt2_small_shape():
    spec = MODELS["gpt2_stack"]
    assert spec.bench["n_layers"] == 12 and spec.bench["hidden"] == 768
    assert spec.bench["heads"] == 12


def test_gpt2_stack_with_token_embeddings():
    model = gpt2_stack(n_layers=1, hidden=16, heads=2, vocab=50, max_positions=32)
    args = MODELS["gpt2_stack"].example_inputs(model, batch=2, seq=5)
    assert args[0].dtype == torch.int64
    with torch.no_grad():
        y = model(*args)
    assert y.shape == (2, 5, 16) and torch.isfinite(y).all()


def test_llama_attention_is_gqa_with_rotary():
    model = MODELS["llama_block"].build()
    attn = model.self_attn
    assert attn.kv_heads < attn.heads and attn.rope
    assert attn.kv_expand == "expand"  # the gqa_attention workload covers repeat_interleave
    assert attn.inv_freq.shape == (attn.head_dim // 2,)


@pytest.mark.parametrize("kv_expand", ["repeat_interleave", "expand"])
def test_kv_expansions_agree(kv_expand):
    ref = MODELS["gqa_attention"].build(kv_expand="repeat_interleave")
    other = MODELS["gqa_attention"].build(kv_expand=kv_expand)
    (x,) = MODELS["gqa_attention"].example_inputs(ref)
    with torch.no_grad():
        torch.testing.assert_close(ref(x), other(x))


def test_gqa_matches_explicit_softmax_attention():
    model = MODELS["gqa_attention"].build()
    (x,) = MODELS["gqa_attention"].example_inputs(model)
    b, s, _ = x.shape
    h, kv, d = model.heads, model.kv_heads, model.head_dim
    with torch.no_grad():
        q = model.q_proj(x).view(b, s, h, d).transpose(1, 2)
        k = model.k_proj(x).view(b, s, kv, d).transpose(1, 2)
        v = model.v_proj(x).view(b, s, kv, d).transpose(1, 2)
        # head i uses kv head i // (h // kv)
        k, v = k[:, torch.arange(h) // (h // kv)], v[:, torch.arange(h) // (h // kv)]
        scores = q @ k.transpose(-1, -2) / d**0.5
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h * d)
        torch.testing.assert_close(model(x), model.o_proj(o))


def test_bool_and_additive_masks_agree_and_matter():
    m_bool = MODELS["mask_attention"].build()
    m_add = MODELS["mask_attention_additive"].build()
    x, mask_b = MODELS["mask_attention"].example_inputs(m_bool)
    _, mask_a = MODELS["mask_attention_additive"].example_inputs(m_add)
    assert mask_b.dtype == torch.bool and mask_a.dtype == torch.float32
    assert torch.equal(mask_a == 0, mask_b)
    assert mask_b.any(-1).all(), "a fully masked row would give NaN"
    with torch.no_grad():
        y_b, y_a = m_bool(x, mask_b), m_add(x, mask_a)
        torch.testing.assert_close(y_b, y_a)
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        assert not torch.allclose(y_b, m_bool(x, causal.expand_as(mask_b)))
    with pytest.raises(ValueError):
        attention_mask(2, 4, "sparse", torch.Generator())
    with pytest.raises(ValueError):
        m_bool(x)  # mask required


def test_qknorm_normalises_per_head():
    model = MODELS["qknorm_attention"].build()
    assert model.q_norm is not None and model.q_norm.weight.shape == (model.head_dim,)


def test_resnet_block_bn_is_not_identity_and_identity_shortcut():
    model = MODELS["resnet_block"].build()
    bn = model.bn1
    assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert model.downsample is not None
    same = resnet_block(in_channels=8, out_channels=8, stride=1)
    assert same.downsample is None
    x = torch.randn(1, 8, 6, 6)
    with torch.no_grad():
        assert same(x).shape == (1, 8, 6, 6)


def test_lora_adapter_contributes():
    model = MODELS["lora_linear"].build()
    (x,) = MODELS["lora_linear"].example_inputs(model)
    assert model.lora_B.abs().sum() > 0
    with torch.no_grad():
        base = F.linear(x, model.weight)
        merged = F.linear(x, model.weight + (model.lora_A @ model.lora_B).T * model.scaling)
        y = model(x)
    assert not torch.allclose(y, base)
    torch.testing.assert_close(y, merged, rtol=1e-4, atol=1e-4)


def test_rmsnorm_is_explicit_formula():
    model = MODELS["rmsnorm_linear"].build()
    (x,) = MODELS["rmsnorm_linear"].example_inputs(model)
    norm = model.norm
    with torch.no_grad():
        ref = F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)
        torch.testing.assert_close(norm(x), ref)


def test_invalid_configs_raise():
    with pytest.raises(ValueError):
        Attention(30, 4)
    with pytest.raises(ValueError):
        Attention(32, 4, 3)
    with pytest.raises(ValueError):
        Attention(32, 4, kv_expand="tile")
    with pytest.raises(ValueError):
        MODELS["mlp"].example_inputs(MODELS["mlp"].build(), size="huge")
