"""``search(graph, ...)``: saturate, search every distinct block, splice, compare with the direct lowering.

The steps, each visible in :class:`SearchResult`:

1. **Cache.**  A result for the same program (structural hash), device,
   backend request, fitness and library versions is returned at once.
2. **Saturate** (unless a saturation result is given).
3. **Baseline.**  The direct lowering (the input graph, the default backend
   for the device, default knobs) is validated and measured first; if the
   model's own program fails there, the search stops with a clear error.
4. **Search.**  For a stitched saturation (repeated layers) one genetic
   search per distinct block, in its real context, the winner reused for
   every occurrence (:mod:`.layered`); otherwise one search of the whole
   e-graph.  The population is seeded with the greedy and the
   cost-model-best extractions for each backend, plus random genomes.
5. **Final comparison.**  The spliced program is validated as a whole and
   timed against the direct lowering, interleaved round by round, so both
   see the same machine; the lower median wins (a search never returns a
   program slower than the direct lowering), and a spread above the noise
   threshold is flagged (``noisy``) rather than hidden.
"""

from __future__ import annotations

import math
import time as _time

from ..backends import get_backend, resolve
from ..backends.base import default_knobs
from .cache import Cache, CacheKey, default_cache, device_id
from ..errors import BackendError, IRError, SearchError
from ..ir.graph import Graph
from ..ir.serialize import graph_from_dict, graph_to_dict
from ..measure import available, interleaved, noisy, parse
from .candidate import Candidate, Task, bound, evaluate_one, executable, knob_items, torch_inputs
from .evaluators import LocalEvaluator
from .genetic import Budget, evolve
from .genome import LATE_KNOBS, GenomeSpace
from .per_block import block_tasks, splice
from .result import SearchResult, Trial
from .space import Space

ORDER = {"cpu": ("jax", "torch"), "cuda": ("triton", "jax", "torch"), "tpu": ("jax",)}
FINAL_ROUNDS = 5
LATE_KNOB_MIN_S = 10.0  # an Inductor compile takes seconds to tens of seconds on one core and cannot be stopped
MAX_FINAL_CALLS = 7  # per turn; fewer when the budget's remainder is short (a 12-layer model: 0.1 s a call)
SEARCH_SHARE = 0.8  # of the time budget, less saturation's and the baseline's time; the rest: the final comparison
MIN_SEARCH_SHARE = 0.25


def candidate_backends(backend: str, device: str) -> list[str]:
    """The backends the search may pick on `device`: one when named, all that run there for 'auto'."""
    kind = parse(device).kind
    if backend != "auto":
        b = get_backend(backend)
        if kind not in b.devices:
            raise SearchError(f"backend {backend!r} does not run on {device!r} (it runs on {', '.join(b.devices)})")
        return [backend]
    out = []
    for name in ORDER[kind]:
        try:
            if kind in get_backend(name).devices:
                out.append(name)
        except (BackendError, ImportError):
            continue
    if not out:
        raise SearchError(f"no backend runs on {device!r} here; install jax (or torch) for it")
    return out


def _key(graph: Graph, backend: str, device: str, fitness: str) -> CacheKey:
    return CacheKey(program=graph.structural_hash(), device=device_id(device), backend=backend,
                    knobs={"search": "genetic/1", "fitness": fitness})


