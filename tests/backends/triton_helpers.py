"""Shared setup for the Triton backend tests.

Importing this module selects the device: ``EGRAFT_TEST_DEVICE=cuda`` runs
the kernels on the GPU (bench/gpu_check.py does that); otherwise they run in
Triton's interpreter on the CPU, which needs ``TRITON_INTERPRET=1`` before
triton is first imported - set here, at import, before anything imports triton.
JAX does not read that variable, so JAX tests in the same process are unaffected.
"""

from __future__ import annotations

import os

DEVICE = os.environ.get("EGRAFT_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from egraft.backends import lower  # noqa: E402
from egraft.ir import evaluate  # noqa: E402
from egraft.testing import assert_close, fresh_seed, random_inputs  # noqa: E402


def require_mode():
    """Skip-free guard: fail loudly when triton was imported in the wrong mode for DEVICE."""
    from egraft.backends.triton import interpreter_active

    if DEVICE == "cpu" and not interpreter_active():
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; run pytest with TRITON_INTERPRET=1 "
                    "in the environment (or import tests/backends/triton_helpers.py first)")


def check(graph, inputs=None, knobs=None, seed=None, tol=None, rel=None):
    """Lower `graph` with Triton and compare against the reference interpreter.

    Returns the executable.  The seed is in every failure message.
    """
    seed = fresh_seed() if seed is None else seed
    ex = lower(graph, backend="triton", device=DEVICE, knobs=knobs or {})
    xs = inputs if inputs is not None else random_inputs(graph, seed)
    want = evaluate(graph, xs)
    got = ex(*xs)
    try:
        assert_close(got, want, [d for _, d in graph.output_types()], tol=tol)
    except AssertionError as e:
        raise AssertionError(f"{e} (seed={seed}, knobs={knobs})\n--- kernels ---\n{ex.sources()}") from None
    return ex


def rng(seed=None):
    seed = fresh_seed() if seed is None else seed
    return np.random.default_rng(seed), seed
