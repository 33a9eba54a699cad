"""How long a program takes, measured so that two measurements can be compared honestly.

A single wall-clock number hides the two things that decide whether a
search step may trust it: how spread the repeats are, and under which
conditions (threads, cores, device) they were taken.  So every timing
function returns a :class:`Timing` with all samples, their median (robust to
the occasional descheduled run, unlike the mean) and a relative spread, and
:func:`compare` refuses to conclude a speed-up inside the noise (the one
verdict: the medians' ~95 % intervals apart, no spread above ``COLLAPSE``).

One function per device kind, because each needs a different notion of
"done":

* CPU: the call returning is completion; ``time.perf_counter_ns`` around it.
* JAX: dispatch is asynchronous, so the outputs are waited on with
  ``block_until_ready``; the warm-up calls absorb tracing and compilation.
* CUDA: ``triton.testing.do_bench``, which times with CUDA events and
  flushes the L2 cache before every run (so a kernel is not credited with a
  cache warmed by its previous repeat).  Only callable where a GPU exists.

Nothing heavy is imported at module load: triton only inside
:func:`time_cuda`, and JAX outputs are waited on by duck typing.
"""

from __future__ import annotations

import math
import os
import time as _time
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping, Sequence

import numpy as np

from ..errors import BackendError
from .device import parse, require

@dataclass(frozen=True)
class Timing:
    """Seconds per call: median of `samples`, relative `spread`, and the conditions measured under."""

    median: float
    samples: tuple[float, ...]
    spread: float  # (p90 - p10) / median, or IQR / median when fewer than 10 samples
    n: int
    device: str
    threads: int
    affinity: tuple[int, ...] = field(default_factory=tuple)

    @property
    def width(self) -> float:
        """The spread in seconds (p90 - p10 or the IQR)."""
        return self.spread * self.median


def conditions() -> tuple[int, tuple[int, ...]]:
    """(thread count, CPU affinity) of this process right now.

    The thread count is what the numeric libraries will use: ``OMP_NUM_THREADS``
    when set, else the number of cores the process may run on.
    """
    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    env = os.environ.get("OMP_NUM_THREADS", "")
    threads = int(env) if env.isdigit() and int(env) > 0 else (len(cores) or (os.cpu_count() or 1))
    return threads, cores


def summarize(samples: Sequence[float], device: str = "cpu") -> Timing:
    """A :class:`Timing` from raw seconds (also how tests build synthetic timings)."""
    s = np.asarray(samples, dtype=np.float64)
    if s.size == 0 or np.any(s < 0) or not np.all(np.isfinite(s)):
        raise BackendError(f"cannot summarize timings {list(samples)!r}: need at least one finite, non-negative sample")
    med = float(np.median(s))
    lo, hi = (10, 90) if s.size >= 10 else (25, 75)
    width = float(np.percentile(s, hi) - np.percentile(s, lo))
    spread = width / med if med > 0 else 0.0
    threads, cores = conditions()
    return Timing(med, tuple(float(x) for x in s), spread, int(s.size), str(device), threads, cores)