def _from_cache(doc: dict, graph: Graph, t0: float) -> SearchResult | None:
    try:
        prog = graph_from_dict(doc["graph"], graph.weights)
        s = doc["summary"]
        res = SearchResult(prog, s["backend"], dict(s["knobs"]), float(s["time_s"]), float(s["baseline_time_s"]),
                           device=s["device"], fitness=s["fitness"], seed=s["seed"], spread=s["spread"] or 0.0,
                           baseline_spread=s["baseline_spread"] or 0.0, counts=dict(s["counts"]),
                           estimate_s=s["estimate_s"] or math.nan, blocks=dict(s["blocks"]),
                           baseline_estimate_s=s["baseline_estimate_s"] or math.nan, noisy=bool(s["noisy"]),
                           rank_correlation=s["rank_correlation"] or math.nan, from_cache=True,
                           notes=list(s["notes"]) + ["returned from the search cache"],
                           saturation=dict(s.get("saturation") or {}))
    except (KeyError, TypeError, ValueError, IRError):
        return None  # an entry of another shape: search again (and overwrite it)
    if prog.input_names() != graph.input_names() or prog.output_types() != graph.output_types():
        return None
    res.search_s = _time.perf_counter() - t0
    res.stages = {"cache": round(res.search_s, 4)}
    return res


def _interleaved(task: Task, cands: list[Candidate], rounds: int, calls: int = MAX_FINAL_CALLS) -> list:
    """Time each candidate `rounds` times in turn (same machine state for all), `calls` calls a turn; a Timing each."""
    exes = [executable(task, c) for c in cands]
    tin = torch_inputs(task.inputs[0])
    fns = {str(k): (lambda ex=ex: ex(*tin)) for k, ex in enumerate(exes)}
    out = interleaved(fns, task.device, rounds, calls, jax={str(k) for k, c in enumerate(cands) if c.backend == "jax"})
    return [out[str(k)] for k in range(len(cands))]


def final_calls(allowance_s: float | None, per_call_s: float) -> int:
    """Calls per turn of the final comparison, so its FINAL_ROUNDS turns (each with a warm-up call) fit the allowance."""
    if allowance_s is None or not math.isfinite(per_call_s) or per_call_s <= 0:
        return MAX_FINAL_CALLS
    return max(1, min(MAX_FINAL_CALLS, int(allowance_s / (FINAL_ROUNDS * per_call_s)) - 1))


def _seeds(gs: GenomeSpace, space: Space, device: str) -> list[list[int]]:
    from .cost import node_cost

    chs = [space.greedy_choice()]
    try:
        chs.append(space.greedy_choice(node_cost(device=device)))
    except Exception:  # noqa: BLE001 - no cost-model seed is a weaker start, not a failure
        pass
    out = []
    for ch in chs:
        for b in gs.backends:
            g = gs.encode(ch, b)
            if g not in out:
                out.append(g)
    return out


def search(graph: Graph, backend: str = "auto", device: str = "cpu", budget=None, seed: int = 0, *,
           saturation=None, fitness: str | None = None, evaluator=None, cache: bool | Cache = True,
           progress=None, inputs=None, reuse_layers: bool = True, rules=None, limits=None) -> SearchResult:
    """Search the programs equal to `graph` for the fastest on `device`; see the module docstring.

    `budget`: seconds (a number, ``"60s"``, ``"2m"``) or a :class:`Budget`
    (seconds / trials / generations / population); default 30 s.
    `fitness`: ``"measured"`` (default where the device exists) or ``"model"``
    (the roofline estimate; the default for an absent device).  `evaluator`:
    a :class:`LocalEvaluator` (default) or a Ray evaluator.  `cache`: True
    (the default cache), False, or a :class:`egraft.search.cache.Cache`.  `progress`:
    None (a progress bar on a terminal), True/False, or a progress object.
    """
    t0 = _time.perf_counter()
    dev = str(parse(device))
    fitness = fitness or ("measured" if available(dev) else "model")
    if fitness == "measured" and not available(dev):
        raise SearchError(f"cannot measure on {dev!r}: it is not on this machine; use fitness='model' "
                          "to search by the cost model's estimates")
    backends = candidate_backends(backend, dev)
    plan = Budget.of(budget)
    store = (default_cache() if cache is True else cache) if cache else None
    key = _key(graph, backend, dev, fitness)
    if store is not None:
        doc = store.get(key)
        hit = _from_cache(doc, graph, t0) if doc else None
        if hit is not None:
            return hit
    from .progress import Progress

    prog = progress if progress not in (None, True, False) else Progress(
        plan.seconds, plan.trials, enabled=None if progress is None else bool(progress))
    own = evaluator is None
    evaluator = evaluator or LocalEvaluator()
    stages: dict[str, float] = {}
    try:
        with prog:
            res = _run(graph, backends, backend, dev, plan, seed, saturation, fitness, evaluator, prog, inputs,
                       reuse_layers, rules, limits, stages)
    finally:
        if own:
            evaluator.close()
    res.search_s = _time.perf_counter() - t0
    res.stages = {k: round(v, 4) for k, v in stages.items()}
    if store is not None and not res.interrupted:
        store.put(key, {"graph": graph_to_dict(res.graph), "summary": res.summary()})
    return res


