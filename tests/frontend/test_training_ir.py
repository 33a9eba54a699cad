"""``frontend.training_ir``: torch.export's graph lowered as it is gives the graph ``run_decompositions`` gives.

The tracer keeps the exported graph (no second trace) when it can make its
in-place updates functional, and decomposes each node at lowering the way
``run_decompositions`` would.  The proof it is the same program: the IR
graph's structural hash (every node, its inputs, the outputs and which
output overwrites which state) and signature equal those of the old path
(``EGRAFT_DECOMPOSE=1``), on the generation step of transformers families
(symbolic sizes, lowered at several chunks, one row and two), on every model
of the zoo, and on in-place updates of buffers and intermediates.  Where
``prepare`` refuses (a write through a view, a view read after a write) the
tracer decomposes as before, and the graph is still right.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.export import Dim

import egraft
from egraft.frontend import training_ir
from egraft.frontend.tracer import decomposition_table, export_program, lower_program
from egraft.ir.evaluate import evaluate
from egraft.models import MODELS

sys.path.insert(0, str(Path(__file__).parents[1] / "generation"))
from family_models import FACTORIES, tiny_family  # noqa: E402

# in CI: families with in-place updates of intermediates (olmo's clamp_, falcon's add_), ALiBi (bloom), a sliding
# window (gemma2), learned positions (gpt2), rotary GQA (llama, one row; two rows with -m slow); every family
# with -m slow
CI_FAMILIES = ("gpt2", "olmo", "falcon", "bloom", "gemma2")


def _both(model, args, **kw):
    """(the exported graph kept, the decomposed one) of the same export."""
    kept = export_program(model, args, **kw)
    decomposed = export_program(model, args, decompositions=decomposition_table(), **kw)
    assert training_ir.is_prepared(kept) and not training_ir.is_prepared(decomposed)
    return kept, decomposed


def _same(a, b, what):
    assert a.signature == b.signature, what
    assert a.structural_hash() == b.structural_hash(), f"{what}: the kept graph lowers otherwise than the decomposed"


def _step_family(name, rows, quantize=None):
    from egraft.frontend.causal_lm import step_module
    from egraft.frontend.quantize import quantize as quantized

    model = tiny_family(name)
    if quantize is not None:
        model, _ = quantized(model, quantize, 32 if quantize == "int4" else None)
    step = step_module(model, rows, 64)
    chunk = {1: Dim("chunk", min=1, max=max(step.spec.chunks))}
    kept, decomposed = _both(step, step.example_inputs(4, None, rows), dynamic_shapes=(chunk, chunk, None))
    for c in (1, 4, 16):
        shapes = [x.shape for x in step.example_inputs(c, None, rows)]
        _same(lower_program(kept, shapes=shapes), lower_program(decomposed, shapes=shapes),
              f"{name} step, {rows} row(s), chunk {c}")


@pytest.mark.parametrize("name,rows", [("llama", 1)] + [(n, 2) for n in CI_FAMILIES])
def test_generation_steps_lower_to_the_decomposed_graph(name, rows):
    _step_family(name, rows)


@pytest.mark.parametrize("mode", ["int8", "int4", "w8a8"])
def test_quantised_steps_lower_to_the_decomposed_graph(mode):
    _step_family("llama", 2, quantize=mode)  # (egraft's quantised layers: custom ops and integer weights)


@pytest.mark.slow
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("name", sorted(set(FACTORIES) - {"gpt_neo"}))  # (GPT-Neo's local attention is refused)
def test_every_family_lowers_to_the_decomposed_graph(name, rows):
    _step_family(name, rows)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_models_lower_to_the_decomposed_graph(name):
    spec = MODELS[name]
    model = spec.build("tiny", seed=0).eval()
    args = spec.example_inputs(model, batch=2, seq=8, seed=0)
    kept, decomposed = _both(model, args)
    _same(lower_program(kept), lower_program(decomposed), name)


class _Counter(torch.nn.Module):
    """A buffer written in place twice (a running count), an intermediate written in place, a scatter."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.register_buffer("count", torch.zeros(3, 6))
        self.register_buffer("cache", torch.zeros(3, 8, 6))

    def forward(self, x, pos):
        h = self.lin(x)
        h.mul_(2.0).clamp_(min=-1.0)
        self.count.add_(h)
        self.cache.scatter_(1, pos[:, :, None].expand(3, pos.shape[1], 6), h[:, None, :].expand(3, pos.shape[1], 6))
        self.count.mul_(0.5)
        return self.cache.sum(1) + self.count


