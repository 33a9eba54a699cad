"""The tracer's Signature: roles from torch.export, the user's own names, state with its aliases, refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import egraft
from egraft.errors import UnsupportedOpError
from egraft.frontend import export_program, program_signature, require_pure
from egraft.rewrites import Limits, saturate
from egraft.ir.decompose import decompose
from egraft.models import make
from egraft.search import Space
from egraft.search.per_block import block_tasks, splice
from state_models import Counter


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))
        self.weight = torch.nn.Parameter(torch.ones(3))

    def forward(self, x, weight, mask=None):
        return self.lin(x) * self.scale * self.weight * weight + mask


def _args():
    return (torch.randn(2, 4), torch.randn(3)), {"mask": torch.randn(2, 3)}


def test_parameters_and_buffers_are_weights_and_inputs_keep_the_users_names():
    args, kwargs = _args()
    g = egraft.trace(WithBuffer(), args, kwargs)
    sig = g.signature
    # the forward's `weight` collides with the parameter `weight`: the graph input is renamed, its source is not
    assert [(s.name, s.source) for s in sig.call_inputs] == [("x", "x"), ("weight_", "weight"), ("mask", "mask")]
    assert {s.name: s.role for s in sig.inputs if s.role != "input"} == {
        "lin.weight": "weight", "lin.bias": "weight", "scale": "weight", "weight": "weight"}
    assert sig.key() == ((((2, 4)), "float32"), ((3,), "float32"), ((2, 3), "float32"))
    assert [(o.shape, o.dtype) for o in sig.outputs] == [((2, 3), "float32")] and sig.aliases == ()
    # the graph's own signature is the exported program's
    assert program_signature(export_program(WithBuffer(), args, kwargs)) == sig


def test_extraction_and_decomposition_keep_the_signature():
    args, kwargs = _args()
    g = egraft.trace(WithBuffer(), args, kwargs)
    sp = Space.from_egraph(saturate(g, limits=Limits(repeated_layers=False)))
    assert sp.greedy().signature == g.signature
    assert sp.sample(0).signature == g.signature
    assert decompose(g).signature == g.signature


def test_a_per_block_program_keeps_the_signature():
    model, args = make("gpt2_stack", size="tiny")
    g = egraft.trace(model, args)
    assert g.signature.sources() == ["x"]
    sat = saturate(g)
    tasks = block_tasks(sat)
    chosen = {t.key: t.space.build(t.space.random_choices(np.random.default_rng(0))) for t in tasks}
    assert splice(g, sat.parts, chosen).signature == g.signature


def test_a_mutated_buffer_is_state_aliased_to_its_update():
    sig = program_signature(export_program(Counter(), (torch.randn(3),)))
    assert sig["n"].role == "state" and sig["n"].source is None
    assert [s.name for s in sig.call_inputs] == ["x"]
    assert sig.aliases == ((0, "n"),) and len(sig.outputs) == 2  # the new n, then x * 2
    assert (sig.outputs[0].shape, sig.outputs[0].dtype) == ((3,), "float32")
    with pytest.raises(UnsupportedOpError, match="in-place update of buffer 'n' inside a torch.compile graph"):
        require_pure(sig)  # the torch.compile backend's refusal
    g = egraft.trace(Counter(), (torch.randn(3),))
    assert g.signature == sig and g.state_names() == ["n"] and g.aliases == {0: "n"}


class Step(torch.nn.Module):
    def forward(self, x, cache):
        cache.mul_(2)
        return x + 1


def test_a_mutated_input_is_state_with_its_source():
    step = Step()
    sig = program_signature(export_program(step, (torch.randn(2),), {"cache": torch.randn(2, 2)}))
    assert [s.name for s in sig.call_inputs] == ["x"]
    assert (sig["cache"].role, sig["cache"].source, sig["cache"].shape) == ("state", "cache", (2, 2))
    assert sig.aliases == ((0, "cache"),)
    g = egraft.trace(step, (torch.randn(2),), {"cache": torch.randn(2, 2)})
    assert g.signature == sig and g.input_names() == ["x", "cache"]
