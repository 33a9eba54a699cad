"""Evaluating candidates on a Ray cluster's devices: :class:`RayEvaluator`.

One Ray actor per device slot (``workers`` of them; an actor asks Ray for one
GPU when the device is CUDA) compiles, checks **and** times the candidates
it is given, so every timing happens in the process that owns the device,
one candidate at a time, as in :class:`~egraft.search.evaluators.LocalEvaluator`.
A batch is spread over the actors as they come free and gathered in order.

What travels: each :class:`Task` goes to the object store once (the
reference graph as :func:`~egraft.ir.serialize.graph_to_dict` plus its
weights, the input sets and their reference outputs); an actor fetches it
the first time a call names it and keeps the last few tasks (model blocks)
by id.  A candidate travels as its structure, backend and knobs; its weights
go to the object store in chunks, each array once per task, and are bound
again by name in the actor.  Outcomes are :func:`evaluate_one`'s, so with
fitness ``"model"`` they equal the local evaluator's.  A dead actor is
replaced and its candidate tried once more on the new one (the old one may
have died of something else); a candidate that kills that one too comes
back ``failed``: nothing raises for a candidate's sake.  On a remote
cluster egraft must be installed on the workers.  ``device`` (default: the
task's) is where actors time; an actor sees only the GPU Ray gave it, so
``cuda:N`` runs as ``cuda``.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import SearchError
from ..measure import parse
from ..ir.serialize import graph_from_dict, graph_to_dict
from .candidate import Candidate, Executables, Outcome, Task, bound, evaluate_one

KEEP_TASKS = 4  # tasks (model blocks) an actor and the driver keep; an evicted one is fetched again
NEEDS_RAY = "the Ray evaluator needs Ray: pip install 'egraft[ray]'"


def _import_ray():
    try:
        import ray
    except ImportError:
        raise SearchError(NEEDS_RAY) from None
    return ray


class _Worker:
    """The actor: rebuilds tasks and candidates from the object store and evaluates them."""

    def __init__(self, device: str | None):
        self.device = device
        self.tasks: OrderedDict[str, tuple[Task, dict]] = OrderedDict()  # id -> (task, weight chunks)
        self.memo = Executables()
        self.xla = False

    def _task(self, task_id: str, task_ref) -> tuple[Task, dict]:
        import ray

        if task_id not in self.tasks:
            d = ray.get(task_ref[0])
            # the wants travel with it: no second reference run per actor
            task = Task(graph_from_dict(d["doc"], _own(d["weights"])), parse(self.device or d["device"]).kind,
                        d["fitness"], d["seed"], d["inputs"], d["wants"])
            self.tasks[task_id] = (task, {})
            while len(self.tasks) > KEEP_TASKS:
                self.tasks.popitem(last=False)
        self.tasks.move_to_end(task_id)
        return self.tasks[task_id]

    def evaluate(self, task_id: str, task_ref: list, doc: dict, backend: str, knobs: tuple,
                 est: float, chunks: list, cap_s: float = math.inf) -> Outcome:
        import ray

        task, loaded = self._task(task_id, task_ref)
        weights: dict = {}
        for ref in chunks:  # later chunks win: they hold the arrays that changed
            if ref.hex() not in loaded:
                loaded[ref.hex()] = _own(ray.get(ref))
            weights.update(loaded[ref.hex()])
        if task.fitness == "measured" and not self.xla:
            from .evaluators import enable_xla_cache, xla_cache_dir

            enable_xla_cache(xla_cache_dir())
            self.xla = True
        # a record that does not rebuild raises here: the driver reports the candidate failed
        return evaluate_one(task, Candidate(graph_from_dict(doc, weights), backend, knobs), est, cap_s=cap_s,
                            memo=self.memo)


def _own(weights: dict) -> dict:
    """Writable copies of arrays read from the object store (those are read-only views)."""
    return {k: (v if v.flags.writeable else np.array(v)) for k, v in weights.items()}


@dataclass
class _Shipped:
    """The driver's record of one task in the object store."""

    task_id: str
    owner: Any  # a weakref to the Task (an id alone could be reused by a new object)
    ref: Any
    names: dict = field(default_factory=dict)  # weight name -> id() of the array shipped for it
    chunks: list = field(default_factory=list)  # refs of weight chunks, in order
    keep: list = field(default_factory=list)  # the shipped arrays, alive while their ids are recorded


