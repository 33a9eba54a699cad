"""What a search returns: the chosen program, how it was measured, and how the search went."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import Graph

from .statuses import COUNT_KEYS, STATUSES  # noqa: F401 - re-exported: the names results are read by


def jsonable(v: Any) -> Any:
    """Non-finite floats to None and numpy scalars to Python ones, at any depth (strict JSON)."""
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, (str, bool, int)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    item = getattr(v, "item", None)  # numpy scalar
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError):
            pass
    return str(v)


@dataclass(frozen=True)
class Trial:
    """One distinct candidate the search looked at, in the order it was first evaluated.

    ``status``: ``timed`` (validated and measured), ``estimated`` (validated,
    priced by the cost model: the target device is absent or
    ``fitness="model"``), ``rejected`` (ran but disagreed with the reference:
    it can never win), ``failed`` (did not compile or crashed), ``pruned``
    (its roofline bound could not beat the best time so far, not run).
    """

    index: int
    key: str
    status: str
    time_s: float  # measured median (or the estimate under fitness="model"); inf unless timed/estimated
    spread: float  # relative spread of the repeats (0 for estimates)
    estimate_s: float  # the cost model's roofline bound
    backend: str
    generation: int  # -1: a late knob (an expensive compile) tried once on the winner
    block: str = ""  # which distinct block (template) it belongs to, "" for a whole-graph search
    message: str = ""

    def as_dict(self) -> dict:
        return jsonable(self.__dict__)


@dataclass(frozen=True)
class Round:
    """The state after one generation: best fitness so far and what was evaluated up to then."""

    index: int
    best_s: float
    trials: int  # distinct candidates evaluated so far
    timed: int
    rejected: int
    cached: int  # offspring answered from the memo (a program seen before) so far
    elapsed_s: float
    block: str = ""

    def as_dict(self) -> dict:
        return jsonable(self.__dict__)


@dataclass
class SearchResult:
    """The searched program and the evidence for it.

    Built once, by the search (or from a cache entry), from what its stages
    produced.  ``graph`` is the chosen program (weights bound), lowered with
    ``backend`` and ``knobs``; :attr:`executable` is that lowering as the
    search built and measured it (a cached result lowers it on first use).
    ``time_s`` / ``baseline_time_s`` are medians of the final interleaved
    comparison of every contender (the direct lowering -- the input graph,
    the backend's default knobs --, the seeded greedy and cost-model
    extractions, the genetic search's winner), with relative spreads
    ``spread`` / ``baseline_spread``; ``compared`` lists each contender's
    median there.  ``verdict`` is :func:`egraft.measure.compare` of the chosen
    program against the direct lowering; ``noisy`` says that comparison could
    not conclude because the machine was too busy.  Under
    ``fitness="model"`` times are the cost model's estimates and
    ``estimated`` is True.  ``counts`` holds how many distinct candidates
    were timed / rejected / failed / pruned and how many offspring the memo
    answered (``cached``).  ``budget`` is the budget searched under (what the
    cache compares a later request with).
    """

    graph: Graph
    backend: str
    knobs: dict
    time_s: float
    baseline_time_s: float
    history: list[Round] = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    device: str = "cpu"
    fitness: str = "measured"
    seed: int = 0
    spread: float = 0.0
    baseline_spread: float = 0.0
    estimate_s: float = math.nan  # roofline bound of the chosen program
    baseline_estimate_s: float = math.nan
    search_s: float = 0.0  # wall time of the whole search (saturation excluded when a result was given)
    stages: dict = field(default_factory=dict)  # seconds per stage: saturate, search, final
    trials: list[Trial] = field(default_factory=list)
    blocks: dict = field(default_factory=dict)  # repeated layers: distinct blocks searched, occurrences
    rank_correlation: float = math.nan  # Spearman rho of estimate vs measured time over timed trials
    from_cache: bool = False
    interrupted: bool = False
    noisy: bool = False  # the final comparison could not conclude: a spread above measure's COLLAPSE
    notes: list[str] = field(default_factory=list)
    saturation: dict = field(default_factory=dict)  # the e-graph searched: classes, nodes, iterations, stop
    verdict: dict = field(default_factory=dict)  # measure.compare(chosen, direct): speedup, interval, conclusive
    compared: list = field(default_factory=list)  # the final comparison: {label, backend, key, time_s, spread}
    budget: dict = field(default_factory=dict)  # the Budget searched under, as a dict
    built: Any = field(default=None, repr=False, compare=False)  # the chosen program's executable, if built

    @property
    def executable(self):
        """The chosen program's executable: the one the search measured, else lowered here once."""
        if self.built is None:
            from ..backends import lower

            self.built = lower(self.graph, self.backend, self.device, dict(self.knobs))
        return self.built

    @property
    def estimated(self) -> bool:
        return self.fitness == "model"

    @property
    def speedup(self) -> float:
        """Direct lowering's time over the chosen program's (>1: the search won)."""
        return self.baseline_time_s / self.time_s if self.time_s > 0 else math.nan

    @property
    def roofline_ratio(self) -> float:
        """Measured time over the roofline bound (1 would be the device's best)."""
        return self.time_s / self.estimate_s if self.estimate_s and self.estimate_s > 0 else math.nan

    def summary(self) -> dict[str, Any]:
        """The JSON-ready record of the result (no graph, no weights)."""
        return jsonable({
            "backend": self.backend, "knobs": dict(self.knobs), "device": self.device, "fitness": self.fitness,
            "seed": self.seed, "time_s": self.time_s, "spread": self.spread,
            "baseline_time_s": self.baseline_time_s, "baseline_spread": self.baseline_spread,
            "speedup": self.speedup, "estimate_s": self.estimate_s,
            "baseline_estimate_s": self.baseline_estimate_s, "roofline_ratio": self.roofline_ratio,
            "search_s": self.search_s, "stages": dict(self.stages), "counts": dict(self.counts),
            "blocks": dict(self.blocks), "rank_correlation": self.rank_correlation,
            "from_cache": self.from_cache, "interrupted": self.interrupted, "noisy": self.noisy,
            "notes": list(self.notes), "saturation": dict(self.saturation), "verdict": dict(self.verdict),
            "compared": [dict(c) for c in self.compared], "budget": dict(self.budget),
            "history": [g.as_dict() for g in self.history],
            "trials": [t.as_dict() for t in self.trials],
            "program": {"nodes": len(self.graph.nodes), "hash": self.graph.structural_hash(),
                        "ops": dict(sorted(self.graph.op_counts().items()))},
        })

    def report(self, format: str = "text", path: str | None = None) -> str:  # noqa: A002 - the natural name
        """The result as ``"text"``, ``"json"`` or ``"png"`` (a plot of best time against candidates).

        Text and JSON are returned (and written to `path` when given); PNG
        needs `path` and returns it.
        """
        from .report import render

        return render(self, format, path)
