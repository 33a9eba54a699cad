"""The public stage contract (docs/architecture.md), end to end, by its public names.

trace -> evaluate -> saturate -> Space (greedy / sample / extract) -> backends.lower,
each checked against eager PyTorch or the float64 reference on fresh random inputs.
"""

import numpy as np
import pytest
import torch

import egraft
from egraft.testing import assert_close, fresh_seed, rel_err


@pytest.mark.parametrize("name", ["gated_mlp", "gpt2_block"])
def test_stages_by_public_names(name):
    seed = fresh_seed()
    model, inputs = egraft.models.make(name, size="tiny", seed=seed % 1000)
    with torch.no_grad():
        want = model(*inputs).numpy()

    g = egraft.trace(model, inputs)
    assert isinstance(g, egraft.ir.Graph)
    (got,) = egraft.ir.evaluate(g, [x.numpy() for x in inputs])
    assert rel_err(got, want) < 1e-4, f"seed {seed}"

    res = egraft.rewrites.saturate(g)
    sp = egraft.search.Space.from_egraph(res)
    x64 = [x.double().numpy() for x in inputs]
    ref64 = egraft.ir.evaluate(g, x64, dtype=np.float64)
    rng = np.random.default_rng(seed)
    for cand in (sp.greedy(), sp.sample(rng), sp.extract(sp.random_choices(rng))):
        assert_close(egraft.ir.evaluate(cand, x64, dtype=np.float64), ref64, tol=1e-9, what=f"extraction (seed {seed})")

    ex = egraft.backends.lower(sp.greedy(), backend="jax", device="cpu")
    (out,) = ex(*inputs)  # torch in -> torch out
    assert isinstance(out, torch.Tensor)
    assert rel_err(out.numpy(), want) < 1e-4, f"seed {seed}"
