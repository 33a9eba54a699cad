"""``egraft.trace``: a PyTorch model into an egraft IR graph.

Two stages, each usable alone:

1. :func:`export_program` — ``torch.export.export``, then core ATen with
   :func:`decomposition_table`, except for the mid-level ops listed in
   :data:`KEEP_WHOLE` (attention, norms, softmax, GELU/SiLU), which stay one
   node so their lowering is the exact primitive form the e-graph's idiom
   rules recognise.  The exported graph is kept as it is when
   :mod:`egraft.frontend.training_ir` can make its in-place updates
   functional, and each node that needs it is decomposed as it is lowered
   (the graph ``run_decompositions`` would give, without its second trace of
   the whole model); otherwise ``run_decompositions`` makes it.
2. :func:`lower_program` — one rule per ATen op from
   ``egraft.frontend.lowering.LOWERINGS``, run node by node on a ``GraphBuilder``.
   Each result is checked against the node's ``meta['val']`` (shape; dtype
   is cast to torch's where promotion differs), so a wrong rule fails at the
   node that is wrong, not somewhere downstream.

Graph conventions (what :func:`trace` returns):

* parameters and buffers are weight inputs named by their state_dict FQN
  (``"layers.0.attn.q_proj.weight"``), values bound as numpy arrays
  (bfloat16 via ml_dtypes); lifted tensor constants become ``Constant``
  nodes;
* the model's own tensor inputs are ``Input`` nodes named after the exported
  placeholders (the forward's parameter names), in the model's order —
  positional args first, then tensor kwargs; ``graph.signature`` records for
  each the user's own name (``InputSpec.source``: the keyword a kwarg was
  passed by), as :mod:`egraft.frontend.signature` reads it from the export;
* a buffer or an input the forward pass updates in place (torch.export's
  ``BUFFER_MUTATION`` / ``USER_INPUT_MUTATION``) is an ``Input`` of role
  ``state`` (a buffer named by its FQN, with no source; an input with its
  source), passed on every call after the model's own inputs, never bound
  or folded; the output carrying its new value is aliased to it
  (``graph.aliases``).  The state updates are the first outputs, in export
  order, then the model's own;
* outputs are the model's outputs flattened in pytree order: a tuple, list or
  dict (including Hugging Face ``ModelOutput``) of tensors becomes that many
  graph outputs, nested containers flattened depth-first; ``None`` entries
  are dropped (torch.export drops them).
"""

from __future__ import annotations

import operator
import os
import re
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import EgraftError, InputError, IRError, TraceError, UnsupportedOpError
from ..ir import dtypes
from ..ir.builder import GraphBuilder, Tensor
from ..ir.graph import Graph
from ..ir.tensors import ir_dtypes, torch_dtype
from .lowering import UNSUPPORTED_HINTS, Ctx, Missing, lookup, op_name
from . import training_ir
from .decomposition import KEEP_WHOLE, decomposition_table  # noqa: F401 (public here too)
from .signature import input_specs
from .sizes import SizeBinding, is_size, is_symbolic
from .weights import WeightCopies

# --- stage 1: export ----------------------------------------------------------------

