"""A graph's structure as plain JSON data, and back (weights are not part of it).

Search results on disk and kernel artifacts store the chosen program this
way; weights travel separately (by name), because a program does not depend
on their values.  Attribute values are bools, ints, floats, strings and
nested tuples of them (``Attrs`` freezes everything else away), so JSON
holds them exactly: floats keep their repr (``-0.0``, ``inf`` and ``nan``
included, through Python's ``json``), and tuples come back from lists.
:func:`graph_from_dict` rebuilds through ``Graph``, which re-checks every
node's type, so a damaged record raises ``IRError`` instead of producing a
wrong program.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import IRError
from .graph import Attrs, Graph, Node

FORMAT = 1


def _thaw(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_thaw(x) for x in v)
    return v


def graph_to_dict(graph: Graph) -> dict:
    """The graph's nodes, outputs, model inputs and the rest of its signature (sources, aliases) as JSON data."""
    return {
        "format": FORMAT,
        "nodes": [[n.op, list(n.inputs), [[k, v] for k, v in n.attrs.as_dict().items()], list(n.shape), n.dtype]
                  for n in graph.nodes],
        "outputs": list(graph.outputs),
        "inputs": list(graph.input_ids),
        "sources": dict(graph.sources),
        "aliases": [[k, n] for k, n in graph.aliases.items()],
    }


def graph_from_dict(doc: Mapping, weights: Mapping[str, np.ndarray] | None = None) -> Graph:
    """Rebuild a graph written by :func:`graph_to_dict`, binding `weights` by name."""
    try:
        if doc.get("format") != FORMAT:
            raise IRError(f"graph record has format {doc.get('format')!r}; this egraft reads format {FORMAT}")
        nodes = [Node(op, tuple(ins), Attrs({k: _thaw(v) for k, v in attrs}), tuple(shape), dtype)
                 for op, ins, attrs, shape, dtype in doc["nodes"]]
        # sources and aliases: absent from records written before graphs carried them (none then)
        return Graph(nodes, doc["outputs"], doc["inputs"], weights, sources=doc.get("sources"),
                     aliases={k: n for k, n in doc.get("aliases", ())})
    except IRError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise IRError(f"graph record is damaged ({type(e).__name__}: {e}); rebuild it from the model") from None
