"""Search over the e-graph for the fastest equal program: space, cost model, genetic search, evaluators.

``search(graph, config=None, **options) -> SearchResult`` (:mod:`.engine`;
``options`` as ``backend="auto", device="cpu", budget=None, seed=0``, parsed
into a :class:`CompileConfig`).  The parts: :mod:`.config` (the one config
value and :class:`Budget`), :mod:`.stored` and :mod:`.cache` (results on
disk: the key, the budget an entry covers), :class:`Space` (extraction of
programs from a saturated e-graph), :mod:`.cost` (the roofline cost model),
:mod:`.genome` and :mod:`.genetic` (the genetic search), :mod:`.candidate`
and :mod:`.evaluators` (validating and timing candidates; the Ray evaluator
in :mod:`.ray_evaluator`), :mod:`.per_block` (repeated layers searched
once), :mod:`.final` (the final comparison of every contender),
:mod:`.result`, :mod:`.report` and :mod:`.progress` (what the user sees).
"""

from .cost import Estimate, KernelCost, estimate, node_cost, rank_correlation
from .engine import search
from .candidate import Candidate, Outcome, Task
from .evaluators import LocalEvaluator
from .config import Budget, CompileConfig
from .result import Round, SearchResult, Trial
from .space import Space, default_cost

__all__ = ["Budget", "Candidate", "CompileConfig", "Estimate", "Round", "KernelCost", "LocalEvaluator", "Outcome",
           "SearchResult", "Space", "Task", "Trial", "default_cost", "estimate", "node_cost", "rank_correlation",
           "search"]
