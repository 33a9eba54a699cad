"""A dynamic size through the egraft Dynamo backend: padded to a few bucket sizes, or PyTorch with one warning.

What is checked: the ladder; a graph whose rows are independent compiles
once per bucket (not per size), the second and later buckets without a
search, and every size matches eager PyTorch; a graph whose rows meet (or
that uses its size as a number) runs in PyTorch with ONE warning that says
why and names the way in; ``dynamic="per_size"`` keeps compiling each size;
a Hugging Face dynamic-cache ``generate`` no longer compiles at every step.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from egraft.models import hf
from egraft.plugins.buckets import bucket, ladder
from egraft.plugins.dynamo import egraft_backend
from egraft.search import engine
from egraft.testing import fresh_seed, rel_err
from plugin_helpers import FAST, fallback_messages


def test_ladder():
    assert ladder(300)[:8] == [1, 2, 4, 8, 16, 24, 32, 40]
    sizes = ladder(300)
    assert 256 in sizes and sizes[sizes.index(256) + 1] == 272 and sizes[-1] == 304
    assert [bucket(n) for n in (1, 2, 3, 5, 9, 17, 250, 257)] == [1, 2, 4, 8, 16, 24, 256, 272]
    assert bucket(5, (4, 16)) == 16 and bucket(17, (4, 16)) is None and bucket(0) is None


def _capture(options):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(egraft_backend(gm, example_inputs, options=options))
        return graphs[-1]

    return backend, graphs


def _run(compiled, model, sizes, d=8):
    g = torch.Generator().manual_seed(fresh_seed())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in sizes:
            x = torch.randn(n, d, generator=g) * 3
            with torch.no_grad():
                got, want = compiled(x), model(x)
            assert got.shape == want.shape and rel_err(got.numpy(), want.numpy()) < 1e-5, n
    return fallback_messages(caught)


class RowNorm(nn.Module):
    """An MLP over tokens with an RMS norm over the last axis: rows never meet."""

    def __init__(self, d=8):
        super().__init__()
        self.a, self.b = nn.Linear(d, 16), nn.Linear(16, d)

    def forward(self, x):
        h = self.b(nn.functional.silu(self.a(x)))
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)


class RopePiece(nn.Module):
    """A vLLM-like piece over flattened tokens: RMSNorm, rotary embedding from a cos/sin cache indexed by each
    token's position, a gated MLP.  Its head dim (8) is also a bucket size."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.h, self.hd = heads, d // heads
        inv = 1.0 / 10000 ** (torch.arange(0, self.hd, 2).float() / self.hd)
        t = torch.arange(64).float()[:, None] * inv[None]
        self.register_buffer("cos_sin", torch.cat([t.cos(), t.sin()], -1))
        self.w = nn.Parameter(torch.rand(d) + 0.5)
        self.gu, self.o, self.q = nn.Linear(d, 64, bias=False), nn.Linear(32, d, bias=False), nn.Linear(d, d)

    def forward(self, positions, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        q = self.q(h).view(-1, self.h, self.hd)
        cos, sin = self.cos_sin.index_select(0, positions).chunk(2, -1)
        q1, q2 = q.chunk(2, -1)
        q = torch.cat([q1 * cos[:, None] - q2 * sin[:, None], q2 * cos[:, None] + q1 * sin[:, None]], -1)
        g, u = self.gu(h).chunk(2, -1)
        return x + self.o(nn.functional.silu(g) * u), q.flatten(1)


class SelfAttention(nn.Module):
    """Every row attends to every row: padding would change the real rows."""

    def __init__(self, d=8):
        super().__init__()
        self.q = nn.Linear(d, d)

    def forward(self, x):
        return torch.softmax(self.q(x) @ x.T, dim=-1) @ x


class SizeAsValue(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.a = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.a(x)) * x.shape[0]


def test_independent_rows_compile_once_per_bucket(monkeypatch):
    torch.manual_seed(fresh_seed())
    model = RowNorm().eval()
    backend, graphs = _capture(FAST)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    assert _run(compiled, model, [2, 3]) == []
    (graph,) = graphs
    assert graph.compiles == 2 and sorted(graph._buckets.compiled) == [2, 4], "size 2 exactly, 3 padded to 4"

    def no_search(*a, **k):
        raise AssertionError("a later bucket must not search")

    monkeypatch.setattr(engine, "search", no_search)  # buckets after the first reuse its winner
    assert _run(compiled, model, [5, 7, 3, 8, 11, 2]) == []
    assert sorted(graph._buckets.compiled) == [2, 4, 8, 16] and graph.compiles == 4
    first, *later = graph._buckets.compiled.values()
    assert first.done.searched and not any(b.done.searched for b in later)
    assert all(b.done.result.backend == first.done.result.backend for b in later)


def test_rope_piece_with_positions_is_bucketed():
    seed = fresh_seed()
    torch.manual_seed(seed)
    model = RopePiece().eval()
    backend, graphs = _capture(FAST)
    compiled = torch.compile(model, backend=backend)
    g = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 6, 8, 9, 13):  # 8: a bucket size called exactly, with inputs marked dynamic
            x, pos = torch.randn(n, 16, generator=g), torch.randint(0, 64, (n,), generator=g)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(pos, 0)
            with torch.no_grad():
                got, want = compiled(pos, x), model(pos, x)
            for a, b in zip(got, want):
                assert a.shape == b.shape and rel_err(a.numpy(), b.numpy()) < 1e-5, n
    assert fallback_messages(caught) == []
    (graph,) = graphs
    assert sorted(graph._buckets.compiled) == [4, 8, 16] and graph.compiles == 3
    assert graph._buckets.probed == "", "bucket 8 (the head dim) was proven at a probe size"


