"""A Dynamo graph as a module egraft can trace: weights bound, python values baked, tensor outputs only.

Dynamo lifts a module's parameters and buffers to graph inputs (they arrive
with every call, next to the user's tensors), while egraft's IR binds
weights by value so that the search can fold and concatenate them.
:class:`Bound` turns the graph back into a module whose buffers are those
weights and whose forward takes only the user's tensors; ``torch.export``
of it gives a program whose weights ``egraft.frontend.lower_program``
binds.  Python values among the inputs (a ``SymInt`` of a dynamic graph
arrives as an ``int`` at call time) are baked in, so one :class:`Bound`
serves one input signature.

The bound weights are copies taken at trace time; :meth:`Bound.stale` says
when a weight tensor was replaced or changed in place since (by torch's
version counter, which sees every in-place op except writes through
``.data`` and to tensors made under ``torch.inference_mode``), so the caller
recompiles instead of running on old values.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.fx import traceback as fx_traceback
from torch.utils import _pytree as pytree


def is_weight(node: torch.fx.Node, value: Any) -> bool:
    """Whether a Dynamo placeholder holds a module parameter or buffer (not a user input).

    Without Dynamo's source for it (``torch._dynamo.aot_compile`` graphs carry
    none), a tensor placeholder whose Dynamo name says it was reached from the
    compiled module (``L['self']``: ``l_self_...``) is the module's state too
    (a buffer, or a tensor a layer holds, such as a packed weight); if it is
    replaced or changed in place, :meth:`Bound.stale` sees it.
    """
    if isinstance(value, torch.nn.Parameter):
        return True
    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is None:
        return isinstance(value, torch.Tensor) and node.name.lower().startswith("l_self_")
    try:  # buffers are plain tensors: only their Dynamo source says they come from a module
        from torch._dynamo.source import is_from_unspecialized_param_buffer_source
    except ImportError:  # pragma: no cover - an older torch: such graphs bind buffers as inputs (still correct)
        return False
    return bool(is_from_unspecialized_param_buffer_source(source))


def written_in_place(gm: torch.fx.GraphModule) -> set[str]:
    """The placeholders the graph writes into in place (``buf.add_(1)``, ``cache.index_copy_(...)``, ``x[i] = v``):
    state the caller keeps, never a weight to bind (``plugins.state`` writes their new values back)."""
    out = set()
    for n in gm.graph.nodes:
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        if n.op in ("call_method", "call_function") and name.endswith("_") and not name.endswith("__") \
                or name in ("setitem", "__setitem__"):
            first = n.args[0] if n.args else None
            while isinstance(first, torch.fx.Node) and first.op != "placeholder" and first.args \
                    and isinstance(first.args[0], torch.fx.Node) and first.target in _VIEWS:
                first = first.args[0]  # a write through a view writes its base
            if isinstance(first, torch.fx.Node) and first.op == "placeholder":
                out.add(first.name)
    return out


_VIEWS = ("view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "narrow", "select",
          "__getitem__", "contiguous")


def placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def signature(args: Sequence[Any], skip: frozenset[int] = frozenset()) -> tuple:
    """What one compiled program is specialised on: tensor shapes, dtypes, devices and python values.

    ``skip``: positions left out (the weights, whose identity :meth:`Bound.stale` checks instead).
    """
    key = []
    for i, a in enumerate(args):
        if i in skip:
            continue
        if isinstance(a, torch.Tensor):
            key.append(("T", tuple(a.shape), a.dtype, a.device))
        else:
            key.append(("V", type(a).__name__, _value_key(a)))
    return tuple(key)


def _value_key(a: Any) -> Any:
    """A python input by value where it has one (numbers, strings, and hashable value types such as vLLM's
    ``LayerName``, a fresh object per call that compares by its string), else by identity."""
    if isinstance(a, (int, float, bool, str, type(None))):
        return a
    if type(a).__eq__ is not object.__eq__ and type(a).__hash__ is not None:
        try:
            hash(a)
            return ("eq", a)
        except TypeError:
            pass
    return ("id", id(a))


def _buffer_name(module: torch.nn.Module, node: torch.fx.Node, taken: set[str]) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in node.name).strip("_").lower() or "weight"
    while name in taken or not name[0].isalpha() or hasattr(module, name):
        name = "w_" + name
    taken.add(name)
    return name


class Bound(torch.nn.Module):
    """``fn(*args)`` with the arguments at ``weights`` bound as buffers and non-tensors baked in.

    ``forward(*user_tensors)`` returns the tensor leaves of ``fn``'s output
    as a tuple; :meth:`rebuild` puts a list of them back into ``fn``'s output
    structure (with its non-tensor leaves, fixed for this signature).
    """

    def __init__(self, fn, args: Sequence[Any], weights: set[int] | frozenset[int],
                 names: Sequence[torch.fx.Node] | None = None):
        super().__init__()
        self.fn = fn  # registered as a submodule when it is one: its own constants are weights too
        self._slots: list[tuple[str, Any]] = []  # per argument: ("weight", buffer) | ("user", k) | ("value", v)
        self.user_positions: list[int] = []
        self.weight_positions: list[int] = []
        taken: set[str] = set()
        for i, a in enumerate(args):
            if i in weights and isinstance(a, torch.Tensor):
                name = _buffer_name(self, names[i], taken) if names is not None else f"w{i}"
                self.register_buffer(name, a.detach())
                self._slots.append(("weight", name))
                self.weight_positions.append(i)
            elif isinstance(a, torch.Tensor):
                self._slots.append(("user", len(self.user_positions)))
                self.user_positions.append(i)
            else:
                self._slots.append(("value", a))
        self._weights = versions(args, self.weight_positions)  # the original tensors and their versions
        self._spec = None
        self._constants: dict[int, Any] = {}  # non-tensor output leaves by position

    def full_args(self, user: Sequence[torch.Tensor]) -> list:
        out = []
        for kind, v in self._slots:
            out.append(getattr(self, v) if kind == "weight" else user[v] if kind == "user" else v)
        return out

    def forward(self, *user: torch.Tensor):
        args = self.full_args(user)
        if isinstance(self.fn, torch.fx.GraphModule):
            # node by node, so that torch.export copies each node's stack trace (the user's source
            # line, which an unsupported-op message names) onto the ATen nodes it traces
            with fx_traceback.preserve_node_meta():
                out = torch.fx.Interpreter(self.fn).run(*args)
        else:
            out = self.fn(*args)
        leaves, self._spec = pytree.tree_flatten(out)  # the last run's structure is the one rebuilt
        self._constants = {k: v for k, v in enumerate(leaves) if not isinstance(v, torch.Tensor)}
        return tuple(v for v in leaves if isinstance(v, torch.Tensor))

    def user_args(self, args: Sequence[Any]) -> list[torch.Tensor]:
        return [args[i] for i in self.user_positions]

    def rebuild(self, tensors: Sequence[torch.Tensor]):
        """The output structure of ``fn`` around ``tensors`` (one per tensor leaf, in order)."""
        if self._spec is None:  # pragma: no cover - forward always runs before a rebuild
            raise RuntimeError("Bound.rebuild before the first forward")
        it = iter(tensors)
        leaves = [self._constants[k] if k in self._constants else next(it) for k in range(self._spec.num_leaves)]
        return pytree.tree_unflatten(leaves, self._spec)

    def stale(self, args: Sequence[Any]) -> bool:
        """Whether a bound weight was replaced by another tensor or changed in place since binding."""
        return changed(self._weights, args, self.weight_positions)


def versions(args: Sequence[Any], positions: Sequence[int]) -> list[tuple[torch.Tensor, int | None]]:
    """The weights at `positions` of `args` with their in-place versions (what :func:`changed` compares)."""
    return [(args[i], _version(args[i])) for i in positions]


def changed(before: Sequence[tuple[torch.Tensor, int | None]], args: Sequence[Any], positions: Sequence[int]) -> bool:
    """Whether the weights at `positions` of `args` are not `before` (:func:`versions`): one replaced by another
    tensor or updated in place since (the one staleness test of whole graphs and pieces)."""
    return len(before) != len(positions) or any(args[i] is not t or _version(t) != v
                                                for i, (t, v) in zip(positions, before))


def _version(t: torch.Tensor) -> int | None:
    """The in-place version counter; tensors made under ``torch.inference_mode`` have none (identity only)."""
    return None if t.is_inference() else t._version
