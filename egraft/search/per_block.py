"""Repeated layers are searched once: one search space per distinct block, winners spliced back.

A stitched saturation (:mod:`egraft.rewrites.repeated`) keeps, per block
occurrence, its anonymised block graph and the saturated e-graph of its
template (one per distinct block).  :func:`block_tasks` turns each distinct
template into a standalone search: its e-graph as a :class:`Space` whose
weights are the first occurrence's (the block in its real context: real
shapes, real weight values), and the block graph as the reference.
:func:`splice` rebuilds the whole program from one chosen graph per
template, each occurrence's anonymised inputs mapped back to its own
weights and to the previous block's output.  A 12-layer model so costs
about what its one distinct layer costs to search, and the whole model is
then timed once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..errors import IRError
from ..ir import Op
from ..ir.graph import Graph, Node
from .space import Space


@dataclass
class BlockSearch:
    key: str  # the template's structural hash
    space: Space
    reference: Graph  # the block graph with the first occurrence's weights bound
    occurrences: int
    nodes: int


def _block_weights(graph: Graph, block) -> dict:
    return {anon: graph.weights[real] for anon, real in block.names.items() if real in graph.weights}


def block_tasks(result) -> list[BlockSearch]:
    """One search per distinct block of a stitched saturation (empty when it was not stitched)."""
    graph = result.graph
    out: dict[str, BlockSearch] = {}
    for block, tpl in result.parts:
        if tpl is None:
            continue
        if block.key in out:
            out[block.key].occurrences += 1
            continue
        bg = block.graph
        weights = _block_weights(graph, block)
        ref = Graph(bg.nodes, bg.outputs, bg.input_ids, weights)
        space = Space.from_snapshot(tpl.snap, [tpl.node_class[o] for o in bg.outputs],
                                    [tpl.node_class[i] for i in bg.input_ids], ref.input_names(), weights)
        out[block.key] = BlockSearch(block.key, space, ref, 1, len(bg.nodes))
    return list(out.values())


def splice(graph: Graph, parts, chosen: Mapping[str, Graph]) -> Graph:
    """The whole program with every block occurrence replaced by its template's chosen graph."""
    nodes: list[Node] = []
    by_name: dict[str, int] = {}
    new_of: dict[int, int] = {}  # original node id -> node id in the spliced graph
    for i, n in enumerate(graph.nodes):
        if n.op == Op.Input:
            by_name[n.attrs["name"]] = new_of[i] = len(nodes)
            nodes.append(n)
    for block, tpl in parts:
        w = chosen.get(block.key, block.graph) if tpl is not None else block.graph
        entry = next((block.order[k] for k, n in enumerate(block.graph.nodes)
                      if n.op == Op.Input and n.attrs["name"] == "__in__"), None)
        local: dict[int, int] = {}
        for j, n in enumerate(w.nodes):
            if n.op == Op.Input:
                real = block.names.get(n.attrs["name"])
                if real == "":
                    local[j] = new_of[entry]
                elif real in by_name:
                    local[j] = by_name[real]
                else:
                    raise IRError(f"block input {n.attrs['name']!r} maps to no model input ({real!r})")
                continue
            local[j] = len(nodes)
            nodes.append(Node(n.op, tuple(local[k] for k in n.inputs), n.attrs, n.shape, n.dtype))
        for o_block, o_w in zip(block.graph.outputs, w.outputs):
            new_of[block.order[o_block]] = local[o_w]
    return graph.rebuilt(nodes, [new_of[o] for o in graph.outputs], [by_name[n] for n in graph.input_names()]).pruned()
