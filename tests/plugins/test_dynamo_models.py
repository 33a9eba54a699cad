"""``torch.compile(model, backend="egraft")`` on every reference workload of ``egraft.models``.

Each compiled model must match eager PyTorch (float32, norm-relative error
under 1e-4) on its first inputs and on fresh ones of the same shapes, with
no fallback warning: every op of these models lowers, so the whole graph is
compiled by egraft.
"""

from __future__ import annotations

import pytest
import torch

import egraft
from egraft.models import MODELS
from egraft.plugins.dynamo import egraft_backend
from egraft.testing import fresh_seed, rel_err
from plugin_helpers import FAST, check_compiled


@pytest.mark.parametrize("name", sorted(MODELS))
def test_workload(name):
    seed = fresh_seed()
    spec = MODELS[name]
    model = spec.build("tiny", seed=seed % 1000)
    inputs = [spec.example_inputs(model, seed=seed), spec.example_inputs(model, seed=seed + 1)]
    assert check_compiled(model, inputs, seed=seed) == []


def test_whole_graph_is_compiled_by_egraft():
    """The backend hands the whole graph to egraft: one search, weights bound, only the model's input left."""
    seed = fresh_seed()
    model, (x,) = egraft.models.make("gated_mlp", size="tiny", seed=seed % 1000)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(egraft_backend(gm, example_inputs, options=FAST))
        return graphs[-1]

    with torch.no_grad():
        got = torch.compile(model, backend=capture)(x)
        want = model(x)
    assert rel_err(got.numpy(), want.numpy()) < 1e-4
    (graph,) = graphs
    (entry,) = graph.entries.values()
    assert entry.run is not None and not entry.fallback_ops
    (res,) = graph.results
    assert len(res.graph.input_names()) == 1, "the parameters Dynamo lifted to inputs must be bound as weights"
    bound = sorted(tuple(w.shape) for w in res.graph.weights.values())
    assert bound == sorted(tuple(p.shape) for p in model.parameters())
