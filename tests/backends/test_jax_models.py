"""Whole models end to end: egraft.trace -> JAX backend, against eager PyTorch (float32, 1e-4 relative)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import egraft  # noqa: E402
from egraft.backends import lower  # noqa: E402
from egraft.models import MODELS  # noqa: E402
from egraft.testing import fresh_seed, rel_err  # noqa: E402

TOL = 1e-4


def _trace():
    try:
        return egraft.trace
    except AttributeError:
        pytest.skip("egraft.trace is not available yet (the torch front end is being written)")


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for t in out if isinstance(t, torch.Tensor)]


def _check_model(model, args, kwargs=None, seed=None, knobs=None):
    g = _trace()(model, args, kwargs)
    ex = lower(g, "jax", "cpu", knobs)
    got = ex(*args)
    with torch.no_grad():
        want = _flat(model(*args, **(kwargs or {})))
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        assert isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        e = rel_err(a.numpy(), b.numpy())
        assert e <= TOL, f"output {k}: relative error {e:.3g} > {TOL} (seed={seed}, knobs={knobs})"
    assert ex.stats["view_gathers"] == 0, "a model view fell back to a gather"
    return ex


@pytest.mark.parametrize("name", sorted(MODELS))
def test_egraft_models(name):
    seed = fresh_seed()
    spec = MODELS[name]
    model = spec.build("tiny", seed=seed)
    args = spec.example_inputs(model, seed=seed)
    ex = _check_model(model, args, seed=seed)
    if name not in ("mlp",):  # every other workload multiplies matrices (or convolves) inside a block
        assert ex.stats["peephole_dots"] + ex.stats["peephole_convs"] >= 1


def test_model_with_library_idioms_off_and_default_precision():
    seed = fresh_seed()
    spec = MODELS["gpt2_block"]
    model = spec.build("tiny", seed=seed)
    _check_model(model, spec.example_inputs(model, seed=seed), seed=seed,
                 knobs={"idioms": "primitive", "precision": "default", "weights": "constants"})


def _hf(name, seed):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=32,
                                      bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(cfg).eval(), {"use_cache": False}
    if name == "llama":
        cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                                       max_position_embeddings=32, bos_token_id=0, eos_token_id=0)
        return transformers.LlamaForCausalLM(cfg).eval(), {"use_cache": False}
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=97, max_position_embeddings=32)
    return transformers.BertModel(cfg).eval(), {}


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_transformers_models(name):
    seed = fresh_seed()
    model, kwargs = _hf(name, seed)
    ids = torch.from_numpy(np.random.default_rng(seed).integers(0, 97, size=(2, 7)))
    _check_model(model, (ids,), kwargs, seed=seed)
