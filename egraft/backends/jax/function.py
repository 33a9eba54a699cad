"""An IR graph as one pure JAX function ``fn(weights, *inputs) -> outputs``.

The function walks the graph once at trace time, calling the rule table
for each node that is needed (peephole plans replace some nodes and skip
the intermediates only they used).  It is traced by ``jax.jit`` once per
executable, so none of this Python runs per call.

Integer width: without JAX's x64 mode an ``int64`` IR value is held as
int32 (indices, positions, masks: they fit).  A graph that needs 64 bits
(float64 anywhere, or int64 constants/weights outside the int32 range) is
traced and run under ``jax.enable_x64``, locally, never globally.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Sequence

import jax
import numpy as np

from ...errors import BackendError, InputError
from ...ir import Op, dtypes
from ...ir.decompose import decompose
from ...ir.grouped import split_grouped_products
from ...ir.graph import Graph
from ...ir.ops import TensorValue
from . import panels, peephole, view_dots, windows
from ...runtime.jax_runner import STATE_BITS
from .rules import RULES, STAT_ZERO, LowerCtx, realise_view

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
STREAM_WIDTH = 64  # the generated CPU product's panel width when no knob says (KNOBS["stream_width"])


def fits_int32(a: np.ndarray) -> bool:
    return a.size == 0 or (int(a.min()) >= INT32_MIN and int(a.max()) <= INT32_MAX)


def needs_x64(graph: Graph) -> bool:
    """Whether the graph needs 64-bit JAX types (see the module docstring)."""
    for n in graph.nodes:
        if n.dtype == "float64":
            return True
        if n.dtype == "int64" and n.op == Op.Constant:
            v = n.attrs["value"]
            arr = v.array if isinstance(v, TensorValue) else np.asarray(v)
            if not fits_int32(arr):
                return True
    for name, w in graph.weights.items():
        if w.dtype == np.int64 and not fits_int32(w):
            return True
    return False


def x64_scope(x64: bool):
    return jax.enable_x64(True) if x64 else contextlib.nullcontext()


class JaxProgram:
    """The traced form of one per-call graph under fixed knobs."""

    def __init__(self, graph: Graph, knobs: dict, x64: bool | None = None, widened: dict | None = None,
                 fold=None):
        """`widened` and `fold` (``backends.fold``): the folded values that only widen a stored weight, and a
        function giving values by name that `graph` leaves unbound until the program reads one (folded values,
        and the stored weights those widen)."""
        self.graph = graph
        self.knobs = dict(knobs)
        self.x64 = needs_x64(graph) if x64 is None else x64
        self.ctx = LowerCtx(self.knobs, self.x64)
        self._fold = fold
        self.lowered, self.plans, self.panel_weights = plan(graph, self.knobs, widened)
        # the weights the program takes: those a computed node reads, then the panel forms (panels.py)
        need = _needed(self.lowered, self.plans)
        read = {n.attrs["name"] for i, n in enumerate(self.lowered.nodes)
                if need[i] and n.op == Op.Input and n.attrs["role"] == "weight"}
        self.weight_names = tuple(w for w in graph.weight_names() if w in read) + tuple(sorted(self.panel_weights))

    def fn(self, weights: Sequence, *inputs):
        """The pure function jit traces: weights in ``weight_names`` order, then the model's inputs."""
        self.ctx.stats.update(STAT_ZERO)
        env = dict(zip(self.weight_names, weights))
        return tuple(emit(self.lowered, list(inputs), env, self.ctx, self.plans))

    @property
    def kernels(self) -> list:
        """The generated CPU products (``runtime.llvm_kernels.KernelSpec``) the program calls, once each."""
        return list(dict.fromkeys(p.kernel for p in self.plans.values()
                                  if isinstance(p, (panels.PanelPlan, view_dots.ViewDotPlan)) and p.kernel is not None))

    def host_weights(self) -> list[np.ndarray]:
        """Bound weight values converted to the dtypes the program holds them in (panel forms made here)."""
        out = []
        for name in self.weight_names:
            pw = self.panel_weights.get(name)
            source = pw.source if pw else name
            if source in self.graph.weights:
                value = self.graph.weights[source]
            else:  # a folded value read after all, or a stored weight only a widened folded value read
                value = (self._fold([source]) if self._fold is not None else {}).get(source)
                if value is None:
                    raise BackendError(f"weight {source!r} has no bound value; bind it with graph.with_weights(...)")
            value = np.asarray(value)
            if pw:
                value = panels.panel_form(value, pw)
            out.append(to_program_dtype(value, self.x64, f"weight {name!r}"))
        return out


def to_program_dtype(a: np.ndarray, x64: bool, what: str) -> np.ndarray:
    if a.dtype == np.int64 and not x64:
        if not fits_int32(a):
            raise InputError(f"{what} holds int64 values outside the int32 range, which this "
                             "executable computes in int32; lower the graph again with those values bound")
        return a.astype(np.int32)
    return a


def _needed(graph: Graph, plans: dict) -> list[bool]:
    """Which nodes the program computes: the outputs' dependencies, a planned node's through its plan."""
    return graph.needed(lambda i: plans[i].deps() if i in plans else graph.nodes[i].inputs)


