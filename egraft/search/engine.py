"""``search(graph, config)``: saturate, search every distinct block, splice, compare every contender.

The steps, each timed in :attr:`SearchResult.stages`:

1. **Cache** (``cache``).  The key is the program's structural hash, the
   config's identity (device, backend request, fitness, rules digest,
   saturation limits, seed, per-block reuse) and the library versions
   (:mod:`.stored`).  An entry searched under a budget that covers the one
   asked for is returned at once; one from a smaller budget only joins the
   final comparison of a new search.
2. **Saturate** (``saturate``; unless a saturation of `graph` under the
   config's rules and limits is given).
3. **Reference** (``reference``): the input sets and the float64 reference
   outputs every candidate is checked against, computed once.
4. **Baseline** (``baseline``).  The direct lowering (the input graph, the
   first candidate backend for the device, default knobs) is lowered and
   validated; if the model's own program fails there, the search stops with
   a clear error.  A short timing (about ``candidate.TARGET_S`` of calls)
   sets the genetic search's cap; the final comparison times it again with
   the other contenders.
5. **Search** (``search``).  For a stitched saturation (repeated layers) one
   genetic search per distinct block, in its real context, the winner reused
   for every occurrence (:mod:`.per_block`); otherwise one search of the whole
   e-graph.  The population is seeded with the greedy and the
   cost-model-best extractions on each candidate backend, plus random genomes.
   Its share of the budget (``SEARCH_SHARE``, less what came before) also
   leaves out the final comparison's whole-program compiles of a per-block
   search: its fastest seed (``PER_BLOCK_SEEDS``) and the winner, each
   estimated by the baseline's.
6. **Final comparison** (``final_check``, ``final_timing``; :mod:`.final`).
   The direct lowering, every seeded extraction as a whole program (after a
   per-block search: the fastest measured, ``PER_BLOCK_SEEDS``), the
   spliced winner, its late-knob variants and any smaller-budget cached
   result, validated as whole programs and timed interleaved: the lowest
   median wins, so the search never returns a program that a seed it
   compares beats beyond noise.  A seed that the search itself measured over
   ``SCREEN`` times slower than the winner is not timed again.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, replace

from ..backends import candidates, get_backend
from ..backends.base import default_knobs, search_knobs
from ..errors import BackendError, InputError, SearchError
from ..ir.graph import Graph
from ..measure import available
from ..measure.memory import mark
from . import final, stored
from .cache import default_cache
from .candidate import Candidate, Executables, Task, evaluate_one, knob_items
from .config import Budget, CompileConfig
from .evaluators import LocalEvaluator
from .genetic import evolve
from .genome import GenomeSpace
from .per_block import block_tasks, splice
from .result import SearchResult, Trial
from .space import Space

SEARCH_SHARE = 0.85  # of the time budget, less what came before it: the genetic search's end
MIN_SEARCH_SHARE = 0.25  # ... never less than this share
FINAL_SHARE = 0.15  # of the time budget: the final comparison's timed calls (at least FINAL_MIN_S)
FINAL_MIN_S = 1.0
LATE_KNOB_BUDGET_S = 50.0  # late knobs need this budget: an Inductor compile takes seconds to tens of seconds
# on one core and cannot be stopped
SCREEN = 1.5  # a seed the search measured this many times slower than the winner is not timed again
PER_BLOCK_SEEDS = 1  # seeds of a per-block search compiled whole for the final comparison: the fastest measured


def candidate_backends(backend: str, device: str, state_in_place: bool = False) -> list[str]:
    """The backends the search may pick on `device`: `backend` when named, every one that runs there for auto
    (with `state_in_place`, those that write state in place where there are any: ``backends.candidates``)."""
    try:
        return candidates(backend, device, state_in_place)
    except BackendError as e:
        raise SearchError(str(e)) from None


def search(graph: Graph, config: CompileConfig | None = None, *, saturation=None, evaluator=None, inputs=None,
           progress=None, **options) -> SearchResult:
    """Search the programs equal to `graph` for the fastest on the config's device (module docstring).

    `config`: a :class:`CompileConfig`; `options` (``backend=``, ``device=``,
    ``budget=``, ``seed=``, ``fitness=``, ``cache=``, ``rules=``, ``limits=``,
    ``reuse_layers=``) are parsed into one, or change the one given.
    `saturation`: a saturation of `graph` under the config's rules and limits
    (the cache key assumes so).  `evaluator`: a :class:`LocalEvaluator`
    (default) or a Ray evaluator.  `inputs`: the input sets candidates are
    checked on (default: two random ones for the seed).  `progress`: a
    progress object, or True/False/None (None: the config's setting).
    """
    t0 = _time.perf_counter()
    if config is not None and not isinstance(config, CompileConfig):
        raise InputError(f"egraft.search.search(graph, config, **options): config must be a CompileConfig, got "
                         f"{config!r}; pass backend=, device=, budget= and seed= as keywords")
    if config is None:
        config = CompileConfig.parse(options, where="egraft.search.search")
    elif options:
        config = config.with_("egraft.search.search", **options)
    dev = config.device or "cpu"
    fitness = config.fitness or ("measured" if available(dev) else "model")
    if fitness == "measured" and not available(dev):
        raise SearchError(f"cannot measure on {dev!r}: it is not on this machine; use fitness='model' "
                          "to search by the cost model's estimates")
    config = config.with_(device=dev, fitness=fitness)
    backends = candidate_backends(config.backend, dev, config.state_in_place and bool(graph.state_ids))
    store = (default_cache() if config.cache is True else config.cache) if config.cache else None
    key = stored.key(graph, config)
    prior = stored.lookup(store, key, graph, t0) if store is not None else None
    if prior is not None and prior.budget.covers(config.budget):
        return prior.result
    from .progress import Progress

    plan = config.budget
    if progress in (None, True, False):
        progress = Progress(plan.seconds, plan.trials,
                            enabled=config.progress if progress is None else bool(progress))
    memo = getattr(evaluator, "memo", None) or Executables()
    own = evaluator is None
    evaluator = evaluator or LocalEvaluator(memo=memo)
    try:
        with progress:
            res = _Run(graph, config, backends, evaluator, memo, progress, t0).result(
                saturation, inputs, prior.result if prior is not None else None)
    finally:
        memo.release()
        if own:
            evaluator.close()
        # the candidates' executables and the reference outputs are garbage now: their pages go back to the OS
        # (a model's KV caches in float64, per input set: GBs the C heap would otherwise keep resident)
        from ..rewrites.session import return_freed_pages

        return_freed_pages()
    if store is not None and not res.interrupted:
        stored.save(store, key, res)
    return res


def search_seconds(plan: Budget, spent: float, program_s: float, finals: int) -> float | None:
    """The genetic search's seconds (None: no time limit): its share of the budget less the `spent` seconds
    before it, and less one whole-program compile and check (`program_s`, what the direct program's took) for
    each of the `finals` contenders a per-block search hands the final comparison and each of the
    ``plan.after`` programs that follow the search (a generation's other sizes); never below
    ``MIN_SEARCH_SHARE`` of the budget (a long model's whole-program compiles are seconds each)."""
    if plan.seconds is None:
        return None
    reserve = (finals + plan.after) * program_s
    return max(plan.seconds * MIN_SEARCH_SHARE, plan.seconds * SEARCH_SHARE - spent - reserve)


def _seeds(gs: GenomeSpace, space: Space, device: str) -> dict[str, list[int]]:
    """The seeded genomes by label: the greedy and the cost-model-best extraction on each backend."""
    from .cost import node_cost

    chs = {"greedy": space.greedy_choice()}
    try:
        chs["model"] = space.greedy_choice(node_cost(device=device))
    except Exception:  # noqa: BLE001 - no cost-model seed is a weaker start, not a failure
        pass
    return {f"{name}/{b}": gs.encode(ch, b) for name, ch in chs.items() for b in gs.backends}


@dataclass(frozen=True)
class _Searched:
    """What the genetic search stage yields: the final comparison's contenders and the search's log."""

    contenders: list  # final.Contender: each seed as a whole program, then the spliced winner
    winner: Candidate | None
    trials: list
    history: list
    counts: dict
    notes: list
    interrupted: bool
    blocks: dict


class _Run:
    """One search's stages; :meth:`result` runs them and builds the SearchResult once."""

    def __init__(self, graph, config, backends, evaluator, memo, progress, t0):
        self.graph, self.config, self.backends = graph, config, backends
        self.evaluator, self.memo, self.progress, self.t0 = evaluator, memo, progress, t0
        self.stages: dict[str, float] = {}
        self.notes: list[str] = []  # backends left out (_baseline), the search's share of a whole-compile budget
        self.dev, self.fitness = config.device, config.fitness

    def _elapsed(self) -> float:
        """Seconds of the budget spent so far: since the whole compile began (the budget's `started`), or this
        search."""
        started = self.config.budget.started
        return _time.perf_counter() - (self.t0 if started is None else min(started, self.t0))

    def _stage(self, name: str, t: float) -> float:
        now = _time.perf_counter()
        self.stages[name] = self.stages.get(name, 0.0) + now - t
        mark(name)
        return now

    def result(self, saturation, inputs, prior: SearchResult | None) -> SearchResult:
        graph, dev, plan = self.graph, self.dev, self.config.budget
        t = _time.perf_counter()
        if saturation is None:
            from ..rewrites import saturate

            # its own saturation: the search needs the snapshot alone, not egglog's e-graph (hundreds of MB)
            saturation = saturate(graph, self.config.rule_specs(), self.config.limits).drop_egraph()
            t = self._stage("saturate", t)
        task = Task(graph, dev, self.fitness, self.config.seed, [list(x) for x in inputs] if inputs else [])
        t = self._stage("reference", t)
        task, direct, base_out = self._baseline(task)
        t = self._stage("baseline", t)
        spent = self._elapsed()
        finals = PER_BLOCK_SEEDS + 1 if self.config.reuse_layers and saturation.parts else 0
        left = search_seconds(plan, spent, self.stages["baseline"], finals)
        if left is not None and plan.after:
            self.notes.append(f"the genetic search had {left:.0f} s of the {plan.seconds:.0f} s budget: {spent:.0f} s "
                              f"went before it (tracing, saturation, the baseline) and {plan.after} more program(s) "
                              f"of this model are compiled after it")
        search_plan = plan if left is None else Budget(left, plan.trials, plan.generations, plan.population,
                                                       plan.patience)
        searched = self._evolve(saturation, task, search_plan, base_out.time_s)
        t = self._stage("search", t)
        contenders = [final.Contender("direct", direct, base_out.time_s), *searched.contenders,
                      *self._late(searched.winner, plan.seconds, searched.notes)]
        if prior is not None:
            contenders.append(final.Contender("cached", Candidate(prior.graph, prior.backend,
                                                                  knob_items(prior.knobs))))
        allowance = None if plan.seconds is None else max(FINAL_MIN_S, plan.seconds * FINAL_SHARE)
        # the whole-program checks get what the budget has left before the timed calls' allowance
        check_s = None if plan.seconds is None else plan.seconds - allowance - self._elapsed()
        fin = final.run(task, contenders, self.memo, allowance, check_s)
        self.stages.update(fin.stages)
        return self._build(fin, searched, saturation, prior)

    def _baseline(self, task: Task, retried: bool = False):
        """The model's own program on the first backend (in priority order) it runs on: (task, candidate, outcome).
        A backend it fails on before that one is left out of the search, with a note saying why (the
        Triton backend on a GPU once failed to compile a rotary embedding while JAX ran it): one backend's bug costs
        its candidates, not the compile.  None runs: the input sets it agrees with the reference on, when some
        but not all (:meth:`_conditioned`), else SearchError naming each failure."""
        failed = []
        for name in self.backends:
            cand = self._own(name)
            out = evaluate_one(task, cand, memo=self.memo, pin=True)
            if out.ok:
                break
            failed.append((name, out.message or out.status))
        else:
            kept = None if retried else self._conditioned(task)
            if kept is not None:
                return self._baseline(kept, retried=True)
            raise SearchError(f"the model's own program does not run on {self.dev!r} with any backend: "
                              + "; ".join(f"{n}: {why}" for n, why in failed))
        self.backends = [b for b in self.backends if b not in {n for n, _ in failed}]
        self.notes += [f"backend {n} left out of the search: the model's own program failed on it ({why})"
                       for n, why in failed]
        return task, cand, out

    def _own(self, backend: str) -> Candidate:
        """The model's own program on `backend`, at its default knobs (the search's baseline)."""
        space = search_knobs(get_backend(backend), self.graph, self.config.weight_copies)
        return Candidate(self.graph, backend, knob_items(default_knobs(space)))

    def _conditioned(self, task: Task) -> Task | None:
        """`task` without the input sets on which the model's own program, unrewritten, disagrees with the
        float64 reference on every backend, when it agrees on at least one: such a set is ill-conditioned in
        the program's own precision (a serving engine's warm-up computes on unfilled buffers; a float32 RMS
        norm of values near 1e20 squares them to inf and returns zeros), so it cannot tell a right candidate
        from a wrong one.  Candidates are then validated on the other sets; the caller's check against its own
        reference (PyTorch, in the program's precision) still runs on every set.  None: no set to drop."""
        if len(task.inputs) < 2:
            return None
        good = []
        for k, (xs, want) in enumerate(zip(task.inputs, task.wants)):
            one = replace(task, inputs=[xs], wants=[want])
            for name in self.backends:
                if evaluate_one(one, self._own(name), pin=True, timed=False).ok:
                    good.append(k)
                    break
        if not good or len(good) == len(task.inputs):
            return None
        dropped = [k for k in range(len(task.inputs)) if k not in good]
        self.notes.append(f"input set(s) {dropped} left out of the validation: the model's own program, "
                          "unrewritten, disagrees with the float64 reference on them on every backend "
                          "(ill-conditioned in its own precision); candidates are validated on the others")
        return replace(task, inputs=[task.inputs[k] for k in good], wants=[task.wants[k] for k in good])

    def _evolve(self, saturation, task: Task, plan: Budget, baseline_s: float) -> "_Searched":
        """The genetic search per distinct block (or of the whole graph) and the contenders it yields."""
        graph, dev = self.graph, self.dev
        parts = block_tasks(saturation) if self.config.reuse_layers and saturation.parts else []
        jobs = ([(p.key, p.space, p.reference, p.nodes * p.occurrences, p.occurrences) for p in parts] if parts
                else [("", Space.from_egraph(saturation), graph, 1, 1)])
        total = sum(j[3] for j in jobs)
        trials, history, counts, notes = [], [], {}, []
        chosen: dict[str, Graph] = {}  # block key ("" for the whole graph) -> its chosen program
        seeds: dict[str, dict[str, tuple]] = {}  # label -> block key -> (candidate, outcome or None)
        heaviest, best_out, interrupted, winner_s = None, None, False, 0.0
        for key, space, ref, weight, occ in jobs:
            label = key[:12]
            btask = task if ref is graph else Task(ref, dev, self.fitness, self.config.seed)
            gs = GenomeSpace(space, space.greedy_choice(), self.backends, ref, self.config.weight_copies)
            sg = _seeds(gs, space, dev)
            scands = {name: gs.candidate(g) for name, g in sg.items()}
            if not parts:
                self.memo.hold(c.key for c in scands.values())  # whole programs: the final reuses them
            seeded = list(sg.values())
            population = [g for i, g in enumerate(seeded) if g not in seeded[:i]]  # a genome once
            ev = evolve(gs, btask, self.evaluator, plan.share(weight / total), self.config.seed, population,
                        self.progress, label, len(trials), baseline_s)
            trials += ev.trials
            history += ev.history
            for k, v in ev.counts.items():
                counts[k] = counts.get(k, 0) + v
            for name, c in scands.items():
                seeds.setdefault(name, {})[key] = (c, ev.outcomes.get(c.key), occ)
            interrupted |= ev.interrupted
            if ev.best_candidate is None:
                notes.append(f"block {label or 'graph'}: no candidate validated; its direct program is kept")
            else:
                chosen[key] = ev.best_candidate.graph
                score = ev.best_outcome.time_s * occ
                winner_s += score
                if heaviest is None or score > heaviest[0]:
                    heaviest = (score, ev.best_candidate)
                    best_out = ev.best_outcome
            if interrupted:
                break

        def whole(programs: dict[str, Graph]) -> Graph:
            # a block without a program (none validated, or not reached before Ctrl-C) keeps its own
            return splice(graph, saturation.parts, programs) if parts else programs[""]

        contenders = []
        complete = len(chosen) == len(jobs) and math.isfinite(winner_s)
        for name, per in seeds.items():
            outs = [o for _, o, _ in per.values()]
            if any(o is not None and o.status in ("rejected", "failed") for o in outs):
                continue  # a seed wrong in one block is wrong as a whole
            # only medians screen: a one-call time (a candidate stopped at the cap) carries first-call costs
            known = all(o is not None and o.status == "timed" and not o.message for o in outs) \
                and len(per) == len(jobs)
            seed_s = sum(o.time_s * occ for _, o, occ in per.values()) if known else math.nan
            if self.fitness == "measured" and complete and known and seed_s > SCREEN * winner_s:
                notes.append(f"seed {name} left out of the final comparison: the search measured it "
                             f"{seed_s / winner_s:.1f}x slower than its winner")
                continue
            first = next(iter(per.values()))[0]
            cand = Candidate(whole({k: c.graph for k, (c, _, _) in per.items()}), first.backend, first.knobs)
            contenders.append((seed_s, final.Contender(name, cand, None if parts else _checked(per[""][1]))))
        if parts and len(contenders) > PER_BLOCK_SEEDS:
            # each seed of a per-block search is a whole-program compile and check in the final comparison (494 M:
            # 5-6 s and a program's memory each): the seeds the blocks measured fastest go, the others are noted
            contenders.sort(key=lambda sc: (not math.isfinite(sc[0]), sc[0]))
            for _, c in contenders[PER_BLOCK_SEEDS:]:
                notes.append(f"seed {c.label} left out of the final comparison: its blocks measured slower than "
                             f"those of {', '.join(k.label for _, k in contenders[:PER_BLOCK_SEEDS])}")
            contenders = contenders[:PER_BLOCK_SEEDS]
        contenders = [c for _, c in contenders]
        winner = None
        if heaviest is not None:
            best = heaviest[1]
            winner = Candidate(whole(chosen), best.backend, best.knobs)
            contenders.append(final.Contender("searched", winner, None if parts else _checked(best_out)))
        blocks = {"distinct": len(parts), "occurrences": sum(p.occurrences for p in parts)} if parts else {}
        return _Searched(contenders, winner, trials, history, counts, notes, interrupted, blocks)

    def _late(self, winner: Candidate | None, budget_s: float | None, notes: list[str]) -> list:
        """The winner with each of its backend's late knobs (one long compile each), when the budget allows."""
        if winner is None or self.fitness == "model":
            return []
        out = []
        for name, value in get_backend(winner.backend).late_knobs.items():
            if dict(winner.knobs).get(name) == value:
                continue
            if budget_s is not None and budget_s < LATE_KNOB_BUDGET_S:
                notes.append(f"late knob {winner.backend}.{name}={value} not tried: its compile needs a budget of "
                             f"{LATE_KNOB_BUDGET_S:.0f} s or more (this one: {budget_s:.0f} s)")
                continue
            late = Candidate(winner.graph, winner.backend, knob_items({**dict(winner.knobs), name: value}))
            out.append(final.Contender(f"late {winner.backend}.{name}={value}", late))
        return out

    def _build(self, fin: final.Final, s: "_Searched", saturation, prior) -> SearchResult:
        from .cost import rank_correlation

        trials, notes, counts = list(s.trials), self.notes + s.notes + fin.notes, dict(s.counts)
        for row in fin.rows:  # late knobs are trials of their own (tried once, on the winner)
            if row["label"].startswith("late "):
                trials.append(Trial(len(trials), row["key"], "timed", row["time_s"], row["spread"],
                                    row["estimate_s"], row["backend"], -1, "", row["label"]))
                counts["timed"] = counts.get("timed", 0) + 1
        pairs = [(tr.estimate_s, tr.time_s) for tr in trials if tr.status == "timed" and math.isfinite(tr.estimate_s)]
        rho = rank_correlation([a for a, _ in pairs], [b for _, b in pairs]) if len(pairs) >= 3 else math.nan
        c = fin.chosen
        if c.label == "direct" and len(fin.rows) > 1:
            notes.append("the direct lowering measured as fast as every other contender; it is kept")
        if prior is not None:
            notes.append("a cached result from a smaller budget joined the final comparison"
                         + (" and won" if c.label == "cached" else ""))
        return SearchResult(
            c.cand.graph, c.cand.backend, dict(c.cand.knobs), fin.time_s, fin.baseline_time_s,
            history=s.history, counts=counts, device=self.dev, fitness=self.fitness, seed=self.config.seed,
            spread=fin.spread, baseline_spread=fin.baseline_spread, estimate_s=fin.estimate_s,
            baseline_estimate_s=fin.rows[0]["estimate_s"],
            search_s=_time.perf_counter() - self.t0, stages={k: round(v, 4) for k, v in self.stages.items()},
            trials=trials, blocks=s.blocks, rank_correlation=rho, interrupted=s.interrupted,
            noisy=fin.noisy, notes=notes, saturation={
                "classes": saturation.classes, "nodes": saturation.nodes, "iterations": saturation.iterations,
                "stop_reason": saturation.stop_reason, "seconds": round(saturation.seconds, 4)},
            verdict=fin.verdict, compared=fin.rows, budget=self.config.budget.effort(), built=fin.executable)


def _checked(out) -> float | None:
    """A whole program's outcome in the search as a final contender's check (None: check it again).  A program
    timed by one call only (slower than the cap at that moment) was validated all the same: it needs no second
    check, and its one call, an overstatement, only makes the final timing's calls per turn fewer.  (On a busy
    2-core machine the seeds of a tiny model's search were capped this way, and a short budget then left the
    greedy extraction out of the final comparison.)"""
    return out.time_s if out is not None and out.status in ("timed", "estimated") else None


__all__ = ["candidate_backends", "search"]
