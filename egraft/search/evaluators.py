"""Where candidates are built and run: in this process, with a pool of compile workers.

An evaluator has one method that matters, ``run(task, candidates, bounds,
cap_s=inf) -> outcomes`` (same order; `cap_s` as in
:func:`~egraft.search.candidate.evaluate_one`), and ``close()``.  Timing always happens in the
process that owns the device, one candidate at a time, so timings never
disturb each other; what can overlap is compilation.

:class:`LocalEvaluator` with ``workers=N`` starts N worker processes
(``spawn``; they import only the backends) that compile the batch's
candidates ahead of the timing loop: each worker lowers the candidate with
stand-in weights of the right shapes (compilation depends on shapes, not
values), which fills XLA's persistent compilation cache, so the timing
process's own compile of that candidate is a cache read; a candidate that
fails to compile is known before the timing loop reaches it.  Validation
and timing then run here, on the real weights.  ``workers=0`` (the default
on machines with fewer than three cores, where a compile worker would take
the core timing needs) evaluates everything in this process.

The Ray evaluator (:mod:`egraft.search.ray_evaluator`) has the same
interface for searches that outgrow one machine.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from .cache import cache_root
from ..ir import Op, dtypes
from ..ir.serialize import graph_from_dict, graph_to_dict
from .candidate import Candidate, Executables, Outcome, Task, evaluate_one
from ..runtime.xla_cache import enable_xla_cache, xla_cache_dir  # noqa: F401 - used here and by callers


def default_workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if cores < 3 else min(4, cores - 2)


def _worker_init(path: str) -> None:
    enable_xla_cache(path)


def precompile(doc: dict, weight_types: dict, backend: str, knobs: tuple, device: str) -> str:
    """Lower one candidate with stand-in weights (in a worker); '' or why it failed to compile."""
    from ..backends import lower

    try:
        weights = {k: np.ones(s, dtypes.to_numpy(d)) for k, (s, d) in weight_types.items()}
        lower(graph_from_dict(doc, weights), backend, device, dict(knobs))
        return ""
    except Exception as e:  # noqa: BLE001 - reported as the candidate's failure
        return f"{type(e).__name__}: {e}"


class LocalEvaluator:
    """Evaluate in this process; with `workers` > 0, compile ahead in worker processes.

    ``memo`` keeps the last few lowered candidates (the search shares it, so
    its final comparison reuses what the evaluations lowered).
    """

    name = "local"

    def __init__(self, workers: int | None = None, memo: Executables | None = None):
        self.workers = default_workers() if workers is None else int(workers)
        self.memo = memo if memo is not None else Executables()
        self._pool = None

    def _ensure_pool(self):
        if self._pool is None:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            path = xla_cache_dir()
            enable_xla_cache(path)
            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                             initializer=_worker_init, initargs=(path,))
        return self._pool

    def run(self, task: Task, cands: Sequence[Candidate], bounds: Sequence[float],
            cap_s: float = math.inf) -> list[Outcome]:
        if not self.workers or len(cands) < 2 or task.fitness != "measured":
            return [evaluate_one(task, c, b, cap_s=cap_s, memo=self.memo) for c, b in zip(cands, bounds)]
        pool = self._ensure_pool()
        futures = []
        for c in cands:
            wt = {n.attrs["name"]: (n.shape, n.dtype) for n in c.graph.nodes
                  if n.op == Op.Input and n.attrs["role"] == "weight"}
            futures.append(pool.submit(precompile, graph_to_dict(c.graph), wt, c.backend, c.knobs, task.device))
        out = []
        for c, b, f in zip(cands, bounds, futures):
            try:
                why = f.result()
            except Exception:  # noqa: BLE001 - a dead worker breaks the pool: compile here, a new pool next run
                why = ""
                self.close()
            if why:
                out.append(Outcome(c.key, "failed", math.inf, estimate_s=b, message=why))
            else:
                out.append(evaluate_one(task, c, b, cap_s=cap_s, memo=self.memo))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