class _FunctionModule(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def export_program(model, example_inputs: Sequence[Any], kwargs: dict | None = None,
                   decompositions: dict | None = None, dynamic_shapes=None) -> torch.export.ExportedProgram:
    """torch.export the model and decompose it to core ATen (minus :data:`KEEP_WHOLE`): at lowering, node by node,
    where :func:`egraft.frontend.training_ir.prepare` takes the exported graph; by ``run_decompositions`` otherwise
    and whenever `decompositions` is given.

    `dynamic_shapes`: torch.export's, to export one program for a range of sizes
    (:func:`lower_program` then lowers it at concrete shapes)."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise InputError(f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}")
    for k, a in enumerate(example_inputs):
        if not isinstance(a, torch.Tensor):
            raise InputError(
                f"example input {k} is a {type(a).__name__}, not a torch.Tensor; egraft traces tensor inputs "
                "only. Bind python values in the model (e.g. functools.partial or a wrapper module) or pass "
                "them as keyword arguments via kwargs=..., where they are baked into the graph")
        if a.dtype not in _TORCH_DTYPES:
            raise InputError(f"example input {k} has dtype {a.dtype}; egraft supports {', '.join(dtypes.DTYPES)}")
    if not isinstance(model, torch.nn.Module):
        if not callable(model):
            raise InputError(f"model must be a torch.nn.Module or a callable, got {type(model).__name__}")
        model = _FunctionModule(model)
    name = type(model).__name__
    try:
        with torch.no_grad():
            ep = torch.export.export(model, tuple(example_inputs), kwargs=kwargs or None,
                                     dynamic_shapes=dynamic_shapes)
    except EgraftError:
        raise
    except Exception as e:  # torch raises many types here; summarise whichever it is
        raise TraceError(
            f"torch.export could not capture {name}: {_summarise(e)}\n  what to do: make the forward pass "
            "traceable (no data-dependent python control flow, no .item()/.tolist() feeding python logic, no "
            "unsupported python side effects); torch's message above says where. "
            "See https://pytorch.org/docs/stable/export.html") from e
    if decompositions is None and training_ir.wanted() and training_ir.prepare(ep):
        return ep  # lowered as it is, each node as run_decompositions would make it (module training_ir)
    try:
        with warnings.catch_warnings():  # torch's own deepcopy of pytree specs warns about its own API
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            return ep.run_decompositions(decompositions if decompositions is not None else decomposition_table())
    except Exception as e:
        raise TraceError(f"decomposing {name}'s exported graph to core ATen failed: {_summarise(e)}") from e


_TORCH_DTYPES = ir_dtypes()


def _summarise(e: Exception, lines: int = 6) -> str:
    text = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    head = "\n    ".join(text[:lines]) + ("\n    ..." if len(text) > lines else "")
    return f"{type(e).__name__}: {head}"


# --- stage 2: lowering -----------------------------------------------------------------

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
_TORCH_DIR = os.path.dirname(torch.__file__)


def source_line(node: torch.fx.Node) -> str | None:
    """'file:line in fn: code' of the last stack frame outside torch itself, from meta['stack_trace']."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    frames = _FRAME.findall(trace)
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)] or frames
    if not user:
        return None
    path, line, fn, code = user[-1]
    return f"{path}:{line} in {fn}: {code.strip()}"


def _weight_array(t: torch.Tensor, name: str, copies: WeightCopies) -> np.ndarray:
    if t.dtype not in _TORCH_DTYPES:
        raise InputError(f"weight {name!r} has dtype {t.dtype}; egraft supports {', '.join(dtypes.DTYPES)}")
    return copies.get(t.detach())  # a copy: the graph must not change when the model's parameters do


def lower_program(ep: torch.export.ExportedProgram, weights: WeightCopies | None = None,
                  shapes: Sequence[Sequence[int]] | None = None, specs=None) -> Graph:
    """Lower an exported (and decomposed) program to an IR graph, one ATen node at a time.

    A program exported with symbolic sizes (``dynamic_shapes``) is lowered at
    `shapes`, the concrete shape of each of its tensor inputs (in order):
    :class:`~egraft.frontend.sizes.SizeBinding` gives every node's value at
    those sizes, so one export serves every size in its range.

    The graph's signature is :func:`~egraft.frontend.signature.program_signature`'s (the input names and
    the user's own names for them, the state inputs and their aliases).  `weights`: where the weight
    copies come from (:class:`~egraft.frontend.weights.WeightCopies`; pass the same one to the traces of
    one model's several sizes and they share their weight arrays); default: copies of this graph's own.
    `specs`: :func:`~egraft.frontend.signature.input_specs` of `ep` when the caller read them already
    (a program of fixed sizes, unchanged since); read here otherwise.
    """
    try:
        return _lower_program(ep, weights, shapes, specs)
    except training_ir.Undecomposed:  # a node torch would not trace alone: the whole program decomposed after all
        return _lower_program(training_ir.decomposed(ep), weights, shapes, None)


