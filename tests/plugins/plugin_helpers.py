"""Shared pieces of the plugin tests: fast backend options and the compiled-vs-eager check."""

from __future__ import annotations

import warnings

import torch

from egraft.models import hf
from egraft.plugins.dynamo import EgraftFallbackWarning
from egraft.testing import rel_err

# the cost model, two trials, two rewrite iterations: these tests check the plumbing, not the search
FAST = {"fitness": "model", "budget": {"seconds": None, "trials": 2, "population": 2}, "limits": {"iterations": 2}}


def fallback_messages(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, EgraftFallbackWarning)]


def check_compiled(model, inputs: list[tuple], kwargs: dict | None = None, seed: int = 0, options=None) -> list[str]:
    """``torch.compile(model, backend="egraft")`` matches eager on every input set; returns the fallback warnings.

    Float32 outputs must be within 1e-4 norm-relative error of eager PyTorch,
    with the same dtypes and shapes.
    """
    kwargs = kwargs or {}
    compiled = torch.compile(model, backend="egraft", options=options or FAST)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for args in inputs:
            with torch.no_grad():
                want = hf.flat_outputs(model(*args, **kwargs))
                got = hf.flat_outputs(compiled(*args, **kwargs))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                assert rel_err(g.numpy(), w.numpy()) < 1e-4, f"seed {seed}"
    return fallback_messages(caught)
