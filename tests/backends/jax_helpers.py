"""Shared checks for the JAX backend tests: lower, run on random inputs, compare with ir.evaluate."""

from __future__ import annotations

import numpy as np
from conformance import draw

from egraft.backends import lower
from egraft.ir import evaluate
from egraft.testing import assert_close


def inputs_for(graph, rng, positive=(), index_ranges=None):
    """Random inputs; names in `positive` get |x| + 0.5, `index_ranges[name] = n` draws from [0, n)."""
    domains = {**{n: "positive" for n in positive}, **(index_ranges or {})}
    return [draw(shape, dt, rng, domains.get(name))
            for name, (shape, dt) in zip(graph.input_names(), graph.input_types())]


def check_graph(graph, seed, knobs=None, tol=None, positive=(), index_ranges=None, what=""):
    """The JAX executable of `graph` matches the reference on fresh random inputs."""
    rng = np.random.default_rng(seed)
    ins = inputs_for(graph, rng, positive, index_ranges)
    ex = lower(graph, "jax", "cpu", knobs)
    got = ex(*ins)
    want = evaluate(graph, ins)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} seed={seed}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    assert_close(got, want, [d for _, d in graph.output_types()], tol=tol, what=f"{what} (seed={seed}, knobs={knobs})")
    return ex


def jaxpr_primitives(ex) -> set:
    """Names of every primitive in an executable's jaxpr, nested jaxprs included."""
    names = set()

    def walk(jaxpr):
        for e in jaxpr.eqns:
            names.add(e.primitive.name)
            for p in e.params.values():
                if hasattr(p, "jaxpr"):
                    walk(p.jaxpr if hasattr(p.jaxpr, "eqns") else p.jaxpr.jaxpr)

    walk(ex.jaxpr().jaxpr)
    return names
