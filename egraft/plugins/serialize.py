"""A :class:`~egraft.plugins.dynamo.DynamoGraph` in a compile cache: torch's ``SerializableCallable`` protocol.

torch's AOT compile (``torch._dynamo.aot_compile``, which vLLM uses in its
``DYNAMO_TRACE_ONCE`` mode and saves under ``$VLLM_CACHE_ROOT``) requires
the backend's callable to be a ``SerializableCallable``: a class with
``serialize_compile_artifacts(fn) -> bytes`` and
``deserialize_compile_artifacts(bytes) -> fn``.  What egraft writes is what
it compiles from: Dynamo's FX graph (pickled with torch's ``GraphPickler``),
the backend's :class:`~egraft.search.config.CompileConfig`, and what the
pickled graph loses of its placeholders' metadata (which ones are a
module's parameters or buffers, which ones have symbolic sizes).  Reading it
back gives a fresh ``DynamoGraph`` that compiles on its first call per
input signature, like the one saved; egraft's search cache
(``$EGRAFT_CACHE_DIR``) makes that a cache hit on the machine that saved it.

The graph is unpickled on :meth:`LoadedGraph.finalize_loading` (vLLM calls
it right after loading) or on the first call, whichever comes first.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from ..errors import ArtifactError
from . import stats

FORMAT = "egraft-dynamo-graph/1"

try:  # torch >= 2.10
    from torch._dynamo.aot_compile_types import SerializableCallable
except ImportError:  # pragma: no cover - an older torch has no AOT compile to serve
    SerializableCallable = None


def register(cls: type) -> None:
    """Make ``cls`` (which has the protocol's classmethods) a ``SerializableCallable`` for torch's isinstance check."""
    if SerializableCallable is not None:
        SerializableCallable.register(cls)


def dumps(graph) -> bytes:
    """The bytes :func:`loads` rebuilds ``graph`` (a DynamoGraph) from."""
    from torch.fx._graph_pickler import GraphPickler, Options

    if isinstance(graph, LoadedGraph):  # saved again before it ran: its state is still the bytes it came from
        return graph._data
    gm = graph.gm
    hints = {"weights": sorted(graph.weight_names()), "dynamic": graph._dynamic_dims()}
    copy = torch.fx.GraphModule(gm, _graph_without_fake_meta(gm.graph))  # the live graph keeps its meta
    data = {"format": FORMAT, "graph": GraphPickler.dumps(copy, Options(ops_filter=None)),
            "config": graph.config, "hints": hints, "label": graph.label,
            "class": type(graph)}  # pickled by name: the class that reads it back (DynamoGraph)
    out = pickle.dumps(data)
    stats.serialized()
    return out


def loads(data: bytes) -> "LoadedGraph":
    try:
        state = pickle.loads(data)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same thing to the caller
        raise ArtifactError(f"the egraft graph in this compile cache cannot be read ({e}); delete the cache "
                            "directory (vLLM: $VLLM_CACHE_ROOT/torch_compile_cache) to compile afresh") from e
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ArtifactError(f"the compile cache holds an egraft graph of format {found!r}, this egraft reads "
                            f"{FORMAT!r}; delete the cache directory to compile afresh")
    return LoadedGraph(data, state)


def _graph_without_fake_meta(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``graph`` whose nodes keep only metadata that pickles (stack traces, names), not fake values."""
    new = torch.fx.Graph()
    env: dict = {}
    for node in graph.nodes:
        env[node] = new.node_copy(node, lambda n: env[n])
        keep = {k: v for k, v in node.meta.items() if k in ("stack_trace", "source_fn_stack_names", "seq_nr")}
        env[node].meta = keep
    return new


class LoadedGraph:
    """A DynamoGraph read back from a compile cache; it becomes one on first use (see the module docstring)."""

    def __init__(self, data: bytes, state: dict):
        self._data, self._state, self._graph = data, state, None
        stats.deserialized()

    def finalize_loading(self, *_context: Any) -> None:
        """Unpickle the graph now (vLLM passes its config; egraft needs none of it)."""
        self._load()

    def _load(self):
        if self._graph is None:
            from torch._subclasses import FakeTensorMode
            from torch.fx._graph_pickler import GraphPickler
            from torch.fx.experimental.symbolic_shapes import ShapeEnv

            gm = GraphPickler.loads(self._state["graph"], FakeTensorMode(shape_env=ShapeEnv()))
            gm.recompile()
            hints = self._state["hints"]
            self._graph = self._state["class"](gm, self._state["config"], weight_names=hints["weights"],
                                      dynamic=hints["dynamic"])
        return self._graph

    @property
    def gm(self):
        return self._load().gm

    def __getattr__(self, name: str):  # entries, results, config, label: those of the graph it becomes
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._load(), name)

    def __call__(self, *args):
        return self._load()(*args)

    @classmethod
    def serialize_compile_artifacts(cls, fn) -> bytes:
        return dumps(fn)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> "LoadedGraph":
        return loads(data)


register(LoadedGraph)
