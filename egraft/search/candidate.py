"""Evaluating candidates: compile, check against the reference, then time or price them.

A :class:`Task` is what every evaluation of one search shares: the user's
program (the oracle), input sets with the reference outputs computed once,
the device and the fitness.  :func:`evaluate_one` takes one candidate
(a program, a backend, knobs) to an :class:`Outcome` and never raises for
the candidate's sake: a compile error is ``failed``, a wrong answer is
``rejected`` (and can then never win), both with infinite time.

Validation compares with the float64 reference of the **user's** program,
never of the candidate itself, on two random non-zero input sets (one
passed as torch tensors, the call path users take, one as numpy arrays),
each output held to the tolerance the reference graph's error budget gives.

Fitness ``"measured"`` lowers the candidate and times calls through the
executable as users call it (torch tensors in, torch tensors out), with
:func:`egraft.measure.time` (median of repeats and their spread).
``"model"`` checks the program itself with the numpy interpreter (no device
needed) and prices it with the roofline cost model: the fitness when the
target device is absent, reported as an estimate.
"""

from __future__ import annotations

import hashlib
import json
import math
import time as _time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..backends import lower
from ..ir.evaluate import evaluate
from ..ir.graph import Graph
from ..measure import parse, random_inputs
from ..measure import time as time_call
from ..measure.validate import compare, reference

FITNESSES = ("measured", "model")
TARGET_S = 0.15  # seconds of timed calls per candidate (5..30 repeats)


def knob_items(knobs: Mapping[str, Any] | Sequence) -> tuple[tuple[str, Any], ...]:
    items = knobs.items() if isinstance(knobs, Mapping) else knobs
    return tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in items))


