"""Search results in the cache: what the key holds, what an entry stores, when an entry answers.

The key (:func:`key`) is the program's structural hash, the config's
:meth:`~egraft.search.config.CompileConfig.identity` (device, backend
request, fitness, the rules' digest, the saturation limits, the seed,
whether repeated layers are searched once) and the library versions
(:class:`~egraft.search.cache.CacheKey` adds those).  The budget is not in
the key: an entry stores the budget it was searched under, and
:func:`lookup` lets it answer a request only when that budget
:meth:`~egraft.search.config.Budget.covers` the one asked for.  An entry
from a smaller budget is handed back as a *prior*: the larger search puts
its program into its final comparison (so the larger search is never worse
than what was already found), never returns it unsearched.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, fields

from ..errors import IRError
from ..ir.graph import Graph
from ..ir.serialize import graph_from_dict, graph_to_dict
from .cache import Cache, CacheKey
from .config import Budget, CompileConfig
from .result import SearchResult

SEARCH = "genetic/4"  # the search's own version: a change in what it returns (or in the knobs it can pick) is a new key


def key(graph: Graph, config: CompileConfig) -> CacheKey:
    """The cache key of searching `graph` under `config` (its fitness and device already resolved)."""
    ident = config.identity()
    device, backend = ident.pop("device"), ident.pop("backend")
    return CacheKey(program=graph.structural_hash(), device=device, backend=backend,
                    knobs={"search": SEARCH, **ident})


@dataclass(frozen=True)
class Stored:
    """A readable entry: its result (``from_cache``) and the budget it was searched under."""

    result: SearchResult
    budget: Budget


def lookup(store: Cache, k: CacheKey, graph: Graph, t0: float) -> Stored | None:
    """The entry under `k` for `graph`, or None (absent, corrupt, of another shape, another signature)."""
    doc = store.get(k)
    if not doc:
        return None
    try:
        prog = graph_from_dict(doc["graph"], graph.weights)
        s = doc["summary"]
        budget = Budget(**{f.name: s["budget"][f.name] for f in fields(Budget) if f.name in Budget().effort()})
        took = _time.perf_counter() - t0
        res = SearchResult(
            prog, s["backend"], dict(s["knobs"]), float(s["time_s"]), float(s["baseline_time_s"]),
            device=s["device"], fitness=s["fitness"], seed=s["seed"], spread=s["spread"] or 0.0,
            baseline_spread=s["baseline_spread"] or 0.0, counts=dict(s["counts"]),
            estimate_s=_num(s["estimate_s"]), baseline_estimate_s=_num(s["baseline_estimate_s"]),
            search_s=took, stages={"cache": round(took, 4)}, blocks=dict(s["blocks"]),
            rank_correlation=_num(s["rank_correlation"]), from_cache=True, noisy=bool(s["noisy"]),
            notes=list(s["notes"]) + ["returned from the search cache"], saturation=dict(s.get("saturation") or {}),
            verdict=dict(s["verdict"]), compared=list(s["compared"]), budget=dict(s["budget"]))
    except (KeyError, TypeError, ValueError, IRError):
        return None  # an entry of another shape: search again (and overwrite it)
    if prog.input_names() != graph.input_names() or prog.output_types() != graph.output_types():
        return None
    return Stored(res, budget)


def save(store: Cache, k: CacheKey, result: SearchResult) -> None:
    """Store `result` (its program's structure and its summary, the budget among it) under `k`."""
    store.put(k, {"graph": graph_to_dict(result.graph), "summary": result.summary()})


def _num(v) -> float:
    return math.nan if v is None else float(v)


__all__ = ["SEARCH", "Stored", "key", "lookup", "save"]
