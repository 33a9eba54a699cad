"""Lowering ``torch.export``'s own graph, without ``run_decompositions``' second trace.

``torch.export.export`` gives a graph of the model's ATen calls as it made
them (linear, reshape, ``.to``, in-place ``scatter_`` into a cache buffer).
``run_decompositions`` then traces that whole graph again through
functionalisation and the decompositions to reach core ATen: on a 24-layer
494 M-parameter model 19.7 s, where the export took 6.7 s.  Most of its
nodes come through unchanged; only a few kinds need work, and a stack of
layers repeats the same few calls at the same sizes.  So the tracer
(:func:`egraft.frontend.tracer.export_program`) keeps the exported graph
when :func:`prepare` can make it functional, and the lowering asks this
module for what ``run_decompositions`` would have made of each node:

* **in-place updates** (:func:`prepare`): an op that writes its first
  argument (``cache.scatter_(...)``, ``x.add_(y)``) becomes its functional
  form, and every later reader of the written tensor reads the new value;
  a written buffer or input becomes a state update (a ``BUFFER_MUTATION`` /
  ``USER_INPUT_MUTATION`` output, first among the outputs, as
  ``run_decompositions`` orders them).  Only where no view of the written
  tensor is read after the write, and the written tensor is not itself a
  view (else the write would reach another tensor): otherwise ``prepare``
  refuses and the tracer decomposes as before;
* **the ops run_decompositions rewrites** (:class:`Decomposer`): those of
  the decomposition table and the composite ops torch does not keep
  (``linear``, ``reshape``, ``.to``, ...), decided by torch's own split of
  the table (``_split_decomp_table_to_cia_and_python_decomp``).  Each is
  traced alone with ``make_fx`` under the same table and the same
  composite-op overrides, on the node's own fake values (symbolic sizes
  included), and the few nodes it becomes are lowered in its place.  A trace
  is kept per op, arguments and argument types, so the 24 layers' calls
  cost one trace each.

Both paths give the same IR graph: ``tests/frontend/test_training_ir.py``
compares their structural hashes on every family of the generation matrix
and the model zoo, at several sizes.  ``EGRAFT_DECOMPOSE=1`` makes the
tracer decompose every program the old way.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import weakref
from typing import Any, Callable

import torch

from ..env import flag

ENV_VAR = "EGRAFT_DECOMPOSE"

# the exported programs prepare() made functional (kept undecomposed) -> their decompositions traced so far (per
# call key: a program's other sizes reuse them)
_KEPT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def wanted() -> bool:
    """Whether the tracer may keep the exported graph: ``EGRAFT_DECOMPOSE=1`` makes it decompose every program,
    and so does a torch without the pieces of ``run_decompositions`` this module calls."""
    return not flag(ENV_VAR, False) and _available()


@functools.lru_cache(maxsize=1)
def _available() -> bool:
    try:
        _tables()
        from torch._dispatch.python import enable_python_dispatcher  # noqa: F401
        from torch._guards import detect_fake_mode  # noqa: F401
        from torch.export.exported_program import _override_composite_implicit_decomp  # noqa: F401
        from torch.fx.experimental.proxy_tensor import make_fx  # noqa: F401
    except (ImportError, AttributeError):  # torch's private names moved: decompose the whole program instead
        return False
    return True


class Undecomposed(Exception):
    """A node the per-node trace could not take: the tracer lowers :func:`decomposed` instead."""


_DECOMPOSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def decomposed(ep):
    """`ep` (prepared) through ``run_decompositions``, made once per program (its other sizes reuse it)."""
    from .decomposition import decomposition_table

    if ep not in _DECOMPOSED:
        ep.graph_module.recompile()  # the module's code follows the graph prepare() rewrote: torch runs it here
        _DECOMPOSED[ep] = ep.run_decompositions(decomposition_table())
    return _DECOMPOSED[ep]


def is_prepared(ep) -> bool:
    return ep in _KEPT


@functools.lru_cache(maxsize=1)
def _tables():
    """(composite ops -> their decomposition or torch's keep-marker, the other decompositions, the keep-marker)."""
    from torch._export.utils import _special_op_to_preserve_cia
    from torch.export.exported_program import _split_decomp_table_to_cia_and_python_decomp

    from .decomposition import decomposition_table

    cia, table = _split_decomp_table_to_cia_and_python_decomp(decomposition_table())
    return cia, table, _special_op_to_preserve_cia


def needs_decomposing(op) -> bool:
    """Whether ``run_decompositions`` (with the tracer's table) rewrites a call of `op`."""
    cia, table, keep = _tables()
    how = cia.get(op)
    if how is not None:
        return how is not keep
    return op in table or torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _writes_first(op) -> bool:
    """`op` writes its first argument and nothing else (``x.add_(y)``, ``cache.scatter_(...)``)."""
    args = op._schema.arguments
    written = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
    return bool(args) and written == [args[0]]


def _functional(op):
    """The functional overload of an in-place op (``aten.scatter_.src`` -> ``aten.scatter.src``), or None."""
    packet = op._schema.name.split("::")[1]
    if not packet.endswith("_") or packet.startswith("_"):
        return None
    base = getattr(getattr(torch.ops, op.namespace), packet[:-1], None)
    f = getattr(base, op._overloadname, None) if base is not None else None
    return f if isinstance(f, torch._ops.OpOverload) and not f._schema.is_mutable else None


def _is_view(node: torch.fx.Node) -> bool:
    """A call whose result may share memory with an argument (a view such as slice, transpose, expand)."""
    t = node.target
    if not isinstance(t, torch._ops.OpOverload):
        return t is operator.getitem
    return any(r.alias_info is not None for r in t._schema.returns)


def _view_read_after(write: torch.fx.Node, tensors: list, order: dict) -> bool:
    """Whether a view of `tensors` (the written tensor and its earlier writes), taken before `write`, directly or
    through other views (``split`` then ``getitem``), is read after it: such a view would see the write."""
    seen, stack = set(), list(tensors)
    while stack:
        for u in stack.pop().users:
            if u is not write and u not in seen and order[u] < order[write] and _is_view(u):
                if any(order[v] > order[write] for v in u.users):
                    return True
                seen.add(u)
                stack.append(u)
    return False


def prepare(ep) -> bool:
    """Make `ep`'s in-place updates functional in place (module docstring); whether `ep` can be lowered as it is.

    False (and `ep` untouched) when some node is neither an ATen call, a size nor a ``getitem`` (a higher-order
    op such as a ``no_grad`` region), or an in-place update is not one :func:`prepare` can rewrite."""
    from torch.export.graph_signature import InputKind, OutputKind, OutputSpec, TensorArgument

    nodes = list(ep.graph.nodes)
    order = {n: k for k, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    kind = {p: s for p, s in zip(placeholders, ep.graph_signature.input_specs)}
    writes, root_of = [], {}  # (write, its functional op); write -> the tensor it writes at bottom
    for n in nodes:
        if n.op != "call_function":
            continue
        t = n.target
        if t is operator.getitem or isinstance(n.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat)):
            continue
        if not isinstance(t, torch._ops.OpOverload):
            return False
        if not t._schema.is_mutable:
            continue
        f = _functional(t)
        x = n.args[0] if n.args else None
        if f is None or not _writes_first(t) or not isinstance(x, torch.fx.Node):
            return False
        root = root_of.get(x, x)
        if root.op == "call_function" and _is_view(root):
            return False  # a write through a view reaches its base
        if root.op == "placeholder" and kind[root].kind not in (InputKind.BUFFER, InputKind.USER_INPUT):
            return False
        if _view_read_after(n, [root] + [w for w, r in root_of.items() if r is root], order):
            return False
        writes.append((n, f))
        root_of[n] = root
    last: dict[torch.fx.Node, torch.fx.Node] = {}  # a written buffer or input -> its last write
    for n, f in writes:
        x = n.args[0]
        n.target = f
        for u in list(x.users):  # later readers read the written value
            if u is not n and order[u] > order[n]:
                u.replace_input_with(x, n)
        last[root_of[n]] = n
    specs = []
    for p in placeholders:
        if p in last:
            s = kind[p]
            if s.kind == InputKind.BUFFER:
                specs.append(OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(last[p].name), s.target))
            else:
                specs.append(OutputSpec(OutputKind.USER_INPUT_MUTATION, TensorArgument(last[p].name), p.name))
    out = next(n for n in reversed(nodes) if n.op == "output")
    out.args = ((*[last[p] for p in placeholders if p in last], *out.args[0]),)
    ep.graph_signature.output_specs[:0] = specs
    ep.graph.eliminate_dead_code()  # what nothing reads is not lowered (run_decompositions drops it too)
    ep.graph.lint()
    _KEPT[ep] = {}
    return True


