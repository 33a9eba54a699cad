"""Device parsing and timings: structure only (no test asserts a speed)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from egraft.errors import BackendError, EgraftError
from egraft.measure import Device, available, parse, pin, summarize, time, time_cpu, time_cuda, time_jax
from egraft.testing import fresh_seed


@pytest.mark.parametrize("text,want", [("cpu", Device("cpu")), ("cuda", Device("cuda")),
                                       ("cuda:3", Device("cuda", 3)), ("tpu", Device("tpu")), (" CPU ", Device("cpu"))])
def test_parse(text, want):
    assert parse(text) == want
    assert parse(str(want)) == want


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:", "cpu:0", "tpu:1", "", "cuda:-1"])
def test_parse_rejects_bad_strings(bad):
    with pytest.raises(BackendError, match="unknown device"):
        parse(bad)


def test_available_here():
    assert available("cpu")
    assert available("cuda") is False  # this machine has no GPU (torch is the CPU build)
    assert available("tpu") is False
    with pytest.raises(EgraftError):
        available("gpu")


def test_time_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(BackendError, match="not available"):
        time_cuda(lambda: None)
    with pytest.raises(BackendError, match="not available"):
        time(lambda: None, "cuda:0")


def _check(t, device):
    assert t.n == len(t.samples) > 0
    assert min(t.samples) <= t.median <= max(t.samples)
    assert t.spread >= 0
    assert t.device == device
    assert t.threads >= 1
    assert t.affinity == tuple(sorted(os.sched_getaffinity(0)))


def test_time_cpu_structure():
    a = np.random.default_rng(fresh_seed()).standard_normal((64, 64))
    t = time_cpu(lambda: a @ a, warmup=1, repeats=7)
    _check(t, "cpu")
    assert t.n == 7
    _check(time(lambda: a @ a, "cpu", repeats=3), "cpu")


def test_time_jax_blocks_and_excludes_compile():
    import jax
    import jax.numpy as jnp

    calls = []

    @jax.jit
    def f(x):
        return jnp.sin(x) * 2

    x = jnp.asarray(np.random.default_rng(fresh_seed()).standard_normal(128).astype(np.float32))

    def run():
        calls.append(1)
        return [f(x), (f(x), {"y": f(x)})]

    t = time_jax(run, warmup=2, repeats=5)
    _check(t, "cpu")
    assert len(calls) == 7 and t.n == 5
    _check(time(run, "cpu", jax=True, repeats=3), "cpu")


def test_summarize_spread_on_synthetic_samples():
    t = summarize([1.0] * 20)
    assert t.median == 1.0 and t.spread == 0.0
    s = [1.0 + 0.01 * i for i in range(11)]  # p10 = 1.01, p90 = 1.09
    t = summarize(s)
    assert t.median == pytest.approx(1.05)
    assert t.spread == pytest.approx(0.08 / 1.05)
    small = summarize([1.0, 2.0, 3.0, 4.0])  # IQR: 3.25 - 1.75
    assert small.spread == pytest.approx(1.5 / 2.5)
    with pytest.raises(BackendError):
        summarize([])


def test_the_verdict_on_quiet_loud_and_tied_timings():
    """The one speed-up verdict (measure.compare): a clear difference concludes; a tie, a difference inside the
    noise or a collapsed machine does not (this replaces the old 10 % `noisy` and the half-width `faster` rules)."""
    from egraft.measure import COLLAPSE, compare

    quiet_fast = summarize([1.0, 1.01, 0.99] * 4)
    quiet_slow = summarize([2.0, 2.02, 1.98] * 4)
    loud = summarize([0.5, 1.0, 4.0] * 4)
    v = compare(quiet_fast, quiet_slow)
    assert v["conclusive"] and v["speedup"] == pytest.approx(2.0, rel=0.05)
    back = compare(quiet_slow, quiet_fast)
    assert back["conclusive"] and back["speedup"] < 1  # concluded, and slower
    assert not compare(quiet_fast, quiet_fast)["conclusive"]  # a tie concludes nothing
    near = summarize([1.0, 1.2, 0.8] * 4)
    near_slower = summarize([1.05, 1.25, 0.85] * 4)
    assert not compare(near, near_slower)["conclusive"] and not compare(near_slower, near)["conclusive"]
    assert loud.spread > COLLAPSE
    why = compare(loud, quiet_slow)
    assert not why["conclusive"] and "too busy" in why["why_not"]


def test_pinned_fixes_cores_and_threads_and_restores_them():
    """The one pinning context: one core and one torch thread inside, the old affinity and threads after."""
    import torch

    from egraft.measure import pinned

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "XLA_FLAGS")}
    with pinned("cpu") as info:
        assert len(os.sched_getaffinity(0)) == 1 and torch.get_num_threads() == 1
        assert info["pinned"] == sorted(os.sched_getaffinity(0)) and info["torch_threads"] == 1
        assert os.environ["OMP_NUM_THREADS"] == "1"
    assert os.sched_getaffinity(0) == before and torch.get_num_threads() == threads
    # a process started after the measurement inherits none of its thread settings
    assert {k: os.environ.get(k) for k in env} == env
    with pytest.raises(BackendError, match="may use"):
        with pinned("cpu", len(before) + 1):
            pass
    with pinned("cuda") as info:  # nothing to pin on a GPU (do_bench times with CUDA events)
        assert info["pinned"] == [] and os.sched_getaffinity(0) == before


def test_pin_applies_and_restores():
    before = os.sched_getaffinity(0)
    core = min(before)
    with pin([core]) as p:
        assert os.sched_getaffinity(0) == {core}
        assert p.before == tuple(sorted(before)) and p.after == (core,)
        t = time_cpu(lambda: None, repeats=3)
        assert t.affinity == (core,)
        assert "after=" in repr(p)
    assert os.sched_getaffinity(0) == before
    p = pin([core])
    assert os.sched_getaffinity(0) == {core}
    p.restore()
    assert os.sched_getaffinity(0) == before


def test_pin_rejects_cores_not_allowed():
    before = os.sched_getaffinity(0)
    with pytest.raises(BackendError, match="cannot pin"):
        pin([max(before) + 1000])
    with pytest.raises(BackendError):
        pin([])
    assert os.sched_getaffinity(0) == before


def test_a_speedup_is_concluded_from_the_medians_intervals_not_from_the_spread():
    """15 % spread per call (a quiet VM) still concludes a 1.3x difference from 35 samples; overlap does not."""
    import numpy as np

    from egraft.measure import compare, median_interval, summarize

    rng = np.random.default_rng(0)
    fast = summarize(1e-3 * (1 + 0.15 * rng.random(35)))
    slow = summarize(1.3e-3 * (1 + 0.15 * rng.random(35)))
    assert fast.spread > 0.10 and slow.spread > 0.10  # the old rule would refuse to conclude
    lo, hi = median_interval(fast)
    assert lo <= fast.median <= hi and hi - lo < fast.width
    v = compare(fast, slow)
    assert v["conclusive"] and 1.2 < v["speedup"] < 1.4 and v["interval"][0] < v["speedup"] < v["interval"][1]
    same = summarize(1e-3 * (1 + 0.15 * rng.random(35)))
    tie = compare(fast, same)
    assert not tie["conclusive"] and "overlap" in tie["why_not"]
    wild = summarize(1e-3 * np.exp(2 * rng.random(35)))  # a machine that collapses: spread far above 50 %
    assert not compare(wild, summarize(5e-3 * np.ones(35)))["conclusive"]


def test_interleaved_stops_starting_rounds_past_its_budget():
    import time as _t

    from egraft.measure import interleaved

    fns = {"a": lambda: _t.sleep(0.02), "b": lambda: _t.sleep(0.02)}
    # two rounds take at least 2 x 2 calls x 20 ms: past them, the projected third passes 0.1 s
    got = interleaved(fns, rounds=10, calls=1, budget_s=0.1)
    assert [len(t.samples) for t in got.values()] == [2, 2]
    full = interleaved(fns, rounds=3, calls=1)
    assert [len(t.samples) for t in full.values()] == [3, 3]
