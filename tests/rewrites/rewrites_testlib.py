"""Traced reference models for the rewrite tests."""

import functools

import egraft


@functools.lru_cache(maxsize=None)
def traced(name: str):
    from egraft.models import make

    model, args = make(name)
    return egraft.trace(model, args)


def model_names():
    from egraft.models import MODELS

    return list(MODELS)
