"""Every conformance case on every backend matches ``ir.evaluate`` on random non-zero inputs.

Float32 outputs are held to the error budget derived from the graph
(``egraft.testing.tolerance_for``: a few ulps per op on the path plus ``n * eps``
per reduction of length n), not to a flat tolerance.

The cases are written once (``conformance.py``, ``conformance_idioms.py``)
and run on every backend of egraft (``egraft.backends.NAMES``, one per
package of ``egraft/backends/``), on ``cpu`` unless ``SETUP`` says how a
backend is set up for its tests (Triton: ``triton_helpers.DEVICE``, the GPU
or the interpreter), so a new backend is under test without an edit here.  Test ids are
``[<backend>-<case>]``, so ``pytest -k jax`` / ``-k triton`` / ``-k torch`` select a backend.
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


def _on_cpu(name: str) -> Callable:
    return lambda graph: lower(graph, name, "cpu")


SETUP = {"triton": _triton}  # backend -> how its tests lower a graph (default: on cpu)
BACKENDS = [BackendUnderTest(name, SETUP.get(name) or _on_cpu(name)) for name in NAMES]
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
        assert_close(got, want, [d for _, d in graph.output_types()], tol=case.tol, what=what, graph=graph)
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
    from egraft.backends import registered

    own = {n: b for n, b in registered().items() if n in NAMES}
    assert sorted(b.name for b in BACKENDS) == sorted(own) == sorted(NAMES), "a backend of egraft does not import"
    assert set(SETUP) <= set(NAMES), f"SETUP names backends egraft does not have: {sorted(set(SETUP) - set(NAMES))}"


def test_case_names_do_not_name_a_backend():
    clash = [c.name for c in CASES if any(b.name in c.name for b in BACKENDS)]
    assert not clash, f"case names must not contain a backend name (pytest -k selects by it): {clash}"


def test_float32_tolerances_are_derived_from_the_graph():
    """A few ulps per op plus n*eps per reduction of length n (egraft.testing's docstring), never the old flat 1e-4."""
    from egraft.ir import GraphBuilder
    from egraft.testing import FLOOR_ULPS, SUM_ULPS, ULPS_PER_OP, eps, tolerance_for

    b = GraphBuilder()
    x = b.input("x", (3, 40), "float32")
    g = b.build([x.recip(), x.recip().exp2(), x.sum(1), x.T + 0.0, x.cast("float16"), x.max(1)])
    e = eps("float32")
    assert tolerance_for(g, 0) == ULPS_PER_OP * e
    assert tolerance_for(g, 1) == 2 * ULPS_PER_OP * e
    assert tolerance_for(g, 2) == (ULPS_PER_OP + SUM_ULPS * 40) * e
    assert tolerance_for(g, 3) == ULPS_PER_OP * e
    assert tolerance_for(g, 4) >= 1e-2  # half types keep their flat tolerance
    assert tolerance_for(g, 5) == FLOOR_ULPS * e  # a max selects: exact
    from egraft.measure import output_tolerances  # every output at once: the same numbers
    assert output_tolerances(g) == {k: tolerance_for(g, k) for k in range(6)}
    i = b.input("i", (3,), "int64")
    gi = b.build([x.sum(1), i])
    assert output_tolerances(gi) == {0: tolerance_for(gi, 0), 1: 0.0}
    f32 = [c.graph() for c in CASES]
    f32 = [g for g in f32 if not {n.dtype for n in g.nodes} & {"float16", "bfloat16"}]  # half paths: eps of half
    worst = max(tolerance_for(g, k) for g in f32 for k, (_, dt) in enumerate(g.output_types()) if dt == "float32")
    assert worst < 1e-4, worst


def test_a_quantiser_of_an_inexact_value_carries_the_stated_lossy_bound_and_nothing_else_does():
    """A Cast to int8 of a computed float (w8a8's rounding of an activation) may flip a whole quantum between two
    programs: every output after it gets LOSSY_BOUND.  Its negative controls stay exact-or-ulps: an input cast to
    int8 (no error to flip on), and a computed float cast to int64 (positions: whole numbers)."""
    from egraft.ir import GraphBuilder
    from egraft.measure.tolerances import LOSSY_BOUND
    from egraft.testing import FLOOR_ULPS, ULPS_PER_OP, eps, tolerance_for

    b = GraphBuilder()
    x = b.input("x", (3, 40), "float32")
    quantised = (x * 3.0).cast("int8").cast("float32")
    g = b.build([quantised * 2.0, x.cast("int8").cast("float32"), (x * 3.0).cast("int64").cast("float32")])
    e = eps("float32")
    assert LOSSY_BOUND <= tolerance_for(g, 0) <= LOSSY_BOUND + 4 * ULPS_PER_OP * e
    assert tolerance_for(g, 1) == FLOOR_ULPS * e
    assert tolerance_for(g, 2) < 1e-5
