"""The genetic search over one genome space (deap): seeded population, crossover, mutation, elitism.

Fitness is the candidate's validated time (measured, or the cost model's
estimate); a candidate that fails to compile or disagrees with the reference
gets infinite fitness, so it can never be selected as the best.  Programs are
memoised by structural hash + backend + knobs: an offspring that extracts to
a program seen before is answered from the memo, never compiled or timed
again.  Before a new candidate is run, its roofline bound is compared with
the best time so far: a candidate whose lower bound is already slower cannot
win and is not run (``pruned``).

Budget: seconds and/or distinct trials and/or generations; the search also
stops early when the best has not improved by more than the timing noise
for ``patience`` generations.  Deterministic for a seed (deap draws from
Python's ``random``, which is seeded here and restored afterwards) whenever
the fitness is (the cost model); measured times make selection follow the
measurements.  Ctrl-C ends the search with the best found so far.
"""

from __future__ import annotations

import math
import random
import time as _time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from deap import base, tools

from .candidate import Candidate, Outcome, Task, bound
from .config import Budget
from .genome import GenomeSpace
from .result import Round, Trial

PRUNE_MARGIN = 1.5  # a candidate is pruned when its roofline bound exceeds this times the best measured time
CAP = 4.0  # a candidate whose first call takes CAP x the best time so far is timed by that call alone
NOISE_FLOOR = 0.02  # an improvement under 2 % (or under the timings' spread) is not one


class _Fitness(base.Fitness):
    weights = (-1.0,)  # minimise time


class _Individual(list):
    def __init__(self, genes):
        super().__init__(genes)
        self.fitness = _Fitness()


@dataclass
class Evolution:
    """What one genome space's search found and how it went."""

    best: list[int] | None = None
    best_outcome: Outcome | None = None
    best_candidate: Candidate | None = None
    trials: list[Trial] = field(default_factory=list)
    history: list[Round] = field(default_factory=list)
    counts: dict = field(default_factory=lambda: dict(timed=0, estimated=0, rejected=0, failed=0, pruned=0, cached=0))
    interrupted: bool = False
    outcomes: dict = field(default_factory=dict)  # memo: candidate key -> Outcome


def _mutate(ind, sizes: Sequence[int], indpb: float):
    for i, n in enumerate(sizes):
        if n > 1 and random.random() < indpb:
            v = random.randrange(n - 1)
            ind[i] = v if v < ind[i] else v + 1
    return (ind,)


