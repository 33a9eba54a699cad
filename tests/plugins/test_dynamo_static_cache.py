"""transformers' compiled-generation recipe through the egraft Dynamo backend.

``model.forward = torch.compile(model.forward, backend="egraft")`` and
``generate(..., cache_implementation="static")``: the prefill graph (which
creates the caches) and the decode graph (which writes them in place with
``index_copy_`` and moves ``cumulative_length`` on with ``add_``) are both
compiled by egraft, once each for all 64 steps, with the inputs they write
as ``state`` written back into the caller's tensors in place
(``egraft.plugins.state``); the tokens equal eager transformers with a
static and with a dynamic cache.  The small modules below check the state
write-back itself: the caller's tensors updated, in place for the torch
backend, by a copy for JAX, and a module buffer Dynamo passes in.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch import nn

from egraft.backends import candidates
from egraft.models import hf
from egraft.plugins.dynamo import EgraftFallbackWarning, egraft_backend
from egraft.plugins.state import Stateful
from egraft.testing import fresh_seed, rel_err
from plugin_helpers import FAST, fallback_messages

NEW = 64


def _capture(options):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(egraft_backend(gm, example_inputs, options=options))
        return graphs[-1]

    return backend, graphs


def _model(kind: str, seed: int):
    model, _ = hf.build(kind, layers=2, hidden=64, lm_head=True, positions=128, seed=seed % 1000)
    model.config.use_cache = model.generation_config.use_cache = True
    model.generation_config.eos_token_id = None  # all NEW tokens, never an early stop
    return model


def _prompt(batch: int, length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 97, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row, pad in enumerate([0, 2, length - 1][:batch] if batch > 1 else []):  # left padding, one row all but one
        mask[row, :pad] = 0
        ids[row, :pad] = 0
    return ids, mask


# two cases by default (both models, both prompt lengths, a left-padded batch of 3; ~25 s each on one core,
# mostly Dynamo's capture, torch.export and the two 1 s searches); the rest of the cross with -m slow
DEFAULT = {("gpt2", 17, 3), ("llama", 3, 3)}
CASES = [pytest.param(kind, length, batch, marks=() if (kind, length, batch) in DEFAULT else pytest.mark.slow)
         for kind in ("gpt2", "llama") for length in (3, 17) for batch in (1, 3)]


@pytest.mark.parametrize("kind,length,batch", CASES)
def test_static_cache_generate_compiles_prefill_and_decode(kind, length, batch):
    seed = fresh_seed()
    model = _model(kind, seed)
    ids, mask = _prompt(batch, length, seed)
    args = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want_static = model.generate(ids, **args, cache_implementation="static")
        want_dynamic = model.generate(ids, **args)
    assert torch.equal(want_static, want_dynamic)
    backend, graphs = _capture({"budget": "1s"})
    eager_forward = model.forward
    compiled = torch.compile(eager_forward, backend=backend)
    caches = []  # per forward call: the data pointers of every layer's key and value cache

    @functools.wraps(eager_forward)
    def forward(*a, **kw):
        out = compiled(*a, **kw)
        cache = kw.get("past_key_values") or out.past_key_values
        caches.append(tuple((layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers))
        return out

    model.forward = forward
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = model.generate(ids, **args, cache_implementation="static")
            again = model.generate(ids, **args, cache_implementation="static")
    assert not [w for w in caught if issubclass(w.category, EgraftFallbackWarning)], fallback_messages(caught)
    assert torch.equal(got, want_static) and torch.equal(again, want_static)
    assert got.shape == (batch, length + NEW)
    # two Dynamo graphs (prefill, decode), each compiled by egraft once for all steps and both calls
    assert len(graphs) == 2 and [g.compiles for g in graphs] == [1, 1], [g.compiles for g in graphs]
    for g in graphs:
        (entry,) = g.entries.values()
        assert isinstance(entry.run, Stateful) and entry.run.writes
        assert entry.run.copies == 0 and entry.results[0].backend == "torch"  # written in place, never copied
    decode = graphs[1]
    assert decode.entries and all(k[0][1] == (batch, 1) for k in decode.entries)  # input_ids of one token
    # the caches the prefill created are the ones every decode step wrote: same memory over each generate
    assert len(caches) == 2 * NEW and len(set(caches[:NEW])) == 1 and len(set(caches[NEW:])) == 1


def test_a_prompt_past_half_the_cache_with_layers_searched_once():
    """Three layers: the search takes one layer block, cut out of the prefill graph with the first position as a
    scalar input; its check inputs must write the prompt's 40 slots inside the 64-slot cache (drawn from [0, 64)
    the start wrote past the end and the compile failed: IRError 'Scatter index out of range')."""
    seed = fresh_seed()
    model, _ = hf.build("gpt2", layers=3, hidden=64, lm_head=True, positions=64, seed=seed % 1000)
    model.config.use_cache = model.generation_config.use_cache = True
    model.generation_config.eos_token_id = None
    ids, mask = _prompt(1, 40, seed)
    args = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                cache_implementation="static", max_cache_len=64)
    with torch.no_grad():
        want = model.generate(ids, **args)
    backend, graphs = _capture({"budget": "1s"})
    model.forward = torch.compile(model.forward, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = model.generate(ids, **args)
    assert not [w for w in caught if issubclass(w.category, EgraftFallbackWarning)], fallback_messages(caught)
    assert torch.equal(got, want)
    assert [g.compiles for g in graphs] == [1, 1]


def test_dynamic_cache_generate_gives_the_tokens_and_names_the_static_cache():
    seed = fresh_seed()
    model = _model("llama", seed)
    ids, mask = _prompt(1, 5, seed)
    args = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, **args)
    backend, graphs = _capture(FAST)
    model.forward = torch.compile(model.forward, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = model.generate(ids, **args)
    assert torch.equal(got, want)
    messages = fallback_messages(caught)
    assert len(messages) <= 1 and all('cache_implementation="static"' in m for m in messages), messages


# --- the write-back, on small modules -------------------------------------------------------------

class CacheStep(nn.Module):
    """A one-row KV-cache write at a position kept in a counter, both inputs updated in place."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, cache, count):
        pos = torch.arange(1) + count
        cache.index_copy_(1, pos, self.proj(x))
        count.add_(1)
        return (cache * 2.0).sum(1)