class Decomposer:
    """What ``run_decompositions`` makes of one node, traced once per op and argument types, lowered in place.

    One per lowering of `ep` (a program's traces are kept for its other sizes); :meth:`close` when done."""

    def __init__(self, ep):
        from torch._guards import detect_fake_mode

        self._traces: dict[tuple, torch.fx.GraphModule] = _KEPT[ep]
        self._overrides = None
        # the export's fake mode (its shape environment holds the size symbols): a traced op that makes a tensor
        # from sizes alone (arange(t - 1)) makes a fake one there, of symbolic size, not a real one of the example's
        self._fake = detect_fake_mode([n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"])

    @staticmethod
    def takes(node: torch.fx.Node) -> bool:
        """Whether `node` is a call ``run_decompositions`` would rewrite (not a size the model computes)."""
        t = node.target
        return (isinstance(t, torch._ops.OpOverload)
                and not isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat))
                and needs_decomposing(t))

    def close(self) -> None:
        if self._overrides is not None:
            self._overrides.__exit__(None, None, None)
            self._overrides = None

    def _trace(self, node: torch.fx.Node) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
        """(the node's decomposition as a graph of its tensor arguments, those arguments), traced once per key."""
        from torch._dispatch.python import enable_python_dispatcher
        from torch.export.exported_program import _override_composite_implicit_decomp
        from torch.fx.experimental.proxy_tensor import make_fx

        tensors: list[torch.fx.Node] = []  # the node's fx arguments: tensors and sizes the model computed

        def slot(a):
            tensors.append(a)
            return _Slot(len(tensors) - 1)

        args = torch.fx.node.map_arg(node.args, slot)
        kwargs = torch.fx.node.map_arg(node.kwargs, slot)
        key = (node.target, _key(args), _key(kwargs), tuple(_key(t.meta["val"]) for t in tensors))
        if key not in self._traces:
            cia, table, _ = _tables()
            if self._overrides is None:
                self._overrides = _override_composite_implicit_decomp(cia)
                self._overrides.__enter__()
            target = node.target

            def call(*xs):
                put = functools.partial(_fill, xs)
                return target(*put(args), **put(kwargs))

            # (detached: a parameter's value requires grad, and a decomposition may branch on that, as matmul's
            # folding does; run_decompositions traces values that do not)
            vals = [v.detach() if isinstance(v, torch.Tensor) else v for v in (t.meta["val"] for t in tensors)]
            # (through the python dispatcher, as run_decompositions' trace: its composite kernels written in python,
            # matmul's among them, decide otherwise than the C++ ones on symbolic strides)
            try:
                with torch.no_grad(), enable_python_dispatcher(), self._fake or contextlib.nullcontext():
                    gm = make_fx(call, decomposition_table=table, tracing_mode="real")(*vals)
            except Exception as e:  # noqa: BLE001 - torch's trace of one op alone: the whole program's instead
                raise Undecomposed(f"{node.target} at {node.name}: {type(e).__name__}: {e}") from e
            gm.graph.eliminate_dead_code()  # (a decomposition's unused values: batch norm's uint8 reserve)
            self._traces[key] = gm
        return self._traces[key], tensors

    def lower(self, node: torch.fx.Node, env: dict, lower_node: Callable[[torch.fx.Node, dict], Any]):
        """`node`'s lowered value: its decomposition's nodes lowered by `lower_node(sub_node, sub_env)` (which
        gives a size its value, as the tracer's loop does)."""
        gm, tensors = self._trace(node)
        sub: dict[torch.fx.Node, Any] = {}
        k = 0
        for s in gm.graph.nodes:
            s.meta["stack_trace"] = node.meta.get("stack_trace")  # an error names the model's line
            if s.op == "placeholder":
                sub[s] = env[tensors[k]]
                k += 1
            elif s.op == "call_function":
                sub[s] = lower_node(s, sub)
            elif s.op == "output":
                return torch.fx.node.map_arg(s.args[0], lambda a: sub[a])
        raise AssertionError("a traced decomposition without an output")  # pragma: no cover


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __repr__(self):
        return f"<arg {self.i}>"


def _fill(xs, a):
    if isinstance(a, _Slot):
        return xs[a.i]
    if isinstance(a, (list, tuple)):
        return type(a)(_fill(xs, b) for b in a)
    if isinstance(a, dict):
        return {k: _fill(xs, v) for k, v in a.items()}
    return a


def _key(v) -> Any:
    """A hashable stand-in for an argument: tensors by shape, strides and dtype (sizes as expressions)."""
    if isinstance(v, torch.Tensor):
        return ("T", tuple(map(str, v.shape)), tuple(map(str, v.stride())), v.dtype, v.device.type)
    if isinstance(v, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return ("S", str(v.node.expr))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_key(x) for x in v))
    if isinstance(v, dict):
        return ("D", tuple(sorted((k, _key(x)) for k, x in v.items())))
    if isinstance(v, _Slot):
        return ("A", v.i)
    return ("V", type(v).__name__, repr(v))


__all__ = ["ENV_VAR", "Decomposer", "Undecomposed", "decomposed", "is_prepared", "needs_decomposing", "prepare",
           "wanted"]
