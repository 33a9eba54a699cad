"""Whole models traced with egraft.trace and evaluated by the reference interpreter, against eager."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import transformers  # noqa: F401  (a required dev dependency: missing, this module fails to import)

import egraft
from egraft.ir import evaluate
from egraft.ir.evaluate import to_numpy
from egraft.models import MODELS, hf, make
from egraft.testing import fresh_seed, rel_err


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict) or hasattr(out, "values"):
        return [v for v in out.values() if v is not None]
    res = []
    for o in out:
        res.extend(_flat(o))
    return res


def _check(model, args, seed, tol=1e-4, kwargs=None):
    g = egraft.trace(model, args, kwargs)
    with torch.no_grad():
        want = _flat(model(*args, **(kwargs or {})))
    got = evaluate(g, [to_numpy(a) for a in args] + [to_numpy(v) for v in (kwargs or {}).values()
                                                       if isinstance(v, torch.Tensor)])
    assert len(got) == len(want), f"{len(got)} outputs, eager has {len(want)}"
    for k, (a, w) in enumerate(zip(got, want)):
        w = to_numpy(w)
        assert a.shape == w.shape and a.dtype == w.dtype, f"output {k}: {a.shape}:{a.dtype} vs {w.shape}:{w.dtype}"
        err = rel_err(a, w)
        assert err <= tol, f"output {k}: relative error {err:.3g} > {tol:g} (seed {seed})"
    return g


@pytest.mark.parametrize("name", sorted(MODELS))
def test_registry_model(name):
    seed = fresh_seed()
    model, args = make(name, seed=seed)
    g = _check(model, args, seed)
    # weights are bound, named by their state_dict FQNs, and not copied into constants
    assert set(g.weight_names()) <= set(dict(model.named_parameters())) | set(dict(model.named_buffers()))
    assert set(dict(model.named_parameters())) <= set(g.weight_names()) | _unused_params(model, g)
    assert len(g.input_names()) == len(args)


def _unused_params(model, g):
    return {n for n, _ in model.named_parameters() if n not in g.weight_names()}


# --- Hugging Face transformers (tiny random configs, no downloads) ------------------------------

def _hf(kind: str, impl: str, seed: int):
    return hf.build(kind, attn_implementation=impl, seed=seed)[0]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
def test_transformers_model(kind, impl):
    seed = fresh_seed()
    model = _hf(kind, impl, seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (2, 7), generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = _check(model, (ids,), seed)
    assert graph.input_names() == ["input_ids"]
    assert "embeddings.word_embeddings.weight" in graph.weight_names() or "wte.weight" in graph.weight_names() \
        or "embed_tokens.weight" in graph.weight_names()


def test_transformers_attention_mask_input():
    """A padding mask passed as a second tensor input (exercises mask-building ops and masked rows)."""
    seed = fresh_seed()
    model = _hf("llama", "sdpa", seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (2, 6), generator=g)
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[1, :2] = 0  # left padding
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = _check(model, (ids, mask), seed)
    assert graph.input_names() == ["input_ids", "attention_mask"]


def test_bfloat16_model():
    seed = fresh_seed()
    model, args = make("llama_block", seed=seed)
    model = model.to(torch.bfloat16)
    args = tuple(a.to(torch.bfloat16) for a in args)
    g = _check(model, args, seed, tol=5e-2)
    w = g.weights[g.weight_names()[0]]
    assert w.dtype.name == "bfloat16"


def test_weights_are_snapshots():
    """Changing the model after tracing does not change the traced graph's bound weights."""
    seed = fresh_seed()
    torch.manual_seed(seed)
    lin = torch.nn.Linear(4, 3)
    g = egraft.trace(lin, (torch.randn(2, 4),))
    before = np.array(g.weights["weight"])
    with torch.no_grad():
        lin.weight.add_(1.0)
    assert np.array_equal(g.weights["weight"], before)
    assert not g.weights["weight"].flags.writeable