@pytest.mark.parametrize("model,why", [(SelfAttention(), "rows meet"), (SizeAsValue(), "used as a number")])
def test_mixed_rows_run_in_pytorch_with_one_warning(model, why):
    torch.manual_seed(fresh_seed())
    model.eval()
    backend, graphs = _capture(FAST)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    messages = _run(compiled, model, [3, 5, 6, 9])
    assert len(messages) == 1, messages
    assert why in messages[0] and 'cache_implementation="static"' in messages[0] and "per_size" in messages[0]
    assert sum(g.compiles for g in graphs) == 0


def test_per_size_keeps_compiling_each_size():
    torch.manual_seed(fresh_seed())
    model = SelfAttention().eval()
    backend, graphs = _capture({**FAST, "dynamic": "per_size", "max_shapes": 2})
    messages = _run(torch.compile(model, backend=backend, dynamic=True), model, [3, 5, 6])
    (graph,) = graphs
    assert graph.compiles == 2 and len(messages) == 2 and "max_shapes" in messages[1]


def test_configured_ladder():
    torch.manual_seed(fresh_seed())
    model = RowNorm().eval()
    backend, graphs = _capture({**FAST, "dynamic": [6, 12]})
    messages = _run(torch.compile(model, backend=backend, dynamic=True), model, [2, 5, 7, 13])
    (graph,) = graphs
    assert sorted(graph._buckets.compiled) == [6, 12]
    assert len(messages) == 1 and "above every bucket size" in messages[0]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_dynamic_cache_generate_does_not_compile_per_step(kind):
    """2 layers, hidden 64, prompt 5, 8 new tokens: the tokens equal eager, and a handful of compiles."""
    seed = fresh_seed()
    model, _ = hf.build(kind, layers=2, hidden=64, lm_head=True, seed=seed % 1000)
    model.config.use_cache = True
    ids = torch.randint(1, 97, (1, 5), generator=torch.Generator().manual_seed(seed))
    args = dict(max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, **args)
    backend, graphs = _capture(FAST)
    model.forward = torch.compile(model.forward, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = model.generate(ids, **args)
    assert torch.equal(got, want)
    compiles = sum(g.compiles for g in graphs)
    assert compiles <= 3, f"{compiles} compiles for 8 decode steps"
    dynamic = [m for m in fallback_messages(caught) if "cannot pad" in m]
    assert len(dynamic) <= 1 and all('cache_implementation="static"' in m for m in dynamic)


def test_bert_with_a_dynamic_batch_is_bucketed():
    """Rows along the batch: attention runs within each sequence, the linears merge batch and sequence."""
    seed = fresh_seed()
    model, _ = hf.build("bert", layers=1, attn_implementation="sdpa", seed=seed % 1000)
    backend, graphs = _capture(FAST)
    compiled = torch.compile(model, backend=backend)
    g = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b in (2, 3, 5):
            ids = torch.randint(0, 97, (b, 7), generator=g)
            with torch.no_grad():
                got, want = hf.flat_outputs(compiled(ids)), hf.flat_outputs(model(ids))
            for x, y in zip(got, want):
                assert x.shape == y.shape and rel_err(x.numpy(), y.numpy()) < 1e-5, b
    assert fallback_messages(caught) == []
    dynamic = [gr for gr in graphs if gr._buckets is not None]
    assert len(dynamic) == 1 and sorted(dynamic[0]._buckets.compiled) == [4, 8]