def _run(graph, backends, backend, dev, plan, seed, saturation, fitness, evaluator, prog, inputs, reuse_layers,
         rules, limits, stages) -> SearchResult:
    t = _time.perf_counter()
    if saturation is None:
        from ..rewrites import saturate

        saturation = saturate(graph, rules, limits)
        stages["saturate"] = _time.perf_counter() - t
    # baseline: the direct lowering
    t = _time.perf_counter()
    base_backend = resolve(backend, dev)
    base_backend = base_backend if base_backend in backends else backends[0]
    task = Task(graph, dev, fitness, seed, [list(x) for x in inputs] if inputs else [])
    direct = Candidate(graph, base_backend, knob_items(default_knobs(get_backend(base_backend).knobs(graph))))
    base_out = evaluate_one(task, direct, pin=True)
    if not base_out.ok:
        raise SearchError(f"the model's own program does not run on {base_backend!r} on {dev!r}: "
                          f"{base_out.message or base_out.status}")
    stages["baseline"] = _time.perf_counter() - t
    # search
    t = _time.perf_counter()
    # the genetic search gets what saturation and the baseline left of its share (never under MIN_SEARCH_SHARE)
    left = max(plan.seconds * MIN_SEARCH_SHARE, plan.seconds * SEARCH_SHARE - sum(stages.values())) \
        if plan.seconds is not None else None
    search_plan = plan if plan.seconds is None else Budget(left, plan.trials, plan.generations,
                                                           plan.population, plan.patience)
    parts = block_tasks(saturation) if reuse_layers and saturation.parts else []
    res = SearchResult(graph, base_backend, dict(direct.knobs), base_out.time_s, base_out.time_s, device=dev,
                       fitness=fitness, seed=seed, spread=base_out.spread, baseline_spread=base_out.spread,
                       estimate_s=base_out.estimate_s, baseline_estimate_s=base_out.estimate_s)
    counts: dict[str, int] = {}
    jobs = ([(p.key, p.space, p.reference, p.nodes * p.occurrences, p.occurrences) for p in parts] if parts
            else [("", Space.from_egraph(saturation), graph, 1, 1)])
    total = sum(j[3] for j in jobs)
    chosen: dict[str, Graph] = {}  # block key ("" for the whole graph) -> its chosen program
    heaviest = None
    for key, space, ref, weight, occ in jobs:
        label = key[:12]
        btask = task if ref is graph else Task(ref, dev, fitness, seed)
        gs = GenomeSpace(space, space.greedy_choice(), backends, ref)
        ev = evolve(gs, btask, evaluator, search_plan.share(weight / total), seed, _seeds(gs, space, dev), prog,
                    label, len(res.trials), base_out.time_s)
        res.trials += ev.trials
        res.history += ev.history
        for k, v in ev.counts.items():
            counts[k] = counts.get(k, 0) + v
        res.interrupted |= ev.interrupted
        if ev.best_candidate is None:
            res.notes.append(f"block {label or 'graph'}: no candidate validated; its direct program is kept")
            continue
        chosen[key] = ev.best_candidate.graph
        score = ev.best_outcome.time_s * occ
        if heaviest is None or score > heaviest[0]:
            heaviest = (score, ev.best_candidate)
        if res.interrupted:
            break
    res.counts = counts
    res.saturation = {"classes": saturation.classes, "nodes": saturation.nodes,
                      "iterations": saturation.iterations, "stop_reason": saturation.stop_reason,
                      "seconds": round(saturation.seconds, 4)}
    res.blocks = {"distinct": len(parts), "occurrences": sum(p.occurrences for p in parts)} if parts else {}
    stages["search"] = _time.perf_counter() - t
    if heaviest is None:
        return res  # nothing beat or even matched: the direct lowering stands
    cand_b = heaviest[1]
    # a block without a winner (none validated, or not reached before Ctrl-C) keeps its own program
    program = splice(graph, saturation.parts, chosen) if parts else chosen[""]
    best = Candidate(program, cand_b.backend, cand_b.knobs)
    allowance = None if plan.seconds is None else max(2.0, plan.seconds * (1 - SEARCH_SHARE))
    return _final(res, task, direct, best, base_out, stages, allowance)