def _lower_program(ep, weights, shapes, specs) -> Graph:
    copies = WeightCopies() if weights is None else weights
    from torch.export.graph_signature import InputKind, OutputKind

    meta = _metas(ep, shapes)
    sig, specs = specs if specs is not None and shapes is None else input_specs(ep, meta)
    mutated = (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)
    b = GraphBuilder()
    gs = ep.graph_signature
    env: dict[torch.fx.Node, Any] = {}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(gs.input_specs):  # pragma: no cover - torch invariant
        raise IRError("exported program has a different number of placeholders and input specs")
    for node, spec in zip(placeholders, gs.input_specs):
        kind = spec.kind
        if kind == InputKind.BUFFER and sig[spec.target].role == "state":
            s = sig[spec.target]
            env[node] = b.input(s.name, s.shape, s.dtype, role="state")
        elif kind in (InputKind.PARAMETER, InputKind.BUFFER):
            value = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
            env[node] = b.weight(spec.target, _weight_array(value, spec.target, copies))
        elif kind == InputKind.CONSTANT_TENSOR:
            env[node] = b.tensor_constant(_weight_array(ep.constants[spec.target], spec.target, copies))
        elif node.name in specs:  # a tensor the caller passes
            s = specs[node.name]
            env[node] = b.input(s.name, s.shape, s.dtype, role=s.role)
        else:  # a python constant kwarg: baked in by export
            env[node] = getattr(spec.arg, "value", None)
    def lower(node, env):
        if shapes is not None and is_size(node.meta.get("val")):
            return meta(node)  # a size the model computes (sym_size, operator.sub, ...): its value at `shapes`
        return _lower_node(b, node, env, meta)

    decomposer = training_ir.Decomposer(ep) if training_ir.is_prepared(ep) else None
    try:
        for node in ep.graph.nodes:
            if node.op == "call_function":
                if decomposer is not None and decomposer.takes(node):
                    env[node] = decomposer.lower(node, env, lower)
                else:
                    env[node] = lower(node, env)
            elif node.op == "output":
                outs = node.args[0]
    finally:
        if decomposer is not None:
            decomposer.close()
    outputs, aliases = [], {}
    for spec, out in zip(gs.output_specs, outs):
        if spec.kind in mutated:
            target = spec.target if spec.kind == OutputKind.BUFFER_MUTATION else specs[spec.target].name
            aliases[len(outputs)] = target
        elif spec.kind != OutputKind.USER_OUTPUT:
            raise UnsupportedOpError(f"exported output of kind {spec.kind.name}", None,
                                     "egraft compiles model outputs and in-place updates of buffers and inputs")
        if out is None:
            continue  # a None output (torch.export keeps some): dropped, as the module docstring says
        value = env.get(out) if isinstance(out, torch.fx.Node) else out
        if isinstance(value, Missing):
            raise UnsupportedOpError(f"{value.op} output {value.index}", None, value.why)
        if not isinstance(value, Tensor):
            raise InputError(f"model output {len(outputs)} is {value!r}, not a tensor; egraft graphs return tensors")
        outputs.append(value)
    sources = {s.name: s.source for s in sig.run_inputs if s.source is not None}
    return b.build(outputs, aliases=aliases, sources=sources)


def _metas(ep, shapes) -> Callable[[torch.fx.Node], Any]:
    """node -> its ``meta['val']``, at `shapes` when the program has symbolic sizes (module ``sizes``)."""
    if shapes is None:
        if is_symbolic(ep):
            raise InputError("this program was exported with symbolic sizes: lower it at concrete input shapes "
                             "(lower_program(ep, shapes=[...]))")
        return lambda node: node.meta.get("val")
    return SizeBinding(ep, shapes).meta


def _map_args(node: torch.fx.Node, env) -> tuple[list, dict]:
    def get(a):
        if isinstance(a, torch.fx.Node):
            v = env[a]
            if isinstance(v, Missing):
                raise UnsupportedOpError(f"{v.op} output {v.index}", source_line(node), v.why)
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(get(x) for x in a)
        if isinstance(a, torch.dtype):
            return a
        if isinstance(a, torch.device) or isinstance(a, torch.layout) or isinstance(a, torch.memory_format):
            return None
        return a

    return [get(a) for a in node.args], {k: get(v) for k, v in node.kwargs.items()}


