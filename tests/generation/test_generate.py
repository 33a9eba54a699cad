"""Generation on the eager step programs gives transformers' generate tokens (greedy, seeded sampling, eos)."""

from __future__ import annotations

import pytest
import torch

from egraft.runtime.generation import StepPrograms, generate

from gen_helpers import EOS, FAMILIES, Built, left_padded


@pytest.mark.parametrize("lengths", [[3], [17], [60], [3, 17, 60]], ids=["3", "17", "60", "batch3"])
def test_greedy_matches_transformers(built, lengths):
    ids, mask = left_padded(lengths, seed=sum(lengths))
    kw = dict(max_new_tokens=64, do_sample=False, eos_token_id=None, pad_token_id=0)
    want = built.reference(ids, mask, **kw)
    got = generate(built.programs, built.step.state(), ids, mask, **kw)
    assert want.shape == (len(lengths), max(lengths) + 64)
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_with_eager_attention(family):
    """The same with attn_implementation="eager" (the additive mask goes through the model's own eager path)."""
    b = Built(family, attn="eager")
    assert b.model.config._attn_implementation == "eager"
    ids, mask = left_padded([3, 17, 60], seed=5)
    kw = dict(max_new_tokens=64, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(b.programs, b.step.state(), ids, mask, **kw), b.reference(ids, mask, **kw))


@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_sampling_matches_transformers(built, seed):
    ids, mask = left_padded([5, 17, 40], seed=100 + seed)
    kw = dict(max_new_tokens=48, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, eos_token_id=None,
              pad_token_id=0)
    torch.manual_seed(seed)
    want = built.reference(ids, mask, **kw)
    torch.manual_seed(seed)
    got = generate(built.programs, built.step.state(), ids, mask, **kw)
    assert torch.equal(got, want)
    g = torch.Generator().manual_seed(seed)  # an explicit generator draws the same as the seeded global one
    assert torch.equal(generate(built.programs, None, ids, mask, generator=g, **kw), want)


def test_sampling_defaults_are_the_models(built):
    """do_sample=True alone: transformers adds its default top_k=50; the step read it from generation_config."""
    assert built.step.spec.defaults.top_k == 50 and built.step.spec.defaults.eos_token_id == (EOS,)
    ids, mask = left_padded([9, 4], seed=7)
    torch.manual_seed(3)
    want = built.reference(ids, mask, max_new_tokens=40, do_sample=True, pad_token_id=0)
    torch.manual_seed(3)
    got = generate(built.programs, built.step.state(), ids, mask, max_new_tokens=40, do_sample=True, pad_token_id=0)
    assert torch.equal(got, want)


def test_eos_then_pad_and_early_stop(built):
    """Rows that hit an eos get pad after it; the loop stops when all rows have (as transformers does)."""
    ids, mask = left_padded([6, 11, 3], seed=11)
    free = generate(built.programs, built.step.state(), ids, mask, max_new_tokens=30, eos_token_id=None)
    new = free[:, ids.shape[1]:]
    # two eos tokens: the tokens the rows produce early, so rows finish at different steps
    eos = sorted({int(new[0, 2]), int(new[1, 5])})
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=96)
    want = built.reference(ids, mask, **kw)
    got = generate(built.programs, built.step.state(), ids, mask, **kw)
    assert torch.equal(got, want)
    tail = got[:, ids.shape[1]:]
    for row in tail[:2]:
        hits = [i for i, t in enumerate(row.tolist()) if t in eos]
        assert hits, "the row was built to produce an eos token"
        assert (row[hits[0] + 1:] == 96).all()
    if all(any(t in eos for t in row.tolist()) for row in tail):
        assert got.shape[1] < ids.shape[1] + 30  # every row finished: stopped early
    # sampled too, with the eos set
    kw = dict(max_new_tokens=30, do_sample=True, temperature=1.3, eos_token_id=eos, pad_token_id=96)
    torch.manual_seed(5)
    want = built.reference(ids, mask, **kw)
    torch.manual_seed(5)
    assert torch.equal(generate(built.programs, built.step.state(), ids, mask, **kw), want)