def _final(res: SearchResult, task: Task, direct: Candidate, best: Candidate, base_out, stages,
           allowance: float | None = None) -> SearchResult:
    t = _time.perf_counter()
    from .cost import rank_correlation

    pairs = [(tr.estimate_s, tr.time_s) for tr in res.trials if tr.status == "timed" and math.isfinite(tr.estimate_s)]
    if len(pairs) >= 3:
        res.rank_correlation = rank_correlation([a for a, _ in pairs], [b for _, b in pairs])
    if best.key == direct.key:
        stages["final"] = _time.perf_counter() - t
        return res
    out = evaluate_one(task, best)
    if not out.ok:  # a spliced program that fails as a whole is never returned
        res.notes.append(f"the searched program failed as a whole ({out.status}: {out.message[:200]}); "
                         "the direct lowering is kept")
        stages["final"] = _time.perf_counter() - t
        return res
    if task.fitness == "model":
        if out.time_s < base_out.time_s:
            res.graph, res.backend, res.knobs = best.graph, best.backend, dict(best.knobs)
            res.time_s, res.estimate_s = out.time_s, out.estimate_s
        stages["final"] = _time.perf_counter() - t
        return res
    for (b, name), value in LATE_KNOBS.items():  # expensive knobs: tried once, on the winner, if time is left
        if best.backend != b or dict(best.knobs).get(name) == value:
            continue
        if allowance is not None and allowance < LATE_KNOB_MIN_S:
            res.notes.append(f"late knob {b}.{name}={value} not tried: its compile does not fit the "
                             f"{allowance:.0f} s the budget keeps for the end")
            continue
        late = Candidate(best.graph, b, knob_items({**dict(best.knobs), name: value}))
        lo = evaluate_one(task, late)
        res.counts[lo.status] = res.counts.get(lo.status, 0) + 1
        res.trials.append(Trial(len(res.trials), late.key, lo.status, lo.time_s, lo.spread, lo.estimate_s, b,
                                -1, "", f"late knob {name}={value}: {lo.message}"[:300]))
        if lo.ok and lo.time_s < out.time_s:
            best, out = late, lo
    tb, tw = _interleaved(task, [direct, best], FINAL_ROUNDS, final_calls(allowance, base_out.time_s + out.time_s))
    res.baseline_time_s, res.baseline_spread = tb.median, tb.spread
    res.noisy = noisy(tb) or noisy(tw)
    if tw.median < tb.median:
        res.graph, res.backend, res.knobs = best.graph, best.backend, dict(best.knobs)
        res.time_s, res.spread, res.estimate_s = tw.median, tw.spread, bound(best.graph, best.backend, best.knobs,
                                                                            task.device)
    else:
        res.time_s, res.spread = tb.median, tb.spread
        res.notes.append("the direct lowering measured as fast as the searched program; it is kept")
    stages["final"] = _time.perf_counter() - t
    return res