def time_cpu(fn: Callable[[], object], warmup: int = 2, repeats: int = 20) -> Timing:
    """Wall-clock `fn()` `repeats` times after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(max(1, repeats)):
        t0 = _time.perf_counter_ns()
        fn()
        out.append((_time.perf_counter_ns() - t0) * 1e-9)
    return summarize(out, "cpu")


def _block(x) -> None:
    """Wait for every JAX array in a (nested) result; other leaves are already done."""
    if hasattr(x, "block_until_ready"):
        x.block_until_ready()
    elif isinstance(x, (list, tuple)):
        for y in x:
            _block(y)
    elif isinstance(x, dict):
        for y in x.values():
            _block(y)


def time_jax(fn: Callable[[], object], warmup: int = 2, repeats: int = 20, device: str = "cpu") -> Timing:
    """Like :func:`time_cpu`, but each call's outputs are blocked on (warm up at least once before the first
    call of a new program, so compilation is excluded)."""
    for _ in range(warmup):
        _block(fn())
    out = []
    for _ in range(max(1, repeats)):
        t0 = _time.perf_counter_ns()
        _block(fn())
        out.append((_time.perf_counter_ns() - t0) * 1e-9)
    return summarize(out, device)


def time_cuda(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100, device: str = "cuda") -> Timing:
    """``triton.testing.do_bench`` (CUDA events, L2 flushed before each run); needs a GPU."""
    d = require(device)
    if d.kind != "cuda":
        raise BackendError(f"time_cuda times CUDA devices only, not {str(d)!r}; use time(fn, {str(d)!r})")
    from triton.testing import do_bench

    ms = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    return summarize([m * 1e-3 for m in ms], str(d))


def time(fn: Callable[[], object], device: str = "cpu", jax: bool = False, **kw) -> Timing:
    """Time `fn` on `device`: CUDA via do_bench, TPU or ``jax=True`` with blocking, else plain CPU."""
    d = parse(device)
    if d.kind == "cuda":
        return time_cuda(fn, device=str(d), **kw)
    if d.kind == "tpu" or jax:
        require(d)
        return time_jax(fn, device=str(d), **kw)
    return time_cpu(fn, **kw)


WARM_TURN_S = 0.01  # interleaved(): a variant slower than this skips the per-turn warm-up after round one


def interleaved(fns: Mapping[str, Callable[[], object]], device: str = "cpu", rounds: int = 5, calls: int = 7,
                jax: Collection[str] = (), budget_s: float | None = None) -> dict[str, Timing]:
    """Time several variants in rotating turns, so all see the same machine state; a Timing per name.

    Each of `rounds` rounds times every variant once in turn (the order
    rotates between rounds): `calls` calls on a CPU or TPU, ``do_bench`` on
    CUDA.  Every turn of the first round starts with one untimed warm-up
    call; later turns do too for a variant whose calls take under
    ``WARM_TURN_S`` (where the other variants' turns leave caches cold),
    while a slower variant's warm-up would cost a whole call for an effect
    far below its spread.  Names in `jax` are blocked on.  With `budget_s`, no round starts (after the
    first ``MIN_ROUNDS``) that the rounds so far say would end past it.  The search's
    final comparison, ``CompiledModel.measure`` and ``egraft bench`` all
    compare through this.
    """
    names = list(fns)
    samples: dict[str, list[float]] = {k: [] for k in names}
    cuda = parse(device).kind == "cuda"
    t0 = _time.perf_counter()
    for r in range(rounds):
        if budget_s is not None and r >= MIN_ROUNDS and (_time.perf_counter() - t0) * (r + 1) / r > budget_s:
            break
        for k in names[r % len(names):] + names[:r % len(names)]:
            warm = 1 if r == 0 or min(samples[k], default=0.0) < WARM_TURN_S else 0
            kw = {} if cuda else {"warmup": warm, "repeats": calls}
            samples[k].extend(time(fns[k], device, jax=k in jax, **kw).samples)
    return {k: summarize(v, device) for k, v in samples.items()}


MIN_ROUNDS = 2  # interleaved's rounds even when its budget is spent


COLLAPSE = 0.5  # a relative spread above this says the machine itself misbehaved: nothing is concluded


def median_interval(t: Timing, z: float = 1.96) -> tuple[float, float]:
    """A distribution-free ~95 % confidence interval of `t`'s median: two order statistics of its samples.

    The ranks ``n/2 -/+ z*sqrt(n)/2`` bracket the median for any
    distribution of call times, so a skewed, spiky machine widens the
    interval instead of faking a difference.  Under 6 samples: min and max.
    """
    s = sorted(t.samples)
    n = len(s)
    if n < 6:
        return s[0], s[-1]
    k = max(0, int(math.floor(n / 2 - z * math.sqrt(n) / 2)))
    return s[k], s[n - 1 - k]


def compare(mine: Timing, theirs: Timing) -> dict:
    """`mine`'s speed-up over `theirs` (their median over mine), its ~95 % interval, and whether it concludes.

    The one speed-up verdict: the search's final comparison, a compiled
    model's measurement and ``egraft bench`` all decide through it.

    A speed-up is concluded when the two medians' intervals
    (:func:`median_interval`) do not overlap and neither spread is above
    ``COLLAPSE``.  The p10-p90 spread of one call can be 15-20 % on a quiet
    2-core VM (one pinned torch matmul measured 16.5 %), so a rule on the
    spread alone (a 10 % cap, say) would refuse every conclusion there; the
    median's interval shrinks with the number of samples, the spread does not.
    """
    a_lo, a_hi = median_interval(mine)
    b_lo, b_hi = median_interval(theirs)
    ratio = theirs.median / mine.median if mine.median > 0 else math.nan
    interval = (b_lo / a_hi if a_hi > 0 else math.nan, b_hi / a_lo if a_lo > 0 else math.nan)
    collapsed = max(mine.spread, theirs.spread) > COLLAPSE
    overlap = not (a_hi < b_lo or b_hi < a_lo)
    why = (f"a spread is above {COLLAPSE:.0%}: the machine is too busy" if collapsed else
           "the 95 % intervals of the medians overlap" if overlap else "")
    return {"speedup": ratio, "interval": list(interval), "conclusive": not why, "why_not": why}