def evolve(gs: GenomeSpace, task: Task, evaluator, budget: Budget, seed: int = 0,
           seeds: Sequence[Sequence[int]] = (), progress=None, block: str = "", trial_offset: int = 0,
           baseline_s: float = math.nan, on_generation: Callable | None = None) -> Evolution:
    """Run the genetic search on `gs`; returns the best validated candidate found (and the log)."""
    ev = Evolution()
    state = random.getstate()
    random.seed(seed)
    t0 = _time.perf_counter()
    sizes = gs.sizes()
    indpb = min(0.5, 1.5 / max(1, sum(n > 1 for n in sizes)))

    def out_of_budget() -> bool:
        if budget.seconds is not None and _time.perf_counter() - t0 >= budget.seconds:
            return True
        return budget.trials is not None and len(ev.trials) >= budget.trials

    def best_s() -> float:
        return ev.best_outcome.time_s if ev.best_outcome is not None else math.inf

    def evaluate(pop: list[_Individual], gen: int) -> None:
        fresh: dict[str, tuple[Candidate, float]] = {}
        keyed = []
        for ind in pop:
            if ind.fitness.valid:
                continue
            cand = gs.candidate(ind)
            keyed.append((ind, cand))
            if cand.key in ev.outcomes or cand.key in fresh:
                ev.counts["cached"] += 1
                continue
            if out_of_budget() or (budget.trials is not None and len(ev.trials) + len(fresh) >= budget.trials):
                continue
            fresh[cand.key] = (cand, bound(cand.graph, cand.backend, cand.knobs, task.device))
        to_run = []
        # the cap: before anything validated, the direct lowering's time is the one to beat (a block's share
        # of it is smaller, so for a block this caps less, never wrongly)
        ceiling = min(best_s(), baseline_s if math.isfinite(baseline_s) else math.inf)
        for key, (cand, est) in fresh.items():
            # pruning trusts the bound only with a margin: a CPU calibrated on fewer threads than the
            # backends use prices programs above what they measure (seen: measured / bound 0.7 at two threads)
            if task.fitness == "measured" and math.isfinite(est) and est > PRUNE_MARGIN * best_s():
                ev.outcomes[key] = Outcome(key, "pruned", est, estimate_s=est, message="roofline bound above best")
                _log(key, ev.outcomes[key], cand, gen)
            else:
                to_run.append((cand, est))
        cap_s = CAP * ceiling
        chunk = max(1, getattr(evaluator, "workers", 0) or 0) * 2 or 1  # small batches: budget checked between
        for i in range(0, len(to_run), chunk):
            if i and out_of_budget():
                break
            part = to_run[i:i + chunk]
            outs = evaluator.run(task, [c for c, _ in part], [e for _, e in part], cap_s=cap_s)
            for (cand, est), out in zip(part, outs):
                ev.outcomes[cand.key] = out
                _log(cand.key, out, cand, gen)
        for ind, cand in keyed:
            out = ev.outcomes.get(cand.key)
            ind.fitness.values = (out.time_s if out is not None else math.inf,)  # pruned: its bound
            if out is not None and out.ok and out.time_s < best_s():
                ev.best, ev.best_outcome, ev.best_candidate = list(ind), out, cand

    def _log(key, out: Outcome, cand: Candidate, gen: int) -> None:
        ev.counts[out.status] = ev.counts.get(out.status, 0) + 1
        # a pruned candidate's time (its bound, or a first call over the cap) ranks it in the population; a
        # Trial's time is a validated one only
        time_s = out.time_s if out.status in ("timed", "estimated") else math.inf
        ev.trials.append(Trial(trial_offset + len(ev.trials), key, out.status, time_s, out.spread,
                               out.estimate_s, cand.backend, gen, block, out.message[:300]))

    def record(gen: int) -> None:
        g = Round(gen, best_s(), len(ev.trials), ev.counts["timed"] + ev.counts["estimated"],
                       ev.counts["rejected"] + ev.counts["failed"], ev.counts["cached"],
                       round(_time.perf_counter() - t0, 4), block)
        ev.history.append(g)
        if progress is not None:
            progress.update(gen, trial_offset + len(ev.trials), g.timed, g.best_s, baseline_s, block)
        if on_generation is not None:
            on_generation(g)

    try:
        pop = [_Individual(list(s)) for s in seeds][: budget.population]
        while len(pop) < budget.population:
            pop.append(_Individual(gs.random(random)))
        evaluate(pop, 0)
        record(0)
        stale, last_best, gen = 0, best_s(), 0
        while not out_of_budget() and (budget.generations is None or gen < budget.generations):
            gen += 1
            elite = tools.selBest(pop, 2)
            offspring = [_Individual(list(i)) for i in tools.selTournament(pop, len(pop) - len(elite), tournsize=3)]
            for a, b in zip(offspring[::2], offspring[1::2]):
                if random.random() < 0.7:
                    tools.cxUniform(a, b, 0.5)
            for ind in offspring:
                if random.random() < 0.9:
                    _mutate(ind, sizes, indpb)
            for ind in offspring:
                del ind.fitness.values
            evaluate(offspring, gen)
            pop = [_Individual(list(e)) for e in elite] + offspring
            for e, src in zip(pop, elite):
                e.fitness.values = src.fitness.values
            record(gen)
            noise = max(NOISE_FLOOR, ev.best_outcome.spread if ev.best_outcome else 0.0)
            if best_s() < last_best * (1 - noise):
                stale, last_best = 0, best_s()
            else:
                stale += 1
                if stale >= budget.patience:
                    break
    except KeyboardInterrupt:
        ev.interrupted = True
    finally:
        random.setstate(state)
    return ev
