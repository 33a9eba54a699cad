"""The immutable IR graph.

A :class:`Graph` is a tuple of :class:`Node` in topological order (a node's
inputs are earlier node ids), the ids of its outputs, the ids of the model's
own inputs in the model's order, and the bound values of its weight inputs.
Every node's shape and dtype are checked against the op table when the graph
is built, so a ``Graph`` that exists is well typed.

``graph.signature`` (an :class:`~egraft.ir.signature.Signature`) is derived
from the graph's own ``Input`` nodes (call inputs in ``input_ids`` order,
then the weights, by name) and its output types, so it cannot disagree
with them; the two things a graph cannot derive are carried explicitly:
``sources`` (input name -> the user's own name for it, from the tracer) and
``aliases`` (output index -> the state input it overwrites).

Inputs of role ``state`` (a buffer or input the program updates) are call
inputs like role ``input`` ones: ``input_ids`` lists the ``input`` nodes,
then the ``state`` nodes, which is the order a call passes them in (the
caller passes each state's current value).  Each state input is aliased by
exactly one output, of its shape and dtype, which holds its new value.  A
state is never a weight: it is never bound, folded or treated as constant.  A rebuild of a
graph passes them on (``with_weights``, ``pruned``, :meth:`Graph.rebuilt`,
extraction and ``ir.serialize``).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import IRError
from . import dtypes
from .op_groups import Op, get_op
from .signature import ROLES, InputSpec, OutputSpec, Signature


class Attrs(tuple):
    """A frozen, hashable mapping of attribute names to hashable values."""

    def __new__(cls, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()):
        pairs = items.items() if isinstance(items, Mapping) else items
        return super().__new__(cls, tuple(sorted((k, _freeze(v)) for k, v in pairs)))

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, (int, slice)):
            return tuple.__getitem__(self, key)
        for k, v in tuple.__iter__(self):
            if k == key:
                return v
        raise KeyError(key)

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def keys(self):
        return [k for k, _ in tuple.__iter__(self)]

    def as_dict(self) -> dict:
        return dict(tuple.__iter__(self))

    def __contains__(self, key):
        return key in self.keys()

    def __repr__(self):
        return "{" + ", ".join(f"{k}={v!r}" for k, v in tuple.__iter__(self)) + "}"

    # Equality is by type and exact value: python's 0.0 == -0.0 == False and
    # 1 == 1.0 == True would let CSE (and any dict keyed by nodes) merge
    # constants that compute different things (1/0.0 vs 1/-0.0).
    def typed_key(self) -> tuple:
        key = self.__dict__.get("_typed_key")
        if key is None:
            key = self.__dict__["_typed_key"] = tuple((k, _typed(v)) for k, v in tuple.__iter__(self))
        return key

    def __eq__(self, other):
        if not isinstance(other, Attrs):
            return NotImplemented
        return self.typed_key() == other.typed_key()

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(self.typed_key())


def _typed(v):
    if isinstance(v, tuple):
        return ("tuple", tuple(_typed(x) for x in v))
    if isinstance(v, (bool, int, float)):
        return (type(v).__name__, repr(v))  # repr keeps -0.0 apart and makes nan equal to nan
    return v


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, tuple):
        return tuple(_freeze(x) for x in v)
    return v


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[int, ...]
    attrs: Attrs
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self):
        # a plain dict of attrs would hash by its keys only; normalise so every Node is hashable and exact
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))
        object.__setattr__(self, "inputs", tuple(int(i) for i in self.inputs))
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))

    def key(self):
        return (self.op, self.inputs, self.attrs)


def infer_node(op: str, input_types: Sequence[tuple[tuple[int, ...], str]], attrs: Mapping[str, Any]):
    """(shape, dtype) of an op applied to inputs of the given types; IRError if ill-typed."""
    d = get_op(op)
    if len(input_types) not in d.arity:
        raise IRError(f"{op} takes {' or '.join(map(str, d.arity))} inputs, got {len(input_types)}")
    missing = [a for a in d.attr_names if a not in attrs]
    if missing:
        raise IRError(f"{op} is missing attribute(s) {missing}")
    shape, dt = d.infer([(tuple(s), t) for s, t in input_types], attrs)
    return tuple(int(x) for x in shape), dt


class Graph:
    """An immutable, well-typed DAG of IR nodes with bound weights."""

    __slots__ = ("nodes", "outputs", "input_ids", "weight_ids", "weights", "sources", "aliases", "_hash",
                 "_signature", "_node_hashes")

    def __init__(
        self,
        nodes: Sequence[Node],
        outputs: Sequence[int],
        input_ids: Sequence[int] | None = None,
        weights: Mapping[str, np.ndarray] | None = None,
        *,
        sources: Mapping[str, str] | None = None,
        aliases: Mapping[int, str] | None = None,
    ):
        nodes = tuple(nodes)
        names: dict[str, int] = {}
        for i, n in enumerate(nodes):
            if any(not 0 <= j < i for j in n.inputs):
                raise IRError(f"node {i} ({n.op}) uses inputs {n.inputs}: graphs must be in topological order")
            shape, dt = infer_node(n.op, [(nodes[j].shape, nodes[j].dtype) for j in n.inputs], n.attrs)
            if (shape, dt) != (tuple(n.shape), n.dtype):
                raise IRError(f"node {i} ({n.op}) declares {n.shape}:{n.dtype} but its inputs give {shape}:{dt}")
            if n.op == Op.Input:
                name = n.attrs["name"]
                if name in names:
                    raise IRError(f"two inputs are named {name!r}")
                if n.attrs["role"] not in ROLES:
                    raise IRError(f"input {name!r} has role {n.attrs['role']!r}; the roles are {', '.join(ROLES)}")
                names[name] = i
        for o in outputs:
            if not 0 <= o < len(nodes):
                raise IRError(f"output id {o} does not name a node")
        role_inputs = [i for i, n in enumerate(nodes) if n.op == Op.Input and n.attrs["role"] == "input"]
        role_state = [i for i, n in enumerate(nodes) if n.op == Op.Input and n.attrs["role"] == "state"]
        if input_ids is None:
            input_ids = role_inputs + role_state
        input_ids = [int(i) for i in input_ids]
        if sorted(input_ids[:len(role_inputs)]) != role_inputs or sorted(input_ids[len(role_inputs):]) != role_state:
            raise IRError("input_ids must list every node with role 'input' exactly once, then every node with "
                          "role 'state' (the order a call passes them in)")
        init = object.__setattr__  # a Graph is immutable once built (see __setattr__)
        init(self, "nodes", nodes)
        init(self, "outputs", tuple(outputs))
        init(self, "input_ids", tuple(input_ids))
        init(self, "weight_ids", tuple(i for i, n in enumerate(nodes) if n.op == Op.Input and n.attrs["role"] == "weight"))
        bound = {}
        for name, value in (weights or {}).items():
            if name not in names or nodes[names[name]].attrs["role"] != "weight":
                continue  # weights of nodes a rewrite removed are dropped
            node = nodes[names[name]]
            arr = np.asarray(value)
            if tuple(arr.shape) != node.shape or arr.dtype != dtypes.to_numpy(node.dtype):
                raise IRError(
                    f"weight {name!r} is bound to a {arr.shape}:{arr.dtype} array, but the graph "
                    f"declares {node.shape}:{node.dtype}"
                )
            bound[name] = arr
        init(self, "weights", MappingProxyType(bound))
        init(self, "_hash", None)
        init(self, "_node_hashes", None)
        self._set_interface(sources, aliases)

    def _set_interface(self, sources: Mapping[str, str] | None, aliases: Mapping[int, str] | None) -> None:
        init = object.__setattr__
        init(self, "_signature", None)
        sources = {str(k): v for k, v in (sources or {}).items()}
        calls = self.input_names()
        bad = sorted(set(sources) - set(calls))
        if bad:
            raise IRError(f"sources name {bad}, which are not call inputs of the graph ({', '.join(calls)})")
        init(self, "sources", MappingProxyType(sources))
        init(self, "aliases", MappingProxyType({int(k): str(v) for k, v in (aliases or {}).items()}))
        if any(not isinstance(v, str) or not v for v in sources.values()):
            raise IRError(f"sources must map input names to non-empty names, got {sources}")
        states = self.state_names()
        if self.aliases or states:
            self.signature  # an alias is checked against the inputs and outputs now, not at first use
            unaliased = sorted(set(states) - set(self.aliases.values()))
            if unaliased:
                raise IRError(f"state input(s) {unaliased} have no output carrying their new value; alias one "
                              "output to each state input (aliases={output index: state name})")

    def __setattr__(self, name, value):
        raise AttributeError(f"an egraft Graph is immutable (tried to set {name!r}); build a new Graph instead")

    # -- inspection ------------------------------------------------------------
    def __len__(self):
        return len(self.nodes)

    def input_names(self) -> list[str]:
        return [self.nodes[i].attrs["name"] for i in self.input_ids]

    @property
    def state_ids(self) -> tuple[int, ...]:
        """The ``state`` inputs (a suffix of ``input_ids``): passed on every call, their new value an output."""
        return tuple(i for i in self.input_ids if self.nodes[i].attrs["role"] == "state")

    def state_names(self) -> list[str]:
        return [self.nodes[i].attrs["name"] for i in self.state_ids]

    def weight_names(self) -> list[str]:
        return [self.nodes[i].attrs["name"] for i in self.weight_ids]

    def input_types(self) -> list[tuple[tuple[int, ...], str]]:
        return [(self.nodes[i].shape, self.nodes[i].dtype) for i in self.input_ids]

    def output_types(self) -> list[tuple[tuple[int, ...], str]]:
        return [(self.nodes[i].shape, self.nodes[i].dtype) for i in self.outputs]

    @property
    def signature(self) -> Signature:
        """The calling convention (module docstring): derived from the inputs, outputs, sources and aliases."""
        sig = self._signature
        if sig is None:
            def spec(i: int) -> InputSpec:
                n = self.nodes[i]
                name = n.attrs["name"]
                return InputSpec(name, n.attrs["role"], n.shape, n.dtype, self.sources.get(name))

            sig = Signature(tuple(spec(i) for i in self.input_ids + self.weight_ids),
                            tuple(OutputSpec(s, d) for s, d in self.output_types()), tuple(self.aliases.items()))
            object.__setattr__(self, "_signature", sig)
        return sig

    def op_counts(self) -> Counter:
        return Counter(n.op for n in self.nodes)

    def consumers(self) -> list[list[int]]:
        users: list[list[int]] = [[] for _ in self.nodes]
        for i, n in enumerate(self.nodes):
            for j in n.inputs:
                users[j].append(i)
        return users

    def needed(self, deps: Callable[[int], Sequence[int]] | None = None,
               outputs: Sequence[int] | None = None) -> list[bool]:
        """Which nodes the outputs (or the nodes `outputs`) depend on; `deps(i)` (default: node i's inputs) says
        what node i reads.

        Backends pass their own `deps` where a recognised pattern reads other
        nodes than its IR inputs (a matmul written in primitives skips its Mul).
        """
        need = [False] * len(self.nodes)
        for o in (self.outputs if outputs is None else outputs):
            need[o] = True
        for i in range(len(self.nodes) - 1, -1, -1):
            if need[i]:
                for j in (deps(i) if deps is not None else self.nodes[i].inputs):
                    need[j] = True
        return need

    def live(self) -> list[bool]:
        """The nodes the outputs depend on, and every model input."""
        alive = self.needed()
        for i in self.input_ids:
            alive[i] = True
        return alive

    def summary(self) -> str:
        counts = self.op_counts()
        n_w = sum(int(np.prod(self.nodes[i].shape)) for i in self.weight_ids)
        ops = ", ".join(f"{op}={c}" for op, c in sorted(counts.items(), key=lambda kv: -kv[1]))
        return (
            f"Graph: {len(self.nodes)} nodes, {len(self.input_ids)} inputs, {len(self.weight_ids)} weights "
            f"({n_w:,} parameters), {len(self.outputs)} outputs\n  ops: {ops}\n  hash: {self.structural_hash()[:16]}"
        )

    def dump(self) -> str:
        """A readable text form, one node per line."""
        lines = []
        for i, n in enumerate(self.nodes):
            args = ", ".join(f"%{j}" for j in n.inputs)
            attrs = {k: v for k, v in n.attrs.as_dict().items() if not (n.op in (Op.Input, Op.Constant) and k in ("shape", "dtype"))}
            attr_s = " ".join(f"{k}={v!r}" for k, v in attrs.items())
            lines.append(f"%{i} = {n.op}({args}){' ' + attr_s if attr_s else ''} : {list(n.shape)} {n.dtype}")
        lines.append("return " + ", ".join(f"%{o}" for o in self.outputs))
        return "\n".join(lines)

    __str__ = dump

    def __repr__(self):
        return f"<egraft.ir.Graph {len(self.nodes)} nodes, hash {self.structural_hash()[:12]}>"

    def node_hashes(self) -> tuple[str, ...]:
        """Merkle hash per node: its op, attributes, type and its inputs' hashes (made once per graph: a saved
        generation's folded values each ask for them)."""
        if self._node_hashes is None:
            hs: list[str] = []
            for n in self.nodes:
                h = hashlib.sha256()
                h.update(repr((n.op, tuple(n.attrs), n.shape, n.dtype)).encode())
                for j in n.inputs:
                    h.update(hs[j].encode())
                hs.append(h.hexdigest())
            object.__setattr__(self, "_node_hashes", tuple(hs))
        return self._node_hashes

    def structural_hash(self) -> str:
        """A hash of what the graph computes, independent of node order and dead nodes.

        Weight *values* are not part of it (kernels do not depend on them);
        tensor constants are.  This is the cache key for compiled programs.
        """
        if self._hash is None:
            hs = self.node_hashes()
            h = hashlib.sha256()
            h.update(b"in:" + "|".join(hs[i] for i in self.input_ids).encode())
            h.update(b"out:" + "|".join(hs[o] for o in self.outputs).encode())
            if self.aliases:  # which output overwrites which state changes what a call does
                h.update(b"alias:" + repr(sorted(self.aliases.items())).encode())
            object.__setattr__(self, "_hash", h.hexdigest())
        return self._hash

    def to_networkx(self):
        """A networkx.DiGraph: node ids with op/shape/dtype/attrs, edges carry the argument position."""
        import networkx as nx

        g = nx.DiGraph()
        for i, n in enumerate(self.nodes):
            g.add_node(i, op=n.op, shape=n.shape, dtype=n.dtype, attrs=n.attrs.as_dict())
        for i, n in enumerate(self.nodes):
            for pos, j in enumerate(n.inputs):
                if g.has_edge(j, i):
                    g.edges[j, i]["positions"].append(pos)
                else:
                    g.add_edge(j, i, positions=[pos])
        return g

    # -- transformation ---------------------------------------------------------
    def rebuilt(self, nodes: Sequence[Node], outputs: Sequence[int], input_ids: Sequence[int],
                weights: Mapping[str, np.ndarray] | None = None) -> "Graph":
        """A new graph of the same program interface (sources, aliases; weights unless given) over new nodes."""
        return Graph(nodes, outputs, input_ids, self.weights if weights is None else weights,
                     sources=self.sources, aliases=self.aliases)

    def with_interface(self, sources: Mapping[str, str] | None = None,
                       aliases: Mapping[int, str] | None = None) -> "Graph":
        """This graph with other sources and aliases (the nodes are the same, so they are not checked again)."""
        g = object.__new__(Graph)
        for slot in ("nodes", "outputs", "input_ids", "weight_ids", "weights", "_node_hashes"):
            object.__setattr__(g, slot, getattr(self, slot))
        object.__setattr__(g, "_hash", None)  # the aliases are part of the hash
        g._set_interface(sources, aliases)
        return g

    def with_weights(self, weights: Mapping[str, np.ndarray]) -> "Graph":
        return self.rebuilt(self.nodes, self.outputs, self.input_ids, {**self.weights, **weights})

    def pruned(self) -> "Graph":
        """The same graph without dead nodes (inputs are kept)."""
        alive = self.live()
        remap: dict[int, int] = {}
        nodes = []
        for i, n in enumerate(self.nodes):
            if alive[i]:
                remap[i] = len(nodes)
                nodes.append(Node(n.op, tuple(remap[j] for j in n.inputs), n.attrs, n.shape, n.dtype))
        return self.rebuilt(nodes, [remap[o] for o in self.outputs], [remap[i] for i in self.input_ids])