def candidate_key(graph: Graph, backend: str, knobs) -> str:
    """The memo key: the program's structural hash, the backend and its knobs."""
    text = json.dumps([graph.structural_hash(), backend, knob_items(knobs)], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Candidate:
    graph: Graph
    backend: str
    knobs: tuple[tuple[str, Any], ...]

    @property
    def key(self) -> str:
        return candidate_key(self.graph, self.backend, self.knobs)


@dataclass(frozen=True)
class Outcome:
    key: str
    status: str  # timed | estimated | rejected | failed | pruned | checked (validated, not timed)
    time_s: float
    spread: float = 0.0
    estimate_s: float = math.nan
    message: str = ""
    compile_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("timed", "estimated", "checked")


@dataclass(frozen=True, eq=False)
class Task:
    """What every candidate of one search is checked and measured against (a value: nothing writes it).

    The input sets default to two random ones for the seed, and their
    reference outputs (``wants``) are computed once here unless given (the
    Ray worker receives them with the task).
    """

    reference: Graph  # the user's program (or one block of it): the oracle
    device: str = "cpu"
    fitness: str = "measured"
    seed: int = 0
    inputs: list[list[np.ndarray]] = field(default_factory=list)
    wants: list[list[np.ndarray]] = field(default_factory=list, repr=False)

    def __post_init__(self):
        if self.fitness not in FITNESSES:
            raise ValueError(f"fitness must be one of {FITNESSES}, got {self.fitness!r}")
        inputs = self.inputs or [random_inputs(self.reference, self.seed + k) for k in (1, 2)]
        object.__setattr__(self, "inputs", [list(xs) for xs in inputs])
        if not self.wants:
            object.__setattr__(self, "wants", [reference(self.reference, xs) for xs in self.inputs])


def torch_inputs(xs):
    import torch  # noqa: F401 - the bridge converts with the torch its caller loaded

    from ..ir.tensors import to_torch

    return [to_torch(x, copy=False) for x in xs]


def own_state(graph: Graph, xs: Sequence) -> list:
    """`xs` with the state inputs (the last ``len(graph.state_ids)``) copied: a call updates state in place
    (``backends.base.Executable``), so each candidate's check gets its own and the shared sets stay as drawn."""
    n = len(graph.state_ids)
    if not n:
        return list(xs)
    return list(xs[:len(xs) - n]) + [x.clone() if hasattr(x, "detach") else np.array(x, copy=True)
                                     for x in xs[len(xs) - n:]]


def repeatable(graph: Graph, ex, inputs: list, saved: Sequence | None = None):
    """``lambda: ex(*inputs)``; with state, the state is put back before each call (a step counter or a cache
    position kept in state would otherwise move on every timed call, out of the cache's range).

    `saved`: the state's values to put back (tensors only read, e.g. views of a task's own input set, which
    nothing writes; several contenders can share them); default: a copy of the state in `inputs`.
    """
    n = len(graph.state_ids)
    if not n:
        return lambda: ex(*inputs)
    states = inputs[len(inputs) - n:]
    saved = [x.clone() for x in states] if saved is None else list(saved)

    def call():
        for x, v in zip(states, saved):
            x.copy_(v)
        return ex(*inputs)

    return call


def saved_state(task: Task) -> list:
    """The state of the task's first input set as tensors over the task's own arrays (read, never written):
    what :func:`repeatable` puts back before each timed call, without a copy of every state per candidate."""
    n = len(task.reference.state_ids)
    xs = task.inputs[0]
    return torch_inputs(xs[len(xs) - n:]) if n else []


def time_calls(fn, device: str, backend: str, repeats: int):
    """Time `fn()` (``ex(*inputs)``, :func:`repeatable`): ``do_bench`` on CUDA (it picks its own repeats), else
    `repeats` calls after one warm-up."""
    if parse(device).kind == "cuda":
        return time_call(fn, device)
    return time_call(fn, device, jax=backend == "jax", warmup=1, repeats=repeats)


def check(task: Task, run) -> str:
    """'' when `run(inputs)` agrees with the reference on every input set, else why not."""
    for k, (xs, want) in enumerate(zip(task.inputs, task.wants)):
        c = compare(task.reference, list(run(xs, k)), want)
        if not c.ok:
            return c.message or f"outputs differ from the reference (errors {c.errors}, allowed {c.tolerances})"
    return ""


def bound(graph: Graph, backend: str, knobs, device: str) -> float:
    from .cost import estimate

    try:
        return float(estimate(graph, backend, dict(knobs), device).bound_s)
    except Exception:  # noqa: BLE001 - a price that cannot be computed is no price, not a crash
        return math.nan


FIRST_CALL_CAP = 3.0  # x the cap, plus FIRST_CALL_SLACK_S for a first call's one-time costs
FIRST_CALL_SLACK_S = 1.0


class _OverCap(Exception):
    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = seconds


KEEP_EXECUTABLES = 3  # lowered candidates not yet judged, at most (a final comparison checks several, then times them)


class Executables:
    """Lowered candidates by (candidate, device, bound weights): the pinned ones, the fastest timed, a few more.

    Each search (and each Ray actor) owns one; tasks stay plain values that
    travel without executables in them.  The structural key leaves weight
    values out, so the bound arrays' identities go in (each entry keeps its
    graph, so those arrays stay alive and their ids cannot be reused).

    What is kept: the pinned candidates (the direct lowering, a search's
    seeds: the final comparison times them again); the fastest candidate
    timed so far (the search's likely winner, which the final comparison
    times again); and up to ``keep`` lowered candidates not yet judged
    (:meth:`judged`).  Once :func:`evaluate_one` has judged a candidate that
    is neither pinned nor the fastest, its executable is dropped: each one
    holds compiled code and its folded weights (tens of MB for a model; a
    JAX program with its weights as constants, hundreds).
    """

    def __init__(self, keep: int = KEEP_EXECUTABLES):
        self.keep = keep
        self.pinned: dict = {}
        self.recent: OrderedDict = OrderedDict()
        self.held: set[str] = set()  # candidate keys pinned whenever lowered (a search's seeds)
        self.best: tuple | None = None  # (memo key, (graph, executable)): the fastest timed so far, unpinned
        self.best_s = math.inf  # the fastest time judged so far, pinned candidates included

    def hold(self, keys) -> None:
        """Pin the candidates with these keys whenever they are lowered (the final comparison reuses them)."""
        self.held.update(keys)

    def release(self) -> None:
        """Drop every executable kept (the search is over)."""
        self.pinned.clear()
        self.recent.clear()
        self.held.clear()
        self.best, self.best_s = None, math.inf

    def size(self) -> int:
        """How many executables are kept now."""
        return len(self.pinned) + len(self.recent) + (self.best is not None and self.best[0] not in self.recent)

    @staticmethod
    def _key(cand: Candidate, device: str) -> tuple:
        return cand.key, str(device), tuple(sorted((k, id(v)) for k, v in cand.graph.weights.items()))

    def get(self, cand: Candidate, device: str, pin: bool = False):
        """`cand` lowered for `device`, from the memo when it is kept (pinned, the fastest, or not yet judged)."""
        key = self._key(cand, device)
        hit = self.pinned.get(key) or self.recent.get(key) or (self.best[1] if self.best and self.best[0] == key
                                                                else None)
        ex = hit[1] if hit else lower(cand.graph, cand.backend, device, dict(cand.knobs))
        if pin or cand.key in self.held:
            self.pinned[key] = (cand.graph, ex)
            self.recent.pop(key, None)
        elif key not in self.pinned:
            self.recent[key] = (cand.graph, ex)
            self.recent.move_to_end(key)
            while len(self.recent) > self.keep:
                self.recent.popitem(last=False)
        return ex

    def judged(self, cand: Candidate, device: str, outcome: "Outcome") -> None:
        """After `cand`'s evaluation: keep its executable only if pinned, or timed as the fastest so far."""
        key = self._key(cand, device)
        entry = self.recent.pop(key, None)  # None: pinned (kept anyway), or not lowered
        if outcome.status == "timed" and not outcome.message and outcome.time_s < self.best_s:
            self.best_s = outcome.time_s
            self.best = None if entry is None else (key, entry)  # the one it beat goes
        elif entry is not None and outcome.status == "checked":
            self.recent[key] = entry  # validated for a final comparison, which times it next


def evaluate_one(task: Task, cand: Candidate, est: float | None = None, *, cap_s: float = math.inf,
                 memo: Executables | None = None, pin: bool = False, timed: bool = True) -> Outcome:
    """Validate and time (or price) one candidate; never raises for the candidate's sake.

    `cap_s`: a candidate whose first timed call exceeds it is not repeated
    (the search passes a multiple of the best time so far).  `memo`: where
    lowered candidates are kept (None: lowered afresh).  ``timed=False``
    validates only: the outcome is ``checked``, its time the second checking
    call's (a warm call: enough to size later timings, not to compare).
    Once judged, the candidate's executable leaves `memo` unless it is kept
    there (:meth:`Executables.judged`).
    """
    out = _evaluate(task, cand, est, cap_s, memo, pin, timed)
    if memo is not None:
        memo.judged(cand, task.device, out)
    return out


def _evaluate(task: Task, cand: Candidate, est: float | None, cap_s: float, memo: Executables | None, pin: bool,
              timed: bool) -> Outcome:
    key = cand.key
    est = bound(cand.graph, cand.backend, cand.knobs, task.device) if est is None else est
    if task.fitness == "model":
        try:
            why = check(task, lambda xs, k: evaluate(cand.graph, xs))
        except Exception as e:  # noqa: BLE001
            return Outcome(key, "failed", math.inf, estimate_s=est, message=f"{type(e).__name__}: {e}")
        if why:
            return Outcome(key, "rejected", math.inf, estimate_s=est, message=why)
        return Outcome(key, "estimated", est if math.isfinite(est) else math.inf, estimate_s=est)
    t0 = _time.perf_counter()
    try:
        ex = (memo or Executables(0)).get(cand, task.device, pin)
    except Exception as e:  # noqa: BLE001
        return Outcome(key, "failed", math.inf, estimate_s=est, message=f"{type(e).__name__}: {e}")
    compile_s = _time.perf_counter() - t0
    second: list[float] = []  # the second checking call, timed: the first one warmed the executable up

    def run(xs, k):
        xs = own_state(task.reference, xs)
        if k == 0:
            t1 = _time.perf_counter()
            out = ex(*torch_inputs(xs))
            took = _time.perf_counter() - t1
            # a first call (warm-up costs and all) this far over the cap: a program that materialises what
            # the best one streams; neither validated nor timed further, it cannot win
            if took > FIRST_CALL_CAP * cap_s + FIRST_CALL_SLACK_S:
                raise _OverCap(took)
            return out
        t1 = _time.perf_counter()
        out = ex(*xs)
        second.append(_time.perf_counter() - t1)
        return out

    try:
        why = check(task, run)
    except _OverCap as over:
        return Outcome(key, "pruned", over.seconds, 0.0, est, compile_s=compile_s,
                       message=f"its first call took {over.seconds:.3g} s, far over the cap of {cap_s:.3g} s")
    except Exception as e:  # noqa: BLE001
        why = f"raised {type(e).__name__}: {e}"
    if why:
        return Outcome(key, "rejected", math.inf, estimate_s=est, message=why, compile_s=compile_s)
    if not timed:
        return Outcome(key, "checked", second[0] if second else math.nan, 0.0, est, compile_s=compile_s)
    if second and second[0] > cap_s:  # validated, and one call is evidence enough that it loses
        return Outcome(key, "timed", second[0], 0.0, est, message="one call only: slower than the cap",
                       compile_s=compile_s)
    # one snapshot of the state for every timed call: each starts from the state the inputs were drawn with
    call = repeatable(task.reference, ex, torch_inputs(own_state(task.reference, task.inputs[0])),
                      saved_state(task))
    try:
        t1 = _time.perf_counter()
        call()
        first = max(_time.perf_counter() - t1, 1e-7)
        if first > cap_s:  # far slower than the best so far: one call is evidence enough that it loses
            return Outcome(key, "timed", first, 0.0, est, message="one call only: slower than the cap",
                           compile_s=compile_s)
        t = time_calls(call, task.device, cand.backend, int(min(30, max(5, TARGET_S / first))))
    except Exception as e:  # noqa: BLE001
        return Outcome(key, "failed", math.inf, estimate_s=est, message=f"timing raised {e}", compile_s=compile_s)
    return Outcome(key, "timed", t.median, t.spread, est, compile_s=compile_s)