def plan(graph: Graph, knobs: dict, widened: dict | None = None) -> tuple[Graph, dict, dict]:
    """The graph the program lowers (idioms decomposed under ``idioms="primitive"``), its node plans, and the
    panel weights those plans read (name -> :class:`.panels.PanelWeight`).

    Plans replace a node (and the intermediates only it used) by one library
    op: the peepholes (knob ``peephole``) and products read through a
    weight's panels (knob ``panels``, :mod:`.panels`; under ``stream="llvm"`` through the generated CPU
    product, panels of ``stream_width`` columns, reading the stored weight that a `widened` folded value
    copies), and under ``view_dots="llvm"`` products whose right side is a view of a larger value (attention's
    KV cache slots) through a generated CPU product that reads it in place (:mod:`.view_dots`).  Under
    ``peephole`` a
    product over a repeated operand (grouped-query attention's keys and
    values) is first split so the repeat stays a broadcast the dot reads as
    it is (:mod:`egraft.ir.grouped`), not a copy.
    """
    if knobs.get("idioms", "library") == "primitive":
        graph = decompose(graph)
    if knobs.get("peephole", True):
        graph = split_grouped_products(graph)
    plans = peephole.find(graph, knobs.get("windows", True)) if knobs.get("peephole", True) else {}
    stream = knobs.get("stream", "xla") == "llvm"
    width = int(knobs.get("stream_width", STREAM_WIDTH)) if stream else int(knobs.get("panels", 0) or 0)
    panel_plans, panel_weights = panels.find(graph, width, plans, stream, widened,
                                             knobs.get("stream_layout", "panels"), knobs.get("few_rows", "tiles"))
    plans.update(panel_plans)
    if knobs.get("view_dots", "xla") == "llvm":  # products reading a view of a value in place (.view_dots)
        plans.update(view_dots.find(graph, plans))
    return graph, plans, panel_weights


def emit(graph: Graph, inputs: list, weights: dict, ctx: LowerCtx, plans: dict | None = None) -> list:
    """Lower `graph` on traced values; returns its outputs.

    `plans` are :func:`plan`'s for this graph (None: made here from the
    knobs, after which `graph` must already be the one :func:`plan` lowers).
    A half-type state input passed as its bits (``int16``, see
    :func:`program_dtype`) stays bits where a cache update (``PutPlan``) or a
    product reading it in place (``ViewDotPlan``) takes it, and the state's
    new value is returned as bits; every other reader gets the float value
    (a bitcast XLA fuses into the reader).
    """
    from jax import lax

    if plans is None:
        graph, plans, _ = plan(graph, ctx.knobs)
    need = _needed(graph, plans)
    pos = {nid: k for k, nid in enumerate(graph.input_ids)}
    vals: dict[int, object] = {}
    # nodes whose value is held as the int16 bits of its half-type values: the state inputs passed so, to start
    bits = {nid for k, nid in enumerate(graph.input_ids)
            if dtypes.is_half(graph.nodes[nid].dtype) and inputs[k].dtype == STATE_BITS}
    passed = {graph.nodes[nid].attrs["name"]: nid for nid in graph.input_ids}
    view = functools.partial(realise_view, ctx)

    def val(j: int, raw: bool = False):
        return vals[j] if raw or j not in bits else lax.bitcast_convert_type(vals[j], ctx.jdt(graph.nodes[j].dtype))

    for i, n in enumerate(graph.nodes):
        if not need[i]:
            continue
        if n.op == Op.Input:
            if n.attrs["role"] != "weight":  # a call input or a state
                v = inputs[pos[i]]
            else:
                v = weights[n.attrs["name"]]
        elif i in plans:
            p = plans[i]
            if isinstance(p, panels.PanelPlan):  # its weight is the program's panel-form argument, not a node
                v = panels.emit_panel_dot(ctx, p, val(p.lhs), weights[p.name], view,
                                          weights[p.scales] if p.scales else None)
            else:
                raw = {p.src} & bits if isinstance(p, peephole.PutPlan) else \
                    {p.source} & bits if isinstance(p, view_dots.ViewDotPlan) else set()
                v = EMITTERS[type(p)](ctx, p, *[val(j, j in raw) for j in p.deps()], view)
                if isinstance(p, peephole.PutPlan) and raw:  # the update written into the bits
                    bits.add(i)
        else:
            v = RULES[n.op](ctx, n, *[val(j) for j in n.inputs])
        want = STATE_BITS if i in bits else ctx.jdt(n.dtype)
        if v.dtype != want:
            v = v.astype(want)
        vals[i] = v
    # a half-type state's new value goes out as bits (the dtype of the input it overwrites), every other as is
    return [(val(o, True) if o in bits else lax.bitcast_convert_type(val(o), STATE_BITS))
            if k in graph.aliases and passed[graph.aliases[k]] in bits else val(o) for k, o in enumerate(graph.outputs)]


# plan type -> emitter(ctx, plan, *values of plan.deps(), view_fn)
EMITTERS = {
    peephole.DotPlan: peephole.emit_dot,
    view_dots.ViewDotPlan: view_dots.emit,
    peephole.TakePlan: peephole.emit_take,
    peephole.PutPlan: peephole.emit_put,
    peephole.SlicesPlan: lambda ctx, p, x, view: peephole.emit_slices(ctx, p, x),
    windows.ConvPlan: windows.emit_conv,
    windows.PoolPlan: windows.emit_pool,
}


def program_dtype(dt: str, x64: bool, state: bool = False) -> np.dtype:
    """The numpy dtype a program takes an input of IR dtype `dt` in: int64 as int32 without x64, and a half-type
    `state` (a KV cache) as its bits, ``int16``.  XLA's CPU backend updates a bfloat16 or float16 array through
    float32: a cache's update in place became a conversion of the whole cache to float32 and back, every step
    (at four rows of a 135 M model, 180 conversions and most of the step's time); on 16-bit integers it is the
    update alone, in the donated buffer."""
    if state and dtypes.is_half(dt):
        return STATE_BITS
    return np.dtype(np.int32) if dt == "int64" and not x64 else dtypes.to_numpy(dt)
