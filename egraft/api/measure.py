"""How much faster a compiled model is than eager PyTorch and torch.compile, measured so it can be trusted.

The protocol is the profiler's (``egraft.measure.timing``), the same one
the search's final comparison uses:

* **fixed conditions.**  On the CPU the process is pinned to one core (the
  last it may use) and torch runs one thread for the measurement; XLA's
  threads then share that core too.  Both are restored afterwards.  On a
  GPU, ``do_bench`` times with CUDA events.
* **interleaved.**  ``ROUNDS`` rounds; in each, every variant is timed for
  ``REPEATS`` calls (after one warm-up call), in an order that rotates
  between rounds, so all variants see the same machine state.
* **medians with their spread, and the median's interval.**  Each variant's
  samples are summarised as a median and a relative spread (p90 - p10 over
  the median), and a distribution-free ~95 % interval of the median (two
  order statistics).  A speed-up is *concluded* only when the two medians'
  intervals do not overlap and neither spread is above ``COLLAPSE`` (50 %:
  the machine itself misbehaved); otherwise the report says the machine was
  too noisy to conclude.  The spread alone cannot be the test: one call's
  p10-p90 spread is 15-20 % on a quiet 2-core VM, while the median's
  interval narrows with the number of calls.

Every variant is called the way a user calls it, torch tensors in and out:
the compiled model through its own ``__call__`` (signature lookup
included), the model in eager mode under ``torch.no_grad``, and
``torch.compile(model)`` (Inductor) after a first call that compiles it,
which is timed separately and reported, not counted.
"""

from __future__ import annotations

import os
import time as _time
from contextlib import ExitStack, contextmanager

import torch

from ..measure import compare, interleaved, parse, pin
from ..measure.timing import xla_started_wider
from ..measure.timing import COLLAPSE

ROUNDS = 5
REPEATS = 7


@contextmanager
def fixed_conditions(device: str):
    """One pinned core and one torch thread on the CPU (restored on exit); nothing to fix on a GPU."""
    info = {"device": device, "pinned": [], "torch_threads": torch.get_num_threads()}
    with ExitStack() as stack:
        if parse(device).kind == "cpu" and hasattr(os, "sched_setaffinity"):
            core = sorted(os.sched_getaffinity(0))[-1]
            info["pinned"] = list(stack.enter_context(pin([core])).after)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            stack.callback(torch.set_num_threads, threads)
            info["torch_threads"] = 1
        yield info


def measure(cm, model, prog, inductor: bool = True) -> dict:
    """Time `cm` against eager `model` (and torch.compile when `inductor`) on `prog`'s inputs; a JSON record."""
    args, kwargs = prog.example
    device = cm.options.device
    variants = {"egraft": lambda: cm(*args, **kwargs)}
    notes = []
    with torch.no_grad():
        variants["eager"] = lambda: model(*args, **kwargs)
        record = {}
        if inductor:
            t = _time.perf_counter()
            try:
                opt = torch.compile(model, backend="inductor")
                opt(*args, **kwargs)  # compiles
                variants["torch.compile"] = lambda: opt(*args, **kwargs)
                record["torch_compile_s"] = round(_time.perf_counter() - t, 3)
            except Exception as e:  # noqa: BLE001 - no Inductor here (no C++ compiler, ...): say so, time the rest
                notes.append(f"torch.compile could not compile the model: {type(e).__name__}: {str(e)[:200]}")
        with fixed_conditions(device) as cond:
            if xla_started_wider():
                notes.append("XLA started on more cores than this measurement is pinned to, so its threads "
                             "share one core and egraft's spread is inflated; for a clean measurement call "
                             "egraft.measure.fix_threads(1) before importing torch or jax")
            timings = interleaved(variants, device, ROUNDS, REPEATS)
    mine = timings["egraft"]
    record.update({
        "conditions": {**cond, "rounds": ROUNDS, "repeats": REPEATS, "collapse_spread": COLLAPSE},
        "times": {k: {"median_s": t.median, "spread": t.spread, "n": t.n} for k, t in timings.items()},
        "speedups": {k: verdict(mine, t) for k, t in timings.items() if k != "egraft"},
        "notes": notes,
    })
    return record


def verdict(mine, theirs) -> dict:
    """egraft's speed-up over one variant, its ~95 % interval, and whether it is concluded (profiler.compare)."""
    v = compare(mine, theirs)
    return {**v, "interval": list(v["interval"])}
