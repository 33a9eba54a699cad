"""Each limit is refused with an InputError naming the limit and the value, before anything runs."""

from __future__ import annotations

import re

import pytest
import torch
from gen_helpers import MAX_BATCH, MAX_LENGTH, Built, left_padded

from egraft.errors import InputError
from egraft.frontend.causal_lm import step_module
from egraft.runtime.generation import StepPrograms, generate, new_state


def _counting(built):
    calls = []
    progs = StepPrograms(built.step.spec, {t: (lambda p: lambda *a: (calls.append(1), p(*a))[1])(p)
                                           for t, p in built.programs.programs.items()})
    return progs, calls


def test_too_long_is_refused_before_it_starts(built):
    progs, calls = _counting(built)
    ids, mask = left_padded([100, 20], seed=1)
    state = [x.clone() for x in built.step.state()]
    before = [x.clone() for x in state]
    with pytest.raises(InputError, match=rf"100 tokens \+ max_new_tokens=29 is 129 tokens, over the step's "
                                         rf"max_length={MAX_LENGTH}"):
        generate(progs, state, ids, mask, max_new_tokens=29)
    assert not calls and all(torch.equal(a, b) for a, b in zip(state, before))
    assert generate(progs, state, ids, mask, max_new_tokens=1).shape == (2, 101)  # 100 + 1 fits, and runs


def test_batch_over_max_batch(built):
    ids, mask = left_padded([4] * (MAX_BATCH + 1), seed=2)
    with pytest.raises(InputError, match=rf"batch of {MAX_BATCH + 1} rows is over the step's max_batch={MAX_BATCH}"):
        generate(built.programs, None, ids, mask, max_new_tokens=2)


def test_state_of_wrong_dtype_or_shape(built):
    spec = built.step.spec
    good = new_state(spec)
    s0 = spec.state[0]
    bad = [x.clone() for x in good]
    bad[0] = bad[0].to(torch.float64)
    with pytest.raises(InputError, match=re.escape(f"state '{s0.name}' is {list(s0.shape)}:float64, but the step "
                                                   f"was built for {list(s0.shape)}:float32")):
        generate(built.programs, bad, *left_padded([3], seed=1), max_new_tokens=2)
    bad = [x.clone() for x in good]
    bad[1] = torch.zeros(1, *spec.state[1].shape[1:])
    with pytest.raises(InputError, match=rf"state '{spec.state[1].name}' is \[1, "):
        generate(built.programs, bad, *left_padded([3], seed=1), max_new_tokens=2)
    with pytest.raises(InputError, match=rf"takes {len(spec.state)} state tensor"):
        generate(built.programs, good[:-1], *left_padded([3], seed=1), max_new_tokens=2)


def test_bad_prompts_and_options(built):
    ids, mask = left_padded([5, 3], seed=4)
    with pytest.raises(InputError, match="row 1 of attention_mask is not left padding"):
        generate(built.programs, None, ids, mask.flip(1), max_new_tokens=2)
    with pytest.raises(InputError, match="no prompt token"):
        generate(built.programs, None, ids, mask * torch.tensor([[1], [0]]), max_new_tokens=2)
    with pytest.raises(InputError, match="top_p=1.5"):
        generate(built.programs, None, ids, mask, max_new_tokens=2, do_sample=True, top_p=1.5)
    with pytest.raises(InputError, match="max_new_tokens=0"):
        generate(built.programs, None, ids, mask, max_new_tokens=0)
    with pytest.raises(InputError, match=r"no full step program for chunk size\(s\) \[4\]"):
        StepPrograms(built.step.spec, {b: p for b, p in built.programs.programs.items() if b.chunk != 4})
    with pytest.raises(InputError, match=r"bucket\(s\) \[\(4, 200, 1\)\]: .*at most 128 slots"):
        StepPrograms(built.step.spec, {**built.programs.programs, (4, 200, 1): built.programs.programs[1, 128, 4]})


def test_step_module_limits():
    b = Built("gpt2")  # n_positions=256
    with pytest.raises(InputError, match="max_length=300 is over the model's max_position_embeddings=256"):
        step_module(b.model, 2, 300)
    with pytest.raises(InputError, match="max_batch=0"):
        step_module(b.model, 0, 16)
    b.model.train()
    try:
        with pytest.raises(InputError, match="training mode"):
            step_module(b.model, 2, 16)
    finally:
        b.model.eval()
    b.model.generation_config.repetition_penalty = 1.3
    with pytest.raises(InputError, match="repetition_penalty"):
        step_module(b.model, 2, 16)
