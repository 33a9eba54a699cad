"""A Session: requests from several threads share the cache rows, join and leave at different steps, and each
gets the tokens transformers' generate gives it alone."""

from __future__ import annotations

import threading

import pytest
import torch
from gen_helpers import MAX_LENGTH, left_padded

from egraft.errors import InputError
from egraft.runtime.generation import generate
from egraft.runtime.slots import Session

# (prompt length, max_new_tokens, options): more requests than cache rows (4), so some wait for a free row
REQUESTS = [
    (3, 40, dict(do_sample=False)),
    (17, 12, dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=11)),
    (60, 25, dict(do_sample=False)),
    (9, 33, dict(do_sample=True, temperature=1.2, seed=5)),
    (30, 8, dict(do_sample=False)),
    (5, 20, dict(do_sample=True, top_p=0.7, seed=2)),
    (12, 30, dict(do_sample=False, eos_token_id=None)),
]


def _alone(built, prompt, new, opts):
    """transformers' generate for one prompt alone (after torch.manual_seed(seed) when sampling)."""
    opts = dict(opts)
    seed = opts.pop("seed", None)
    if seed is not None:
        torch.manual_seed(seed)
    return built.reference(prompt[None], max_new_tokens=new, **opts)[0]


def test_threads_share_rows_and_each_gets_its_own_tokens(built):
    prompts = [left_padded([n], seed=40 + i)[0][0] for i, (n, _, _) in enumerate(REQUESTS)]
    results: dict[int, torch.Tensor] = {}
    errors = []
    start = threading.Barrier(3)
    with Session(built.programs) as session:
        def worker(mine):
            start.wait()
            try:  # all of a thread's requests at once: 7 in flight for 4 rows, so some wait for a row to free
                futures = {i: session.submit(prompts[i], max_new_tokens=REQUESTS[i][1], **REQUESTS[i][2])
                           for i in mine}
                for i, f in futures.items():
                    results[i] = f.result(timeout=120)
            except Exception as e:  # collected: an assert in a thread would not fail the test
                errors.append(e)

        threads = [threading.Thread(target=worker, args=([i for i in range(len(REQUESTS)) if i % 3 == k],))
                   for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        calls = session.calls
    assert not errors, errors
    for i, (n, new, opts) in enumerate(REQUESTS):
        want = _alone(built, prompts[i], new, opts)
        assert torch.equal(results[i], want), f"request {i} (prompt {n}, {new} new, {opts})"
    # the rows were shared: fewer calls than the requests would make one after another
    alone_calls = sum(len(built.step.spec.plan(n)) + len(results[i]) - n - 1 for i, (n, _, _) in enumerate(REQUESTS))
    assert calls < alone_calls


def test_session_refuses_a_bad_request_and_keeps_the_others(built):
    prompt = left_padded([10], seed=3)[0][0]
    with Session(built.programs) as session:
        running = session.submit(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None)
        with pytest.raises(InputError, match=rf"max_length={MAX_LENGTH}") as e:
            session.submit(torch.randint(2, 97, (MAX_LENGTH - 4,)), max_new_tokens=10)
        assert f"{MAX_LENGTH - 4} tokens + max_new_tokens=10" in str(e.value)
        with pytest.raises(InputError, match="temperature"):
            session.submit(prompt, max_new_tokens=3, do_sample=True, temperature=0.0)
        with pytest.raises(InputError, match="1-D"):
            session.submit(torch.zeros(2, 3, dtype=torch.int64), max_new_tokens=3)
        got = running.result(timeout=120)
    assert torch.equal(got, _alone(built, prompt, 30, dict(do_sample=False, eos_token_id=None)))
    with pytest.raises(InputError, match="closed"):
        session.submit(prompt, max_new_tokens=3)


def test_session_result_equals_generate_alone(built):
    """The session and the batch loop are one engine: a request's tokens equal generate() at batch 1."""
    prompt = left_padded([21], seed=8)[0][0]
    g = torch.Generator().manual_seed(9)
    want = generate(built.programs, None, prompt[None], max_new_tokens=16, do_sample=True, top_k=7, generator=g)[0]
    with Session(built.programs) as session:
        other = session.submit(left_padded([50], seed=1)[0][0], max_new_tokens=16, do_sample=False)
        got = session.generate(prompt, max_new_tokens=16, do_sample=True, top_k=7, seed=9)
        other.result(timeout=120)
    assert torch.equal(got, want)


def test_a_failed_step_fails_its_requests_and_the_session_goes_on(built):
    """A program that raises fails the requests of that call with its error; later requests run as before."""
    from egraft.runtime.generation import StepPrograms

    broken = {"now": False}

    def failing(p):
        def program(*args):
            if broken["now"]:
                broken["now"] = False
                raise RuntimeError("device lost")
            return p(*args)
        return program

    programs = StepPrograms(built.step.spec, {t: failing(p) for t, p in built.programs.programs.items()})
    prompt = left_padded([7], seed=12)[0][0]
    with Session(programs) as session:
        broken["now"] = True
        with pytest.raises(RuntimeError, match="device lost"):
            session.generate(prompt, max_new_tokens=5, do_sample=False)
        got = session.generate(prompt, max_new_tokens=5, do_sample=False, eos_token_id=None)
    assert torch.equal(got, _alone(built, prompt, 5, dict(do_sample=False, eos_token_id=None)))
