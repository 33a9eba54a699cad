"""How much faster a compiled model is than eager PyTorch and torch.compile, measured so it can be trusted.

:func:`compare_model` is the explicit measurement behind
``CompiledModel.measure()`` (its report only shows what was measured).
The protocol is the one every egraft measurement follows:

* **fixed conditions** (:func:`~egraft.measure.pinning.pinned`): on the CPU
  one pinned core and one torch thread, restored afterwards; on a GPU
  ``do_bench`` times with CUDA events.
* **interleaved** (:func:`~egraft.measure.timing.interleaved`): ``ROUNDS``
  rounds; in each, every variant is timed for ``REPEATS`` calls (after one
  warm-up call), in an order that rotates between rounds.
* **the one verdict** (:func:`~egraft.measure.timing.compare`): a speed-up
  is concluded only when the two medians' ~95 % intervals do not overlap
  and neither spread is above ``COLLAPSE``; otherwise the record says the
  machine was too noisy to conclude.

Every variant is called the way a user calls it, torch tensors in and out:
the compiled model through its own ``__call__``, the model in eager mode
under ``torch.no_grad``, and ``torch.compile(model)`` (Inductor) after a
first call that compiles it, which is timed separately and reported, not
counted.
"""

from __future__ import annotations

import time as _time
from typing import Callable

from .pinning import pinned, xla_started_wider
from .timing import COLLAPSE, compare, interleaved

ROUNDS = 5
REPEATS = 7


def compare_model(compiled: Callable, model: Callable, example: tuple[tuple, dict], device: str = "cpu",
                  inductor: bool = True) -> dict:
    """Time `compiled` against eager `model` (and torch.compile when `inductor`) on `example`; a JSON record.

    `example` is ``(args, kwargs)``.  The record: ``conditions``, ``times``
    (median, spread, calls per variant), ``speedups`` (the verdict of
    `compiled` over each other variant), ``torch_compile_s`` and ``notes``.
    """
    import torch

    args, kwargs = example
    variants = {"egraft": lambda: compiled(*args, **kwargs)}
    notes = []
    record: dict = {}
    with torch.no_grad():
        variants["eager"] = lambda: model(*args, **kwargs)
        if inductor:
            t = _time.perf_counter()
            try:
                opt = torch.compile(model, backend="inductor")
                opt(*args, **kwargs)  # compiles
                variants["torch.compile"] = lambda: opt(*args, **kwargs)
                record["torch_compile_s"] = round(_time.perf_counter() - t, 3)
            except Exception as e:  # noqa: BLE001 - no Inductor here (no C++ compiler, ...): say so, time the rest
                notes.append(f"torch.compile could not compile the model: {type(e).__name__}: {str(e)[:200]}")
        with pinned(device) as cond:
            if xla_started_wider():
                notes.append("XLA started on more cores than this measurement is pinned to, so its threads "
                             "share one core and egraft's spread is inflated; for a clean measurement call "
                             "egraft.measure.fix_threads(1) before importing torch or jax")
            timings = interleaved(variants, device, ROUNDS, REPEATS)
    mine = timings["egraft"]
    record.update({
        "conditions": {**cond, "rounds": ROUNDS, "repeats": REPEATS, "collapse_spread": COLLAPSE},
        "times": {k: {"median_s": t.median, "spread": t.spread, "n": t.n} for k, t in timings.items()},
        "speedups": {k: compare(mine, t) for k, t in timings.items() if k != "egraft"},
        "notes": notes,
    })
    return record
