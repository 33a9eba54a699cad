"""An IR graph as one ``torch.fx.GraphModule`` of ATen calls.

:class:`FxProgram` walks the (per-call, weight-folded) graph once, calling the
rule table for each live node and converting each result to its node's dtype
(:func:`.emit.convert`), so the module computes what ``ir.evaluate`` does.
Its ``forward`` takes the model's inputs in the graph's order and returns a
tuple of outputs.  Weights are buffers of the module, put on the device once
here; tensor constants too.  Under the knob ``idioms="primitive"`` idiom
nodes are first rewritten to their primitive form
(:func:`egraft.ir.decompose.decompose`); under ``peephole=True`` (the
default) a primitive matrix product runs as ``bmm``, and a product of two widened
half values whose sum is only rounded back as torch's own half product (:mod:`.peephole`).

Every output is a tensor of its own: one that would share memory with an
input, a weight, a constant or an earlier output (an identity, a view of
one, a repeated output), or that is a broadcast (stride-0) view, is cloned;
any other output is the op's own fresh result.

State (the Executable contract in ``backends/base.py``): the output aliased
to a state input *is* that input's tensor, updated in place.  A ``Scatter``
into a state input that nothing else reads (:func:`in_place_scatters`) runs
as ``scatter_`` on it; any other new value is computed functionally and
``copy_``-ed into the state tensor after every other op (so no read of the
old value comes after the write).
"""

from __future__ import annotations

import torch

from ...errors import BackendError
from ...ir import Op
from ...ir.decompose import decompose
from ...ir.graph import Graph
from . import peephole
from .emit import Emitter, aten, convert, from_numpy
from .rules import RULES

# ATen ops whose result may share its operand's memory (reshape only sometimes: counted as one)
_VIEW_OPS = frozenset({aten.reshape.default, aten.view.default, aten.slice.Tensor, aten.permute.default,
                       aten.expand.default, aten.transpose.int, aten.view.dtype})


def _base(v: torch.fx.Node) -> torch.fx.Node:
    while v.op == "call_function" and v.target in _VIEW_OPS:
        v = v.args[0]
    return v


def in_place_scatters(graph: Graph) -> set[int]:
    """The Scatter nodes that may write into their target's buffer: the target is a state input whose only
    reader (among the nodes the outputs need, and the outputs) is that Scatter."""
    alive = graph.needed()
    readers: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        if alive[i]:
            for j in n.inputs:
                readers[j] = readers.get(j, 0) + 1
    for o in graph.outputs:
        readers[o] = readers.get(o, 0) + 1
    states = set(graph.state_ids)
    return {i for i, n in enumerate(graph.nodes)
            if alive[i] and n.op == Op.Scatter and n.inputs[0] in states and readers[n.inputs[0]] == 1}


def _writes(v: torch.fx.Node, state: torch.fx.Node) -> bool:
    """Whether `v` is `state`'s own tensor after an in-place write into it."""
    return v.op == "call_function" and v.target in (aten.scatter_.src, aten.copy_.default) and v.args[0] is state


def _broadcasts(graph: Graph, nid: int) -> bool:
    n = graph.nodes[nid]
    return n.op == Op.View and any(s == 0 and d > 1 for d, s in zip(n.attrs["shape"], n.attrs["strides"]))


class FxProgram:
    """The FX form of one per-call graph under fixed knobs, for one device."""

    def __init__(self, graph: Graph, knobs: dict, device: torch.device):
        if knobs.get("idioms", "library") == "primitive":
            graph = decompose(graph)
        self.graph = graph
        self.knobs = dict(knobs)
        self.device = device
        ctx = Emitter(device, self.knobs)
        ctx.graph = graph
        self.weights: dict[str, torch.Tensor] = {}  # weight name -> the module's tensor (on the device)
        plans = peephole.find(graph) if self.knobs.get("peephole", True) else {}
        self.stats = {"peephole_dots": sum(isinstance(p, peephole.DotPlan) for p in plans.values())}
        alive = graph.needed(lambda i: plans[i].deps() if i in plans else graph.nodes[i].inputs)
        in_place = in_place_scatters(graph)
        self.stats["in_place_scatters"] = len(in_place)
        vals: dict[int, torch.fx.Node] = {}
        for k, i in enumerate(graph.input_ids):
            vals[i] = ctx.placeholder(f"x{k}", graph.nodes[i].dtype)
        for i, n in enumerate(graph.nodes):
            if not alive[i] or i in vals:
                continue
            if n.op == Op.Input:
                vals[i] = self._weight(ctx, n)
                continue
            if i in plans:
                v = peephole.emit(ctx, plans[i], n, *[vals[j] for j in plans[i].deps()])
            elif i in in_place:
                x, idx, upd = (vals[j] for j in n.inputs)
                v = ctx.call(aten.scatter_.src, (x, n.attrs["axis"], convert(ctx, idx, "int64"), upd), n.dtype)
            else:
                v = RULES[n.op](ctx, n, *[vals[j] for j in n.inputs])
            vals[i] = convert(ctx, v, n.dtype)
        outs, bases = [], set()
        state_of = {k: vals[graph.input_ids[graph.input_names().index(name)]] for k, name in graph.aliases.items()}
        for k, o in enumerate(graph.outputs):
            v = vals[o]
            if k in state_of and _writes(v, state_of[k]):
                outs.append(v)  # the state's own tensor, written in place
                continue
            b = _base(v)
            if b.op in ("placeholder", "get_attr") or b in bases or _broadcasts(graph, o):
                v = ctx.call(aten.clone.default, (v,), ctx.dt(v), memory_format=torch.contiguous_format)
            bases.add(_base(v))
            outs.append(v)
        for k, s in state_of.items():  # after every other op: nothing reads the old value once it is written
            if not _writes(outs[k], s):
                outs[k] = ctx.call(aten.copy_.default, (s, outs[k]), ctx.dt(s))
        ctx.fx.output(tuple(outs))
        ctx.fx.eliminate_dead_code()  # reshapes that later reshapes bypassed
        ctx.fx.lint()
        self.module = torch.fx.GraphModule(ctx.root, ctx.fx, class_name="EgraftTorchProgram")
        self.module.eval()

    def _weight(self, ctx: Emitter, n) -> torch.fx.Node:
        name = n.attrs["name"]
        if name not in self.graph.weights:
            raise BackendError(f"weight {name!r} has no bound value; bind it with graph.with_weights(...)")
        t = from_numpy(self.graph.weights[name]).to(self.device)  # on the CPU: the bound array's own memory
        self.weights[name] = t
        return ctx.tensor(t, n.dtype, "w")

    @property
    def code(self) -> str:
        """The module's generated Python: one ATen call per line."""
        return self.module.code