def _lower_node(b: GraphBuilder, node: torch.fx.Node, env, meta_of):
    target = node.target
    if target is operator.getitem:
        seq, i = node.args
        return env[seq][i]
    name = op_name(target)
    rule = lookup(target)
    source = source_line(node)
    if rule is None:
        packet = name.rsplit(".", 1)[0] if name.count(".") == 2 else name
        raise UnsupportedOpError(name, source, UNSUPPORTED_HINTS.get(packet) or UNSUPPORTED_HINTS.get(name))
    args, kwargs = _map_args(node, env)
    if rule.upcast:
        args = [_up(a) for a in args]
        kwargs = {k: _up(v) for k, v in kwargs.items()}
    meta = meta_of(node)
    for m in meta if isinstance(meta, (tuple, list)) else (meta,):
        if isinstance(m, torch.Tensor) and m.dtype not in _TORCH_DTYPES:
            raise UnsupportedOpError(f"{name} (producing {m.dtype})", source,
                                     f"egraft's IR has the dtypes {', '.join(dtypes.DTYPES)}; complex, unsigned "
                                     "and 8-bit tensors must stay outside the compiled region")
    arg_metas = [meta_of(a) if isinstance(a, torch.fx.Node) else None for a in node.args]
    ctx = Ctx(b, name, meta, source, rule.upcast, arg_metas)
    try:
        result = rule.fn(ctx, *args, **kwargs)
    except UnsupportedOpError:
        raise  # rules raise these through ctx.unsupported, which names the source line
    except Exception as e:  # a bug in a rule or an argument it does not handle: say which op and where
        raise IRError(f"lowering {name} failed{' at ' + source if source else ''}: {type(e).__name__}: {e}") from e
    return _check(name, source, result, meta)


def _up(a):
    if isinstance(a, Tensor) and dtypes.is_half(a.dtype):
        return a.cast(dtypes.compute_name(a.dtype))
    if isinstance(a, (list, tuple)):
        return type(a)(_up(x) for x in a)
    return a


def _check(name: str, source: str | None, result, meta):
    """Compare a rule's result with torch's meta['val']: shapes must match, dtypes are cast to torch's."""
    if isinstance(meta, torch.Tensor):
        if isinstance(result, (tuple, list)) and len(result) == 1:
            result = result[0]
        if not isinstance(result, Tensor):
            raise IRError(f"lowering rule for {name} returned {type(result).__name__}, expected a tensor"
                          f"{' (at ' + source + ')' if source else ''}")
        want = tuple(int(s) for s in meta.shape)
        if result.shape != want:
            raise IRError(f"lowering rule for {name} produced shape {result.shape}, torch says {want}"
                          f"{' (at ' + source + ')' if source else ''}; this is a bug in egraft's lowering")
        return result.cast(dtypes.from_torch(meta.dtype))
    if isinstance(meta, (tuple, list)) and isinstance(result, (tuple, list)):
        if len(result) != len(meta):
            raise IRError(f"lowering rule for {name} returned {len(result)} outputs, torch says {len(meta)}")
        return tuple(r if isinstance(r, Missing) or m is None else _check(f"{name}[{i}]", source, r, m)
                     for i, (r, m) in enumerate(zip(result, meta)))
    return result


def trace(model, example_inputs: Sequence[Any], kwargs: dict | None = None,
          weights: WeightCopies | None = None) -> Graph:
    """Lower ``model(*example_inputs, **kwargs)`` into an egraft IR graph with its weights bound.

    ``example_inputs`` are tensors (their shapes and dtypes are fixed in the
    graph); non-tensor ``kwargs`` (e.g. ``use_cache=False``) are baked in.
    Raises :class:`~egraft.errors.TraceError` when torch.export cannot capture
    the model and :class:`~egraft.errors.UnsupportedOpError` (naming the ATen
    op and the model's source line) when an op has no lowering rule.  `weights`: as in
    :func:`lower_program` (one :class:`~egraft.frontend.weights.WeightCopies` for several traces of one
    model: its weights are copied once).
    """
    return lower_program(export_program(model, example_inputs, kwargs), weights)
