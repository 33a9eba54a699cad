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


# --- the one pipeline under every entry point -------------------------------------------------------

def _mlp():
    torch.manual_seed(fresh_seed())
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).eval()


def _config(**kw):
    from egraft.search.config import CompileConfig

    return CompileConfig.parse({"fitness": "model", "budget": {"seconds": None, "trials": 3, "population": 2},
                                "limits": {"iterations": 2}, "cache": False, "progress": False, **kw})


def test_compile_signature_hands_out_the_searched_executable_checked_against_the_reference():
    from egraft.search.pipeline import compile_signature

    model, x = _mlp(), torch.randn(3, 8)
    graph = egraft.trace(model, (x,))
    sets = [[x], [torch.randn(3, 8)]]
    done = compile_signature(graph, _config(), reference=model, check_sets=sets)
    assert done.executable is done.result.executable  # the search's own executable, not a second lowering
    assert done.check["sets"] == 2 and done.check["max_error"] <= min(done.check["tolerances"])
    with torch.no_grad():
        assert rel_err(done.executable(x)[0].numpy(), model(x).numpy()) < 1e-4
    assert compile_signature(graph, _config(validate=False), reference=model, check_sets=sets).check is None


def test_a_reference_the_program_disagrees_with_is_a_validation_error():
    from egraft.errors import ValidationError
    from egraft.search.pipeline import compile_signature

    model, x = _mlp(), torch.randn(3, 8)
    graph = egraft.trace(model, (x,))
    with pytest.raises(ValidationError, match="on fresh random inputs .* differs from eager PyTorch"):
        compile_signature(graph, _config(), reference=lambda t: model(t) * (1 + (t.sum() != x.sum()) * 1e-3),
                          check_sets=[[x], [torch.randn(3, 8)]], against="eager PyTorch")


def test_one_config_error_for_every_entry_point():
    """A misspelt option is the same one error, naming the options, from egraft.compile, the Dynamo backend
    (options and $EGRAFT_DYNAMO_OPTIONS) and the config itself."""
    from egraft.errors import InputError
    from egraft.plugins.dynamo import egraft_backend
    from egraft.search.config import ENV_VAR, CompileConfig

    model = torch.nn.Linear(4, 4)
    for call in (lambda: egraft.compile(model, budgt=3),
                 lambda: egraft_backend(None, [], {"budgt": 3}),
                 lambda: CompileConfig.parse({"budgt": 3})):
        with pytest.raises(InputError, match=r"unknown option\(s\) 'budgt'; the options are device, backend, budget"):
            call()
    import os

    os.environ[ENV_VAR] = '{"budgt": 3}'
    try:
        with pytest.raises(InputError, match="unknown option.*'budgt'"):
            egraft_backend(None, [], None)
    finally:
        del os.environ[ENV_VAR]
