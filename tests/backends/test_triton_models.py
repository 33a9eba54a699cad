"""egraft.models workloads (tiny sizes) traced with egraft.trace, through the Triton backend.

Checked against both eager PyTorch and ir.evaluate (float32, 1e-4 relative).
Runs in Triton's interpreter unless EGRAFT_TEST_DEVICE=cuda.
"""

from __future__ import annotations

import pytest
from triton_helpers import DEVICE, require_mode

import torch

import egraft
from egraft.backends import lower
from egraft.ir import evaluate
from egraft.models import MODELS
from egraft.testing import fresh_seed, rel_err

TOL = 1e-4
# the attention / MLP workloads of the brief, plus the rest of the registry
NAMES = sorted(MODELS)


def _check(name, knobs=None, batch=None, seq=None):
    require_mode()
    seed = fresh_seed()
    spec = MODELS[name]
    model = spec.build("tiny", seed=seed % 1000)
    args = spec.example_inputs(model, batch=batch, seq=seq, seed=seed % 1000)
    g = egraft.trace(model, args)
    ex = lower(g, "triton", DEVICE, knobs or {})
    dev_args = [a.to(DEVICE) for a in args]
    got = ex(*dev_args)
    with torch.no_grad():
        want = model(*args)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    ref = evaluate(g, [a.numpy() for a in args])
    for k, (a, b, r) in enumerate(zip(got, want, ref)):
        assert isinstance(a, torch.Tensor) and tuple(a.shape) == tuple(b.shape)
        a = a.cpu().numpy()
        e_torch, e_ref = rel_err(a, b.numpy()), rel_err(a, r)
        assert e_torch <= TOL and e_ref <= TOL, (
            f"{name} output {k}: rel err vs eager {e_torch:.3g}, vs evaluate {e_ref:.3g} (seed={seed}, knobs={knobs})")
    return ex


@pytest.mark.parametrize("name", NAMES)
def test_model_matches_eager_and_evaluate(name):
    ex = _check(name, batch=1 if name != "mlp" else 2, seq=4)
    assert ex.kernels, "no kernels generated"

# Traced graphs write attention in primitives; the Attention idiom (and Triton's attention kernel)
# is reached through saturation + extraction: tests/backends/test_extractions.py checks it.
