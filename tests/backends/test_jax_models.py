"""Whole models end to end: egraft.trace -> JAX backend, against eager PyTorch (float32, 1e-4 relative)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import egraft
from egraft.backends import lower
from egraft.models import MODELS, hf
from egraft.models.hf import flat_outputs
from egraft.testing import fresh_seed, rel_err

TOL = 1e-4


def _check_model(model, args, kwargs=None, seed=None, knobs=None):
    g = egraft.trace(model, args, kwargs)
    ex = lower(g, "jax", "cpu", knobs)
    got = ex(*args)
    with torch.no_grad():
        want = flat_outputs(model(*args, **(kwargs or {})))
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
        assert ex.stats["peephole_dots"] + ex.stats["peephole_convs"] + ex.stats["panel_dots"] + ex.stats["kernel_dots"] >= 1


def test_model_with_library_idioms_off_and_default_precision():
    seed = fresh_seed()
    spec = MODELS["gpt2_block"]
    model = spec.build("tiny", seed=seed)
    _check_model(model, spec.example_inputs(model, seed=seed), seed=seed,
                 knobs={"idioms": "primitive", "precision": "default", "weights": "constants"})


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_transformers_models(name):
    seed = fresh_seed()
    model, kwargs = hf.build(name, lm_head=True, seed=seed)
    ids = torch.from_numpy(np.random.default_rng(seed).integers(0, 97, size=(2, 7)))
    _check_model(model, (ids,), kwargs, seed=seed)
