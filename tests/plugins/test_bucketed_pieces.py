"""A split graph with a dynamic size: its egraft pieces padded to bucket sizes, the op left to PyTorch at n rows.

The model stands in for vLLM's mode-2 graph: a lowerable MLP + RMSNorm over
tokens ``[n, d]``, a custom op egraft cannot lower (vLLM's attention), then
another lowerable piece.  What is checked, for sizes 2..11 marked dynamic:
every output equals eager PyTorch; each piece is searched once (later
buckets reuse its winner), one compile per bucket touched (not per size);
the custom op sees exactly the real rows; weights updated in place are seen; a piece whose rows meet (a mean
over the tokens) is compiled per size, not padded, and stays correct.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from egraft.plugins import stats
from egraft.plugins.dynamo import egraft_backend
from egraft.search import engine
from egraft.testing import fresh_seed, rel_err
from plugin_helpers import FAST, fallback_messages

SEEN: list[tuple[int, ...]] = []  # the shapes the custom op was called with


@torch.library.custom_op("egraft_test::rowwise", mutates_args=())
def rowwise(x: torch.Tensor) -> torch.Tensor:
    """A rowwise op egraft has no lowering for (an erfinv of a squashed value), recording the shapes it sees."""
    SEEN.append(tuple(x.shape))
    return torch.special.erfinv(torch.tanh(x) * 0.9)


@rowwise.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("egraft_test::rowwise_at", mutates_args=())
def rowwise_at(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """vLLM's attention stand-in with positions: its fake gives Dynamo no relation of pos's size to x's."""
    SEEN.append(tuple(x.shape))
    assert pos.shape[0] == x.shape[0]
    return torch.special.erfinv(torch.tanh(x + pos[:, None].float() * 0.01) * 0.9)


@rowwise_at.register_fake
def _(x, pos):
    return torch.empty_like(x)


class Layer(nn.Module):
    """MLP + RMSNorm (piece 1), the custom op, a linear + residual (piece 2; `mix`: minus its mean over tokens)."""

    def __init__(self, d=8, mix=False):
        super().__init__()
        self.mix = mix
        self.a, self.b, self.c = nn.Linear(d, 16), nn.Linear(16, d), nn.Linear(d, d)
        self.w = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        h = x + self.b(nn.functional.silu(self.a(x)))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        h = rowwise(h)
        out = self.c(h) + x
        return out - out.mean(0, keepdim=True) if self.mix else out


def _compile(model, options):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(egraft_backend(gm, example_inputs, options=options))
        return graphs[-1]

    return torch.compile(model, backend=backend), graphs


def _run(compiled, model, sizes, d=8):
    g = torch.Generator().manual_seed(fresh_seed())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in sizes:
            x = torch.randn(n, d, generator=g) * 2
            torch._dynamo.mark_dynamic(x, 0)
            with torch.no_grad():
                want = model(x)
                SEEN.clear()
                got = compiled(x)
            assert SEEN and all(s == (n, d) for s in SEEN), (n, SEEN)  # the PyTorch op saw the real rows only
            assert got.shape == want.shape and rel_err(got.numpy(), want.numpy()) < 1e-5, n
    return fallback_messages(caught)


def _count_searches(monkeypatch) -> list:
    calls, search = [], engine.search

    def counted(*a, **k):
        calls.append(1)
        return search(*a, **k)

    monkeypatch.setattr(engine, "search", counted)
    return calls


def test_pieces_are_padded_to_buckets_and_searched_once(monkeypatch):
    torch.manual_seed(fresh_seed())
    model = Layer().eval()
    compiled, graphs = _compile(model, {**FAST, "cache": False})
    searches = _count_searches(monkeypatch)
    stats.reset()
    messages = _run(compiled, model, range(2, 12))
    (graph,) = graphs
    pieces = graph._pieces
    assert pieces is not None and not pieces.per_size, pieces.per_size
    assert sorted({s for s, _ in pieces.slots}) == [2, 4, 8, 16]  # the buckets of 2..11
    assert len(searches) == 2, "each of the two pieces is searched once, at the first bucket"
    assert graph.compiles == 4, "one compile per bucket touched, not one per size"
    counts = stats.stats()
    assert counts["split"] == 4 and counts["pieces"] == 8 and counts["split_reused"] == 6, counts
    assert counts["eager"] == 0 and counts["calls"]["pytorch"] == 0
    assert all("rowwise" in m or "padded" in m for m in messages) and any("padded" in m for m in messages)
    assert len(graph.entries) == 10  # one entry per size, each running the bucket programs
    first = [pieces.first[k] for k in (0, 1)]
    later = [s.done for (size, k), s in pieces.slots.items() if s.done not in first]
    assert all(d.searched for d in first) and later and not any(d.searched for d in later)


def test_a_piece_whose_rows_meet_is_compiled_per_size(monkeypatch):
    torch.manual_seed(fresh_seed())
    model = Layer(mix=True).eval()
    compiled, graphs = _compile(model, {**FAST, "cache": False, "max_shapes": 16})
    searches = _count_searches(monkeypatch)
    sizes = [2, 3, 5, 6, 7, 9]
    messages = _run(compiled, model, sizes)
    (graph,) = graphs
    pieces = graph._pieces
    assert len(searches) == 2, "the per-size compiles reuse the piece's first winner"
    assert sorted(pieces.per_size[1]) == [3, 5, 6, 7, 9]  # the sizes the mixing piece compiled at on its own
    assert all("rows meet" in why for why in pieces.per_size[1].values())
    assert 0 not in pieces.per_size, "the MLP + RMSNorm piece is still padded"
    assert graph.compiles == len(sizes), "the mixing piece compiles at every size"
    assert any("compiled for each size" in m and "rows meet" in m for m in messages)


def test_updated_weights_are_seen_by_padded_pieces():
    torch.manual_seed(fresh_seed())
    model = Layer().eval()
    compiled, graphs = _compile(model, {**FAST, "cache": False})
    _run(compiled, model, [2, 3, 5])
    with torch.no_grad():
        model.b.weight.mul_(-1.5)  # in place: the bucket programs compiled with the old weights are dropped
        model.c.bias.add_(1.0)
    _run(compiled, model, [3, 6])
    (graph,) = graphs
    assert sorted({s for s, _ in graph._pieces.slots}) == [4, 8]


class WithPositions(Layer):
    def forward(self, x, pos):
        h = x + self.b(nn.functional.silu(self.a(x)))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return self.c(rowwise_at(h, pos)) + x


def test_two_size_symbols_equal_at_every_call_are_padded_together(monkeypatch):
    """vLLM's graph: token ids and positions each get a symbol (s72, s80); the pieces pad both."""
    torch.manual_seed(fresh_seed())
    model = WithPositions().eval()
    compiled, graphs = _compile(model, {**FAST, "cache": False})
    searches = _count_searches(monkeypatch)
    g = torch.Generator().manual_seed(fresh_seed())
    for n in (2, 3, 5, 6):
        x, pos = torch.randn(n, 8, generator=g), torch.randint(0, 100, (n,), generator=g)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(pos, 0)
        with torch.no_grad():
            want = model(x, pos)
            SEEN.clear()
            got = compiled(x, pos)
        assert SEEN and all(s == (n, 8) for s in SEEN)
        assert rel_err(got.numpy(), want.numpy()) < 1e-5, n
    (graph,) = graphs
    assert isinstance(graph._buckets.plan.symbol, frozenset), "two symbols, as in vLLM's graph"
    assert sorted({s for s, _ in graph._pieces.slots}) == [2, 4, 8] and len(searches) == 2
    assert not graph._pieces.per_size and graph.compiles == 3
