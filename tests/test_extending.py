"""docs/extending.md, run: every worked example there is executed as written.

Each ```python block runs in a fresh namespace, in document order; what a block
registers (a lowering rule, a backend) is removed afterwards, so the rest of the
suite never sees it.  The backend example is then put through the whole backend
conformance suite, as a real backend would be.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from egraft.backends.base import BACKENDS
from egraft.frontend.lowering import LOWERINGS
from egraft.ir import evaluate
from egraft.testing import assert_close, fresh_seed

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture
def registries():
    """Whatever an example registers is gone after it."""
    lowerings, backends = dict(LOWERINGS), dict(BACKENDS)
    yield
    LOWERINGS.clear()
    LOWERINGS.update(lowerings)
    BACKENDS.clear()
    BACKENDS.update(backends)


def _run(k: int) -> dict:
    namespace = {"__name__": f"extending_example_{k}"}
    exec(compile(BLOCKS[k], f"{DOC}:block{k}", "exec"), namespace)
    return namespace


def test_the_doc_has_the_three_examples():
    assert len(BLOCKS) == 3, f"docs/extending.md should hold 3 python examples, found {len(BLOCKS)}"


def test_example_lowering(registries):
    assert "aten.logcumsumexp" not in LOWERINGS, "egraft now lowers logcumsumexp: pick another op for the example"
    _run(0)
    assert "aten.logcumsumexp" in LOWERINGS


def test_example_rewrite_rule(registries):
    ns = _run(1)
    assert ns["SIN_ODD"].family == "algebra"


def test_example_backend_passes_the_conformance_suite(registries, monkeypatch):
    _run(2)
    assert "numpy" in BACKENDS
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent / "backends"))
    from conformance import all_cases

    from egraft.backends import lower

    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    for case in all_cases():
        graph = case.graph()
        inputs = case.inputs(graph, rng)
        got = lower(graph, "numpy", "cpu")(*inputs)
        assert_close(got, evaluate(graph, inputs), [d for _, d in graph.output_types()], tol=case.tol,
                     what=f"{case.name} on the example numpy backend (seed={seed})")