def test_mask_inferred_from_pad_tokens(built):
    """No attention_mask: inferred from pad tokens, as transformers does when pad is set and is no eos token."""
    ids, _ = left_padded([4, 13], seed=21, pad=0)
    kw = dict(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(built.programs, built.step.state(), ids, **kw), built.reference(ids, **kw))


def test_one_program_per_ladder_size(built):
    """A prompt of 60 on the ladder (1, 4, 16, 64) is one call of 64 with 4 columns of filler (StepSpec.plan), the
    other row's 17 tokens ride in it; then one call per token; the tokens are the model's."""
    spec = built.step.spec
    assert spec.chunks == (1, 4, 16, 64) and spec.cache_len == 128 + 64
    assert spec.plan(60) == [64] and spec.plan(17) == [16, 1] and spec.plan(64) == [64] and spec.plan(15) == [16]
    seen = []
    programs = type(built.programs)(spec, {b: (lambda p, t=b.chunk: lambda *a: (seen.append(t), p(*a))[1])(p)
                                           for b, p in built.programs.programs.items()})
    ids, mask = left_padded([60, 17], seed=3)
    kw = dict(max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)
    out = generate(programs, built.step.state(), ids, mask, **kw)
    assert seen == [64] + [1] * 4
    assert torch.equal(out, built.reference(ids, mask, **kw))


def test_plan_costs_no_more_than_the_exact_ladder():
    """Every plan feeds at least n tokens, carries filler only in its smallest chunk, never costs more than taking
    the largest chunk that fits each time (CALL_ROWS + T a call), and takes exact chunks where filler would cost
    as much (12 on 1, 4, 16: three calls of 4, not one of 16)."""
    from egraft.runtime.step_spec import CALL_ROWS, chunk_plan

    def cost(plan):
        return sum(CALL_ROWS + t for t in plan)

    for ladder in ((1, 4, 16, 64, 256), (1, 4, 16), (1, 2, 8, 32), (1,)):
        for n in range(1, 300):
            plan = chunk_plan(n, ladder)
            exact, m = [], n
            while m:
                exact.append(max(c for c in ladder if c <= m))
                m -= exact[-1]
            assert list(plan) == sorted(plan, reverse=True) and set(plan) <= set(ladder)
            assert 0 <= sum(plan) - n < plan[-1], (ladder, n, plan)
            assert cost(plan) <= cost(exact), (ladder, n, plan, exact)
    assert chunk_plan(12, (1, 4, 16)) == (4, 4, 4) and chunk_plan(3, (1, 4, 16)) == (4,)
    assert chunk_plan(2, (1, 4, 16)) == (1, 1) and chunk_plan(0, (1, 4)) == ()
    with pytest.raises(ValueError, match="holds 1"):
        chunk_plan(5, (4, 16))