class RayEvaluator:
    """Evaluate candidates on a Ray cluster: one actor per device slot compiles and times them."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None, device: str | None = None,
                 init_kwargs: dict | None = None):
        self._ray = ray = _import_ray()
        self.address = address
        self.workers = None if workers is None else max(1, int(workers))
        self.device = device
        self._started = False
        if not ray.is_initialized():
            kw = dict(init_kwargs or {})
            if address is None:
                kw = {"num_cpus": self.workers or 1, "include_dashboard": False, "log_to_driver": False,
                      "ignore_reinit_error": True, **kw}
            else:
                kw["address"] = address
            ray.init(**kw)
            self._started = True
        self._actors: list = []
        self._classes: dict = {}  # device kind -> the remote actor class
        self._kind: str | None = None
        self._shipped: OrderedDict[int, _Shipped] = OrderedDict()
        self._count = 0

    # -- actors -------------------------------------------------------------------------------------
    def _new_actor(self):
        if self._kind not in self._classes:  # a CUDA actor holds one GPU, a CPU actor one core
            opts = {"num_cpus": 0, "num_gpus": 1} if self._kind == "cuda" else {"num_cpus": 1}
            self._classes[self._kind] = self._ray.remote(**opts)(_Worker)
        return self._classes[self._kind].remote(self.device)

    def _ensure_actors(self, task: Task) -> None:
        kind = parse(self.device or task.device).kind
        if self._actors and kind == self._kind:
            return
        self._kill_actors()
        res = self._ray.cluster_resources()
        unit = "GPU" if kind == "cuda" else "CPU"
        have = int(res.get(unit, 0))
        n = self.workers or (max(1, have) if kind == "cuda" else 1)
        if have < n:
            raise SearchError(
                f"the Ray evaluator wants {n} worker(s) with one {unit} each on {kind!r}, but the Ray cluster "
                f"has {have} {unit}(s); pass workers={max(have, 1)} or add {unit}s to the cluster")
        self._kind = kind
        self._actors = [self._new_actor() for _ in range(n)]

    def _kill_actors(self) -> None:
        for a in self._actors:
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors = []

    # -- shipping -----------------------------------------------------------------------------------
    def _ship_task(self, task: Task) -> _Shipped:
        s = self._shipped.get(id(task))
        if s is not None and s.owner() is task:
            self._shipped.move_to_end(id(task))
            return s
        ref = task.reference
        doc = {"doc": graph_to_dict(ref), "weights": dict(ref.weights), "device": task.device,
               "fitness": task.fitness, "seed": task.seed, "inputs": task.inputs, "wants": task.wants}
        self._count += 1
        s = _Shipped(f"task-{self._count}", weakref.ref(task), self._ray.put(doc))
        self._shipped[id(task)] = s
        while len(self._shipped) > KEEP_TASKS:
            self._shipped.popitem(last=False)
        return s

    def _ship_weights(self, s: _Shipped, weights) -> list:
        new = {k: v for k, v in weights.items() if s.names.get(k) != id(v)}
        if any(k in s.names for k in new):  # a name bound to another array: start the chunks afresh
            s.names, s.chunks, s.keep, new = {}, [], [], dict(weights)
        if new:
            s.chunks.append(self._ray.put(new))
            s.names.update({k: id(v) for k, v in new.items()})
            s.keep.append(new)
        return list(s.chunks)

    # -- the evaluator interface --------------------------------------------------------------------
    def run(self, task: Task, cands: Sequence[Candidate], bounds: Sequence[float],
            cap_s: float = math.inf) -> list[Outcome]:
        if not cands:
            return []
        ray = self._ray
        self._ensure_actors(task)
        s = self._ship_task(task)
        ests = [bound(c.graph, c.backend, c.knobs, task.device) if b is None else b for c, b in zip(cands, bounds)]
        out: list[Outcome | None] = [None] * len(cands)
        tries = [0] * len(cands)
        todo = list(range(len(cands)))[::-1]  # popped from the end: in order
        free = list(range(len(self._actors)))[::-1]
        flying: dict = {}  # ref -> (candidate index, actor slot)
        while todo or flying:
            while todo and free:
                i, slot = todo.pop(), free.pop()
                c, tries[i] = cands[i], tries[i] + 1
                ref = self._actors[slot].evaluate.remote(
                    s.task_id, [s.ref], graph_to_dict(c.graph), c.backend, c.knobs, ests[i],
                    self._ship_weights(s, c.graph.weights), cap_s)
                flying[ref] = (i, slot)
            done, _ = ray.wait(list(flying), num_returns=1)
            for ref in done:
                i, slot = flying.pop(ref)
                free.append(slot)
                try:
                    out[i] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    # the worker died (or was dead already): a fresh one tries the candidate once more,
                    # and a candidate that kills that one too has failed
                    self._actors[slot] = self._new_actor()
                    if tries[i] < 2:
                        todo.append(i)
                    else:
                        out[i] = self._failed(cands[i], ests[i], "the Ray worker died while evaluating it", e)
                except Exception as e:  # noqa: BLE001 - anything else the call raised is the candidate's failure
                    out[i] = self._failed(cands[i], ests[i], "", getattr(e, "cause", None) or e)
        return out  # type: ignore[return-value]

    @staticmethod
    def _failed(cand: Candidate, est: float, what: str, e: BaseException) -> Outcome:
        why = f"{what + ': ' if what else ''}{type(e).__name__}: {str(e)[:500]}"
        return Outcome(cand.key, "failed", math.inf, estimate_s=est, message=why)

    def close(self) -> None:
        if self._ray.is_initialized():
            self._kill_actors()
            if self._started:
                self._ray.shutdown()
        self._actors, self._shipped = [], OrderedDict()
        self._started = False
