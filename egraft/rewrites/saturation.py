"""Equality saturation under hard limits: the strategy (whole graph or layer by layer).

``saturate(graph, rules=None, limits=None) -> SaturationResult`` grows an
e-graph of programs equal to ``graph`` with the engine of
:mod:`egraft.rewrites.session` (safe rules to a fixed point, one bounded
explosive step, safe rules again; limits checked between iterations).

Repeated layers (transformer stacks) are on by default
(``Limits.repeated_layers``): :mod:`egraft.rewrites.repeated` saturates each
distinct layer once in egglog and stitches the copies together in Python, so
the cost grows with the number of *distinct* layers, not the layer count.
The price is that rewrites spanning a layer boundary (e.g. fusing one
layer's residual add with the next layer's norm) are not tried; see that
module for why this is acceptable.  Graphs without repeated blocks (and
graphs under ``blocks.MIN_NODES`` nodes) are saturated whole, as is every
graph with ``repeated_layers=False``.  A stitched result has no live egglog
e-graph (``egraph`` is None); its snapshot is the stitched e-graph.
"""

from __future__ import annotations

import time
from typing import Sequence

from ..ir.graph import Graph
from .codec import Context, encode_graph
from .repeated import saturate_layered
from .ruleset import all_rules
from .rule import RuleSpec
from .session import Limits, SaturationResult, EGraphSession, run_schedule


def saturate(graph: Graph, rules: Sequence[RuleSpec] | None = None, limits: Limits | None = None) -> SaturationResult:
    """Grow an e-graph of programs equal to `graph` under `limits` (every registered rule by default)."""
    limits = limits or Limits()
    rules = all_rules() if rules is None else list(rules)
    if limits.repeated_layers:
        res = saturate_layered(graph, rules, limits)
        if res is not None:
            return res
    t0 = time.perf_counter()
    ctx = Context.for_graph(graph)
    sess = EGraphSession(rules, ctx)
    text, hs = encode_graph(graph, ctx)
    sess.run(text, "encoding the graph")
    sess.analysis()
    sched = run_schedule(sess, limits, t0)
    return SaturationResult(
        **vars(sched), egraph=sess.eg, ctx=ctx, graph=graph, output_handles=[hs[o] for o in graph.outputs],
        input_handles=[hs[i] for i in graph.input_ids], firings=sess.firings, form_firings=sess.form_firings,
    )