def _step_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 1, 8, generator=g), torch.randn(2, 6, 8, generator=g), torch.tensor(1)


@pytest.mark.parametrize("backend_name", ["auto", "jax"])
def test_inputs_written_in_place_and_equal_to_eager(backend_name):
    seed = fresh_seed()
    torch.manual_seed(seed)
    model = CacheStep().eval()
    backend, graphs = _capture({**FAST, "backend": backend_name})
    compiled = torch.compile(model, backend=backend)
    x, cache, count = _step_inputs(seed)
    mine, ref = (cache.clone(), count.clone()), (cache.clone(), count.clone())
    ptr = mine[0].data_ptr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            for _ in range(3):  # the counter moves each call: three different rows written
                got, want = compiled(x, *mine), model(x, *ref)
                assert rel_err(got.numpy(), want.numpy()) < 1e-5
                assert rel_err(mine[0].numpy(), ref[0].numpy()) < 1e-5 and int(mine[1]) == int(ref[1])
                x = x + 1.0
    assert fallback_messages(caught) == [] and int(mine[1]) == 4 and mine[0].data_ptr() == ptr
    (graph,) = graphs
    assert graph.compiles == 1
    (entry,) = graph.entries.values()
    chosen = entry.results[0].backend
    if backend_name == "auto":  # on the CPU only the torch backend writes state in place
        assert chosen == "torch" and entry.run.copies == 0
    else:  # a backend named is used as asked: JAX returns new values, copied into the caller's tensors
        assert chosen == "jax" and entry.run.copies == 3 * 2


def test_measured_search_times_each_call_from_the_drawn_state():
    """The counter at the cache's last row: a timed call that started from the state an earlier call left
    would write past the cache (index out of range); the search restores the drawn state before each."""
    seed = fresh_seed()
    torch.manual_seed(seed)
    model = CacheStep().eval()
    backend, graphs = _capture({"budget": {"seconds": None, "trials": 4, "population": 2}, "fitness": "measured",
                                "limits": {"iterations": 2}})
    x, cache, _ = _step_inputs(seed)
    count = torch.tensor(cache.shape[1] - 1)
    mine, ref = (cache.clone(), count.clone()), (cache.clone(), count.clone())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got, want = torch.compile(model, backend=backend)(x, *mine), model(x, *ref)
    assert fallback_messages(caught) == [] and sum(g.compiles for g in graphs) == 1
    assert rel_err(got.numpy(), want.numpy()) < 1e-5 and rel_err(mine[0].numpy(), ref[0].numpy()) < 1e-5
    assert int(mine[1]) == int(ref[1]) == cache.shape[1]
    (entry,) = graphs[0].entries.values()
    assert entry.results[0].fitness == "measured" and entry.results[0].time_s > 0


class BufferStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x):
        self.total.add_(x)
        return x * 2.0


def test_a_module_buffer_dynamo_passes_in_is_written_back_too():
    """Dynamo lifts the buffer to a graph input: the graph writes it, and the module's own tensor is updated."""
    model = BufferStep().eval()
    backend, graphs = _capture(FAST)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, generator=torch.Generator().manual_seed(fresh_seed()))
    ptr = model.total.data_ptr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            outs = [compiled(x), compiled(x)]
    assert fallback_messages(caught) == []
    assert all(torch.equal(o, x * 2.0) for o in outs)
    assert rel_err(model.total.numpy(), (x + x).numpy()) < 1e-6 and model.total.data_ptr() == ptr
    assert sum(g.compiles for g in graphs) == 1


def test_candidates_for_state_keep_the_backends_that_write_in_place():
    assert candidates("auto", "cpu", state_in_place=True) == ["torch"]
    assert "jax" in candidates("auto", "cpu")
    assert candidates("jax", "cpu", state_in_place=True) == ["jax"]  # named: used as asked
    assert set(candidates("auto", "cuda", state_in_place=True)) == {"triton", "torch"}
