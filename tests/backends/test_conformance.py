"""Every conformance case on every backend matches ``ir.evaluate`` on random non-zero inputs.

The cases are written once (``conformance.py``, ``conformance_idioms.py``);
adding a backend means adding it to ``BACKENDS``.  Test ids are
``[<backend>-<case>]``, so ``pytest -k jax`` / ``-k triton`` select a backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import triton_helpers  # noqa: F401  (selects the Triton device / interpreter before triton is imported)
from conformance import all_cases

from egraft.backends import NAMES, lower
from egraft.ir import Group, evaluate
from egraft.testing import assert_close, fresh_seed


@dataclass(frozen=True)
class BackendUnderTest:
    name: str
    compile: Callable  # graph -> executable (callable on numpy inputs)


def _triton(graph):
    triton_helpers.require_mode()
    return lower(graph, "triton", triton_helpers.DEVICE)


BACKENDS = [
    BackendUnderTest("jax", lambda graph: lower(graph, "jax", "cpu")),
    BackendUnderTest("triton", _triton),
]
CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_case_matches_reference(backend, case):
    seed = fresh_seed()
    graph = case.graph()
    inputs = case.inputs(graph, np.random.default_rng(seed))
    want = evaluate(graph, inputs)
    ex = backend.compile(graph)
    got = ex(*inputs)
    what = f"{case.name} on {backend.name} (seed={seed})"
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} output {k}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    try:
        assert_close(got, want, [d for _, d in graph.output_types()], tol=case.tol, what=what)
    except AssertionError as e:
        sources = getattr(ex, "sources", None)
        raise AssertionError(f"{e}\n--- kernels ---\n{sources()}" if sources else str(e)) from None


def test_cases_cover_every_op():
    used = {n.op for c in CASES for n in c.graph().nodes}
    missing = sorted(Group.ALL - used)
    assert not missing, f"no conformance case uses {missing}: add cases to tests/backends/conformance*.py"


def test_cases_cover_every_float_dtype_of_every_unary_op():
    names = {c.name for c in CASES}
    missing = [f"unary_{op}_{dt}" for op in sorted(Group.UNARY) for dt in ("float32", "float16")
               if f"unary_{op}_{dt}" not in names]
    assert not missing, missing


def test_every_backend_is_under_test():
    assert sorted(b.name for b in BACKENDS) == sorted(NAMES), "add the new backend to BACKENDS"


def test_case_names_do_not_name_a_backend():
    clash = [c.name for c in CASES if any(b.name in c.name for b in BACKENDS)]
    assert not clash, f"case names must not contain a backend name (pytest -k selects by it): {clash}"