def test_in_place_program_may_return_logits_alone(built):
    """A compiled step that updates its state in place may return just the logits; the loop is the same."""
    programs = type(built.programs)(built.step.spec, {b: (lambda p: lambda *a: p(*a)[0])(p)
                                                      for b, p in built.programs.programs.items()})
    ids, mask = left_padded([8, 2], seed=31)
    kw = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(programs, built.step.state(), ids, mask, **kw), built.reference(ids, mask, **kw))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_decode_context_buckets_switch_and_give_the_same_tokens(family):
    """Decode steps run the smallest context bucket that holds every row, then max_length slots; same tokens."""
    from egraft.frontend.causal_lm import eager_programs, step_module
    from egraft.runtime.generation import StepPrograms

    b = Built(family)
    step = step_module(b.model, 4, 64, (1, 4, 16), contexts=(8, 32))
    assert step.spec.contexts == (8, 32) and step.spec.cache_len == 80
    eager = eager_programs(step)
    ran = []

    def counted(key, program):
        def run(ids, pos, mask, *state):
            ran.append((key, ids.shape[1], mask.shape[1]))
            return program(ids, pos, mask, *state)
        return run

    assert sorted(eager.programs) == [(1, 8, 1), (1, 8, 4), (1, 32, 1), (1, 32, 4), (1, 64, 1), (1, 64, 4),
                                      (4, 8, 1), (4, 8, 4), (4, 64, 1), (4, 64, 4), (16, 32, 1), (16, 32, 4),
                                      (16, 64, 1), (16, 64, 4)]  # decode at every context; a prompt at 2 T <= C
    programs = StepPrograms(step.spec, {b: counted(b, p) for b, p in eager.programs.items()})
    ids, mask = left_padded([3, 5], seed=21)
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(programs, step.state(), ids, mask, **kw), b.reference(ids, mask, **kw))
    widths = [r[2] for r in ran if r[1] == 1]  # the one-token calls: the prompt's last token, then each decode
    # the longer row holds 5, 6, ..., 44 tokens after them: 8 slots, then 32, then max_length (64)
    assert len(widths) == 40 and widths == sorted(widths) and set(widths) == {8, 32, 64}, widths
    assert all(w >= n and (w == 8 or w // 4 < n) for w, n in zip(widths, range(5, 45))), widths


def test_a_quantised_models_context_buckets_weigh_its_quantised_values(monkeypatch):
    """The default context buckets weigh the cache a bucket skips against a step's reads: a quantised layer's
    values and scales are buffers, and they count (a 135 M int4 model at batch 4 compiled eight programs more
    when they did not)."""
    from egraft.frontend import causal_lm
    from egraft.frontend.quantize import quantize

    qm, _ = quantize(Built("llama").model, "int8")
    seen = []
    real = causal_lm.default_contexts
    monkeypatch.setattr(causal_lm, "default_contexts", lambda n, slot, w: seen.append(w) or real(n, slot, w))
    causal_lm.step_module(qm, 2, 64, (1, 4))
    params = sum(p.numel() * p.element_size() for p in qm.parameters())
    held = {t.data_ptr(): t for t in list(qm.parameters()) + list(qm.buffers())}
    assert seen == [sum(t.numel() * t.element_size() for t in held.values())] and seen[0] > 1.2 * params


def test_context_buckets_are_checked():
    from egraft.errors import InputError
    from egraft.frontend.causal_lm import default_contexts, step_module

    assert default_contexts(640) == (128, 256) and default_contexts(128) == ()  # up to half of max_length
    assert default_contexts(256) == (128,) and default_contexts(255) == () and default_contexts(1024) == (128, 256, 512)
    # with sizes: a bucket is kept when the cache it skips is a tenth of a full step's reads or more
    mb = 2 ** 20
    assert default_contexts(256, 23_040, 256 * mb) == ()  # a 135 M bf16 model at max_length 256: 1 % of a step
    assert default_contexts(1024, 23_040, 256 * mb) == ()  # skipping 896 slots: 7 %
    assert default_contexts(2048, 23_040, 256 * mb) == (128, 256, 512)  # 1024 would skip 7.5 %: left out
    assert default_contexts(4096, 8 * 23_040, 256 * mb) == (128, 256, 512, 1024, 2048)  # 8 rows: the cache rules
    b = Built("llama")
    with pytest.raises(InputError, match="context bucket"):
        step_module(b.model, 2, 64, (1, 4), contexts=(100,))  # over max_length
    with pytest.raises(InputError, match="below max_length=64"):
        step_module(b.model, 2, 64, (1, 4), contexts=(64,))  # what the full programs read already


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prompt_row_buckets_compute_only_the_fed_rows_and_give_the_same_tokens(family):
    """A batch of one prompt runs the one-row chunk programs; the other rows' caches are left as they were."""
    from egraft.frontend.causal_lm import eager_programs, step_module

    b = Built(family)
    step = step_module(b.model, 3, 64, (1, 4, 16), contexts=(), rows=(1,))
    assert step.spec.rows == (1,)
    eager = eager_programs(step)
    assert sorted(eager.programs) == [(1, 64, 1), (1, 64, 3), (4, 64, 1), (4, 64, 3), (16, 64, 1), (16, 64, 3)]
    ran = []

    def counted(key, program):
        def run(ids, pos, mask, *state):
            ran.append((key, tuple(ids.shape)))
            return program(ids, pos, mask, *state)
        return run

    from egraft.runtime.generation import StepPrograms

    programs = StepPrograms(step.spec, {b: counted(b, p) for b, p in eager.programs.items()})
    state = step.state()
    before = [s.clone() for s in state]
    ids, mask = left_padded([21], seed=4)
    kw = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(programs, state, ids, mask, **kw), b.reference(ids, mask, **kw))
    prompt_calls = [r for r in ran if r[1][1] > 1]
    assert prompt_calls == [((16, 64, 1), (1, 16)), ((4, 64, 1), (1, 4))], prompt_calls
    assert {r for r in ran if r[1][1] == 1} == {((1, 64, 1), (1, 1))}  # every decode step for the one row too
    for s, s0 in zip(state, before):
        # rows 1 and 2 are left alone: a full program would write filler at their slots; the one-row ones write
        # the other rows' part of their cache write to the scratch tail past max_length
        assert torch.equal(s[1:, :, :64], s0[1:, :, :64])
    # two rows: the chunk of 16 feeds both (the full program); the rest of the longer prompt is row 0's alone
    ran.clear()
    ids, mask = left_padded([21, 6], seed=5)
    assert torch.equal(generate(programs, state, ids, mask, **kw), b.reference(ids, mask, **kw))
    assert [r for r in ran if r[1][1] > 1] == [((16, 64, 3), (3, 16)), ((4, 64, 1), (1, 4))]
    ones = [r[0] for r in ran if r[1][1] == 1]  # row 0's last prompt token (21 = 16 + 4 + 1) alone, then decoding
    assert ones[0] == (1, 64, 1) and set(ones[1:]) == {(1, 64, 3)}, ones  # two rows: no two-row bucket, all rows


def test_rows_that_ended_past_a_row_bucket_get_pad_and_the_others_go_on():
    """Rows 2 and 3 of 4 produce eos first; the fed rows 0-1 then run the two-row programs, whose logits leave
    the ended rows out: they still get pad, and the tokens are transformers'."""
    from egraft.frontend.causal_lm import eager_programs, step_module

    b = Built("llama")
    step = step_module(b.model, 4, 64, (1, 4), contexts=(), rows=(2,))
    programs = eager_programs(step)
    ids, mask = left_padded([5, 9, 4, 7], seed=21)
    free = generate(programs, step.state(), ids, mask, max_new_tokens=24, eos_token_id=None)[:, ids.shape[1]:]
    early = [(int(free[2, i]), int(free[3, j])) for i in range(1, 4) for j in range(1, 4)]
    eos = next(sorted({a, c}) for a, c in early if not set(free[:2, :12].flatten().tolist()) & {a, c})
    kw = dict(max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=96)
    seen = []
    counted = StepPrograms(step.spec, {k: (lambda k, p: lambda *a: (seen.append(k), p(*a))[1])(k, p)
                                       for k, p in programs.programs.items()})
    got = generate(counted, step.state(), ids, mask, **kw)
    assert torch.equal(got, b.reference(ids, mask, **kw))
    tail = got[:, ids.shape[1]:]
    assert (tail[2:, 4:] == 96).all() and not (tail[:2, :12] == 96).any()
    assert (1, 64, 2) in seen  # the ended rows were left out of some decode calls
