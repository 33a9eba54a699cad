"""The step exports (egraft's torch.export + core ATen) with the caches as mutated buffers written by
aten.scatter, and the exported program computes what the eager step does, state included."""

from __future__ import annotations

import collections

import torch
from gen_helpers import MAX_LENGTH

from egraft.frontend.causal_lm import export_step


def test_export_shows_caches_as_buffer_mutations(built):
    step = built.step
    ep = export_step(step, 4)
    names = [s.name for s in step.spec.state]
    mutated = [o.target for o in ep.graph_signature.output_specs if o.kind.name == "BUFFER_MUTATION"]
    assert mutated == names
    ops = collections.Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")
    assert ops["aten.scatter.src"] == len(names)
    assert not [o for o in ops if "index_put" in o or "copy_" in o or o.endswith("_.src")]
    # run the exported program against the eager step on random tokens over a cache holding random K/V
    g = torch.Generator().manual_seed(17)
    ids = torch.randint(0, 97, (step.spec.max_batch, 4), generator=g)
    lengths = torch.tensor([0, 5, 30, MAX_LENGTH - 4])[: step.spec.max_batch]
    pos = lengths[:, None] + torch.arange(4)[None, :]
    mask = torch.arange(step.spec.full_context)[None, :] < (lengths + 4)[:, None]  # max_length slots are read
    start = [torch.randn(s.shape, generator=g) for s in step.spec.state]
    mod = ep.module()
    for s, x in zip(step.spec.state, start):
        getattr(mod, s.name).copy_(x)
    got = mod(ids, pos, mask)
    eager_state = [x.clone() for x in start]
    want, _ = built.programs.programs[(4, MAX_LENGTH, step.spec.max_batch)](ids, pos, mask, *eager_state)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for s, x, x0 in zip(step.spec.state, eager_state, start):
        torch.testing.assert_close(getattr(mod, s.name), x, rtol=1e-5, atol=1e-5)
        written = (x != x0).any(dim=(1, 3))  # [batch, slot]: the slots the call wrote
        assert torch.equal(written, (torch.arange(step.spec.cache_len)[None] >= lengths[:, None]) & (
            torch.arange(step.spec.cache_len)[None] < (lengths + 4)[:, None]))


def test_step_tracer_exports_once_per_family_and_gives_each_buckets_own_graph(built, monkeypatch):
    """StepTracer: one torch.export per family (every bucket of one row; decode / chunk of more rows), each
    bucket's graph the same as a torch.export at the bucket's own sizes (structural hash, weights bound by name),
    the one-row decode step's included."""
    from egraft.frontend import causal_lm
    from egraft.frontend.tracer import export_program, lower_program

    step = built.step
    calls = []
    real = causal_lm.export_program
    monkeypatch.setattr(causal_lm, "export_program", lambda *a, **k: calls.append(k) or real(*a, **k))
    tracer = causal_lm.StepTracer(step)
    buckets = step.spec.buckets()
    graphs = {b: tracer(b) for b in buckets}
    assert len(calls) == len({causal_lm.family(b) for b in buckets}) == 3  # 1 row; decode and chunk of 4 rows
    assert all(k.get("dynamic_shapes") for k in calls)
    one_row_decode = next(b for b in buckets if b.chunk == 1 and b.rows == 1)
    for b in [buckets[0], buckets[-1], one_row_decode, next(b for b in buckets if b.chunk == 16 and b.rows == 1)]:
        own = lower_program(export_program(step, step.example_inputs(*b)))
        assert graphs[b].structural_hash() == own.structural_hash(), b
        assert sorted(graphs[b].weights) == sorted(own.weights)


def test_step_tracer_exports_a_bucket_at_its_own_sizes_when_the_shared_export_fails(built, monkeypatch):
    from egraft.errors import TraceError
    from egraft.frontend import causal_lm

    step = built.step
    real = causal_lm.export_program

    def no_symbolic(*a, dynamic_shapes=None, **k):
        if dynamic_shapes is not None:
            raise TraceError("torch.export could not capture it: a guard on the chunk size")
        return real(*a, **k)

    monkeypatch.setattr(causal_lm, "export_program", no_symbolic)
    said = []
    tracer = causal_lm.StepTracer(step, status=said.append)
    b = step.spec.buckets()[-1]
    g = tracer(b)
    assert any("failed" in s and "its own sizes" in s for s in said), said
    assert tracer.exports[causal_lm.family(b)] is None
    assert [s.shape for s in g.signature.call_inputs] == [tuple(a.shape) for a in step.example_inputs(*b)]


def test_step_tracer_exports_one_rows_decode_and_chunk_buckets_apart_when_their_export_fails(built, monkeypatch):
    """A step whose chunk cannot run from 1 symbolically (a guard on chunk == 1): its one-row buckets get one
    export for decoding and one for the others, each bucket's graph still its own-size export's."""
    from egraft.errors import TraceError
    from egraft.frontend import causal_lm
    from egraft.frontend.tracer import export_program, lower_program

    step = built.step
    real = causal_lm.export_program
    calls = []

    def no_chunk_from_one(*a, dynamic_shapes=None, **k):
        chunk = (dynamic_shapes or (None,))[0]
        calls.append(chunk)
        if chunk and chunk[1].min == 1:
            raise TraceError("torch.export could not capture it: a guard on chunk == 1")
        return real(*a, dynamic_shapes=dynamic_shapes, **k)

    monkeypatch.setattr(causal_lm, "export_program", no_chunk_from_one)
    said = []
    tracer = causal_lm.StepTracer(step, status=said.append)
    buckets = [b for b in step.spec.buckets() if b.rows == 1]
    graphs = {b: tracer(b) for b in buckets}
    assert any("failed" in s and "decode and chunk buckets apart" in s for s in said), said
    assert len(calls) == 3  # the family's (failed), then its decode and chunk halves
    assert tracer.exports[causal_lm.family(buckets[0])] is None
    for b in [buckets[0], buckets[-1]]:
        own = lower_program(export_program(step, step.example_inputs(*b)))
        assert graphs[b].structural_hash() == own.structural_hash(), b


def test_one_row_decode_with_context_buckets_lowers_to_its_own_exports_graph(built):
    """With context buckets (the context symbolic too), every one-row decode bucket's graph from the family's one
    export is the graph of its own export."""
    from egraft.frontend import causal_lm
    from egraft.frontend.tracer import export_program, lower_program
    from gen_helpers import CHUNKS, MAX_LENGTH

    step = causal_lm.step_module(built.model, 1, MAX_LENGTH, CHUNKS, contexts=(32,), check=False)
    tracer = causal_lm.StepTracer(step)
    decode = [b for b in step.spec.buckets() if b.chunk == 1]
    assert {b.context for b in decode} == {32, step.spec.full_context}
    for b in decode:
        own = lower_program(export_program(step, step.example_inputs(*b)))
        assert tracer(b).structural_hash() == own.structural_hash(), b
    assert len(tracer.exports) == 1