def test_in_place_updates_become_state_and_read_their_new_values():
    torch.manual_seed(0)
    model = _Counter().eval()
    x, pos = torch.randn(3, 6), torch.tensor([[1, 4], [0, 2], [7, 3]])
    kept, decomposed = _both(model, (x, pos))
    g = lower_program(kept)
    _same(g, lower_program(decomposed), "in-place updates")
    assert sorted(g.aliases.values()) == ["cache", "count"]
    count, cache = torch.randn(3, 6), torch.randn(3, 8, 6)
    want_model = _Counter().eval()
    want_model.load_state_dict({**model.state_dict(), "count": count.clone(), "cache": cache.clone()})
    with torch.no_grad():
        want = want_model(x, pos)
    order = {n: k for k, n in enumerate(g.input_names())}
    feed = {"x": x.numpy(), "pos": pos.numpy(), "count": count.numpy(), "cache": cache.numpy()}
    got = evaluate(g, [feed[n] for n in sorted(order, key=order.get)])
    outs = {g.aliases[k]: got[k] for k in g.aliases}
    np.testing.assert_allclose(outs["count"], want_model.count.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs["cache"], want_model.cache.numpy(), rtol=1e-5, atol=1e-6)
    (own,) = [v for k, v in enumerate(got) if k not in g.aliases]
    np.testing.assert_allclose(own, want.numpy(), rtol=1e-5, atol=1e-6)


class _ThroughView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(4, 6))

    def forward(self, x):
        self.buf[:, :3].copy_(x)  # a write through a view: it reaches the buffer
        return self.buf * 2


class _ViewReadAfter(torch.nn.Module):
    def forward(self, x):
        h = x + 1
        v = h[:, :2]  # a view taken before the write...
        h.mul_(3)
        return v + 0  # ...and read after it: it sees the write


class _ViewOfViewReadAfter(torch.nn.Module):
    def forward(self, x):
        h = x + 1
        a, b = h.split([2, 3], dim=1)  # views through a list (split, then getitem)...
        h.mul_(3)
        return a + b.sum(1, keepdim=True)  # ...read after the write


@pytest.mark.parametrize("model,x", [(_ThroughView(), torch.randn(4, 3)), (_ViewReadAfter(), torch.randn(4, 5)),
                                     (_ViewOfViewReadAfter(), torch.randn(4, 5))],
                         ids=["write-through-a-view", "view-read-after-a-write", "view-of-a-view-read-after"])
def test_writes_prepare_cannot_rewrite_are_decomposed_and_still_right(model, x):
    ep = export_program(model, (x,))
    assert not training_ir.is_prepared(ep)
    g = lower_program(ep)
    state = [n for n in g.input_names() if n != "x"]
    feed = {"x": x.numpy(), **{n: torch.zeros(4, 6).numpy() for n in state}}
    got = evaluate(g, [feed[n] for n in g.input_names()])
    with torch.no_grad():
        want = model(x)
    own = [v for k, v in enumerate(got) if k not in g.aliases]
    np.testing.assert_allclose(own[0], want.numpy(), rtol=1e-6)


def test_egraft_decompose_turns_it_off(monkeypatch):
    monkeypatch.setenv(training_ir.ENV_VAR, "1")
    model = MODELS["mlp"].build("tiny", seed=0)
    assert not training_ir.is_prepared(export_program(model, MODELS["mlp"].example_inputs(model, seed=0)))


def test_an_unsupported_op_inside_a_decomposition_names_the_model_line():
    class Spectral(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()  # rfft decomposes to _fft_r2c, complex: not lowerable

    with pytest.raises(egraft.errors.UnsupportedOpError) as info:
        egraft.trace(Spectral(), (torch.randn(2, 8),))
    assert "_fft_r2c" in info.value.op and "torch.fft.rfft(x)" in str(info.value)


def test_a_node_torch_cannot_trace_alone_falls_back_to_the_whole_programs_decomposition(monkeypatch):
    import torch.fx.experimental.proxy_tensor as proxy_tensor

    torch.manual_seed(0)
    model = _Counter().eval()
    args = (torch.randn(3, 6), torch.tensor([[1, 4], [0, 2], [7, 3]]))
    kept, decomposed = _both(model, args)

    def refuse(*a, **k):
        raise RuntimeError("no trace of this op alone")

    monkeypatch.setattr(proxy_tensor, "make_fx", refuse)
    _same(lower_program(kept), lower_program(decomposed), "the fallback")
