"""The compiled decode step updates its KV caches in place: over 1,000 steps RSS stays flat and no call gets a
cache-sized buffer of its own.

One tiny Llama (rotary positions: 1,100 fit) compiled with each backend
explicitly, ``max_batch=1, max_length=1100`` and the ladder ``(1,)`` (one
program, a small compile).  The checks (``_pointers_of_every_call``,
``_rss_growth``) are shown to fail on programs that copy or keep a cache per
step (the negative controls), so a passing run means something.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
import torch
from compiled_helpers import compile_tiny, reference

from egraft.runtime.generation import Engine, StepPrograms, generate

STEPS, PROMPT = 1000, 5
KW = dict(max_new_tokens=STEPS, do_sample=False, eos_token_id=None, pad_token_id=0)
PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(params=["torch", "jax"], scope="module")
def long(request, search_cache):
    model, cm = compile_tiny("llama", request.param, search_cache, max_batch=1, max_length=STEPS + 100, chunks=(1,))
    assert cm.generation.describe()["backends"] == [request.param]
    ids = torch.randint(2, 97, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    want = reference(model, ids, None, **KW)
    got = cm.generate(ids, **KW)  # also the warm-up of the measured runs below
    return request.param, cm.generation, ids, want, got


def _pointer(x) -> int:
    return x.data_ptr() if isinstance(x, torch.Tensor) else x.unsafe_buffer_pointer()


def _recording(g, wrap=None):
    """g's programs, recording the state's buffers at every call (and `wrap`ped, for the negative controls)."""
    seen = []

    def program(p):
        def call(*args):
            seen.append(tuple(_pointer(x) for x in args[3:]))
            return p(*args) if wrap is None else wrap(p(*args))
        return call

    steps = g.step_programs if hasattr(g, "step_programs") else g.programs  # a Generation, a GenerationArtifact
    return StepPrograms(g.spec, {t: program(p) for t, p in steps.programs.items()}), seen


def _pointers_of_every_call(seen: list, calls: int) -> None:
    assert len(seen) == calls
    moved = [k for k, ptrs in enumerate(seen) if ptrs != seen[0]]
    assert not moved, f"the caches moved to new buffers at {len(moved)} of {calls} calls (first: call {moved[0]})"


def _rss() -> int:
    """Resident bytes, after handing freed heap back to the OS (glibc's malloc_trim): otherwise memory freed by
    earlier work would be reused by a leak without RSS moving."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _cache_bytes(g) -> int:
    return sum(int(np.prod(s.shape)) * torch.empty((), dtype=getattr(torch, s.dtype)).element_size()
               for s in g.spec.state)


def _rss_growth(g, run) -> None:
    """`run()` must not grow RSS by more than 32 caches' worth (1,000 steps each keeping one cache: 1000x)."""
    limit = max(8 << 20, 32 * _cache_bytes(g))
    before = _rss()
    run()
    grown = _rss() - before
    print(f"\nRSS grew {grown / 2**20:.2f} MiB over the run (limit {limit / 2**20:.1f} MiB)")
    assert grown < limit, f"RSS grew {grown / 2**20:.1f} MiB over {STEPS} steps (limit {limit / 2**20:.1f} MiB)"


def test_a_thousand_steps_equal_transformers(long):
    backend, g, ids, want, got = long
    assert got.shape == (1, PROMPT + STEPS) and torch.equal(got, want)


def test_a_thousand_steps_stay_in_place(long):
    backend, g, ids, want, _ = long
    state_before = list(g.state)
    ptrs = tuple(_pointer(x) for x in g.state)
    programs, seen = _recording(g)
    out = []
    _rss_growth(g, lambda: out.append(generate(programs, g.state, ids, None, **KW)))
    assert torch.equal(out[0], want)
    _pointers_of_every_call(seen, PROMPT + STEPS - 1)
    assert seen[0] == ptrs == tuple(_pointer(x) for x in g.state)  # the same buffers as before generate
    if backend == "torch":  # the very tensors, written in place
        assert all(a is b for a, b in zip(g.state, state_before))
    else:  # jax arrays: each call's state input was donated and the new value lives in its buffer
        import jax

        assert all(isinstance(x, jax.Array) for x in g.state)
        engine = Engine(g.step_programs, g.state)
        old = list(g.state)
        engine.prefill({0: ids[0]})
        assert all(x.is_deleted() for x in old)
        assert tuple(_pointer(x) for x in g.state) == ptrs


def test_the_checks_fail_on_a_copying_or_keeping_program(long):
    """Negative controls: a program returning fresh copies of the caches moves them; one keeping a cache copy per
    step grows RSS by ~1000 caches."""
    backend, g, ids, want, _ = long
    if backend == "torch":
        copy = lambda x: x.clone()  # noqa: E731
    else:
        import jax.numpy as jnp

        copy = lambda x: jnp.array(x, copy=True)  # noqa: E731
    programs, seen = _recording(g, lambda out: (out[0], [copy(x) for x in out[1]]))
    # (on g.state itself: on JAX a call consumes the arrays passed, so the caches kept must be the returned ones)
    assert torch.equal(generate(programs, g.state, ids, None, **{**KW, "max_new_tokens": 20}), want[:, :PROMPT + 20])
    with pytest.raises(AssertionError, match="the caches moved to new buffers"):
        _pointers_of_every_call(seen, PROMPT + 19)
    if backend != "jax":  # (the kept-copy control once: 1,000 torch steps take a few seconds)
        return
    kept = []
    programs, _ = _recording(g, lambda out: (kept.append(np.array(out[1][0])), out)[1])
    with pytest.raises(AssertionError, match="RSS grew"):
        _rss_growth(g, lambda: generate(programs, g.state, ids, None, **KW))
    assert len(kept) == PROMPT + STEPS - 1


def test_a_loaded_artifact_stays_in_place_too(long, tmp_path):
    """egraft.load of the saved generation: the same tokens, the same buffers at every call, flat RSS."""
    import egraft
    from egraft.api.generation_artifact import save_generation

    backend, g, ids, want, _ = long
    art = egraft.load(save_generation(g, str(tmp_path / "gen"), model="tiny llama"))
    assert torch.equal(art.generate(ids, **KW), want)  # (the warm-up: the caches become the program's own)
    # every program binds the one mapped weights file: a stored tensor is the same memory in each program
    where: dict = {}
    for a in art.steps.values():
        held = a.runner.host if backend == "jax" else a.runner.weights
        for spec, w in zip(a.manifest["weights"], held):
            if "tensor" in spec:
                ptr = w.ctypes.data if backend == "jax" else w.data_ptr()
                assert where.setdefault(spec["tensor"], ptr) == ptr, spec["tensor"]
    assert where
    programs, seen = _recording(art)
    out = []
    _rss_growth(art, lambda: out.append(generate(programs, art.state, ids, None, **KW)))
    assert torch.equal(out[0], want)
    _pointers_of_every_call(seen, PROMPT + STEPS - 1)
