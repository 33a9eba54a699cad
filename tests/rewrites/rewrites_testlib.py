"""Traced reference models for the rewrite tests (skipped with a reason when tracing is unavailable)."""

import functools

import pytest


@functools.lru_cache(maxsize=None)
def traced(name: str):
    import egraft

    if not hasattr(egraft, "trace"):
        pytest.skip("egraft.trace is not available yet (torch lowering not merged)")
    from egraft.models import make

    model, args = make(name)
    return egraft.trace(model, args)


def model_names():
    from egraft.models import MODELS

    return list(MODELS)
