"""One input signature of a model, compiled: trace it, then the one pipeline (search, executable, check).

A :class:`CompiledProgram` is everything ``egraft.compile`` knows about one input
signature (the shapes, dtypes and devices of the tensor inputs, and the
values of the non-tensor keyword arguments): the executable, the search
result, the model's output structure, how the compiled program compared
with eager PyTorch, and the seconds each stage took.

:func:`build` traces the model and hands the graph to
:func:`egraft.search.pipeline.compile_program`, the pipeline every entry
point shares, with the user's model in eager PyTorch as the reference and
two check input sets: the example inputs (real data, e.g. valid token ids)
and one fresh random set drawn like them (:func:`egraft.measure.like`).
The pipeline's docstring says how the check decides; a disagreement raises
:class:`egraft.errors.ValidationError`, and a wrong program is never
returned.

A model that updates its own buffers (a KV cache, a step counter) compiles
to a program whose state inputs are those buffers: each call passes the
buffers' current values (checked against the traced shape and dtype, one
:class:`~egraft.errors.InputError` naming the buffer) and writes the new
values back into them (the torch backend writes in place), as eager
PyTorch would.  The checks run the eager model on copies of the state and
leave its buffers as they were.  A model that writes into its own *inputs*
is refused with a clear error.
"""

from __future__ import annotations

import functools
import inspect
import time as _time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import torch

from ..errors import InputError
from ..frontend import trace
from ..ir import dtypes
from ..ir.tensors import ir_dtypes
from ..measure import like
from ..measure.memory import mark
from ..runtime.outputs import describe, rebuild
from ..search.config import CompileConfig
from ..search.pipeline import CompiledSignature, compile_program
from .half_products import FloatProducts, float_products_for

_TORCH_DTYPES = ir_dtypes()  # torch dtype -> IR name: the call key reads it per input


@dataclass
class CompiledProgram:
    """One input signature of a model: its compiled program (the pipeline's :class:`CompiledSignature`: the
    executable, its device and state convention, the evidence) and what calling it as the model takes."""

    name: str  # "4x32:float32,2x8:int64" (+ "@cuda:0" off the CPU): the signature as a user reads it
    key: tuple  # what a call is looked up by (shapes, dtypes, devices; kwarg names and values)
    compiled: CompiledSignature
    input_names: list[str]
    kwarg_order: tuple[str, ...]  # tensor kwargs, in the order the program takes them (after the positionals)
    output_tree: dict
    example: tuple[tuple, dict]  # the fresh random input set (args, kwargs): the comparison times calls on it
    traced: dict  # nodes, ops, weights, weight bytes of the traced program
    stages: dict[str, float]  # seconds: trace, saturate, search, lower, validate
    comparison: dict | None = None  # filled by CompiledModel.measure (egraft.measure.compare_model)
    call: Callable = field(default=None, repr=False)  # flat tensors in -> the model's output structure

    state: tuple = ()  # (buffer name, InputSpec) per state input, in the executable's order
    model: Any = field(default=None, repr=False)

    @property
    def executable(self):
        return self.compiled.executable

    @property
    def result(self):  # egraft.search.SearchResult
        return self.compiled.result

    @property
    def validation(self) -> dict | None:  # the pipeline's check against eager (None: compiled with validate=False)
        return self.compiled.check

    @property
    def searched(self) -> bool:  # False: lowered with an earlier size's winning backend and knobs (build's `reuse`)
        return self.compiled.searched

    def __post_init__(self):
        ex, shape = self.executable, functools.partial(rebuild, self.output_tree)
        if not self.state:
            self.call = lambda *xs: shape(ex(*xs))
            return
        names, order, own = self.compiled.state
        if names != [name for name, _ in self.state]:  # pragma: no cover - build makes both from one signature
            raise InputError(f"the compiled program's state {names} is not the model's {[n for n, _ in self.state]}")
        pos = dict(zip(names, order))

        def call(*xs):  # the buffers' current values go in; their new values are written back (in place)
            bufs = [state_buffer(self.model, name, spec) for name, spec in self.state]
            outs = ex(*xs, *bufs)
            with torch.no_grad():
                for (name, _), buf in zip(self.state, bufs):
                    new = outs[pos[name]]
                    if new is not buf:
                        buf.copy_(new)
            return shape([outs[k] for k in own])

        self.call = call


def state_buffer(model: torch.nn.Module, name: str, spec) -> torch.Tensor:
    """The model's buffer `name`, checked against the compiled program's state `spec` (shape and dtype)."""
    buf = model.get_buffer(name)
    if tuple(buf.shape) != tuple(spec.shape) or _TORCH_DTYPES.get(buf.dtype) != spec.dtype:
        raise InputError(f"state buffer {name!r} is {tuple(buf.shape)} {str(buf.dtype).removeprefix('torch.')}, "
                         f"the compiled program expects {tuple(spec.shape)} {spec.dtype}; keep the buffer's "
                         "shape and dtype, or compile the model again")
    return buf


# --- signatures -----------------------------------------------------------------------------------

def call_key(args: tuple, kwargs: dict) -> tuple:
    """The lookup key of a call: the program's :meth:`~egraft.ir.signature.Signature.key` and where it runs.

    A compiled program is found by its signature's key, ``((shape, dtype), ...)``
    per call input (the positional tensors, then the tensor kwargs in the
    program's order), with the tensors' devices and the non-tensor kwarg
    values beside it (they are baked into the program).  :func:`program_key`
    builds the same key from the traced signature, and :func:`build` checks
    the two agree.  The positional part is what the call path computes for
    every call (one tuple, one dict lookup): ``torch.Size`` compares and
    hashes as the tuple of its dims.
    """
    types = tuple([(a.shape, _TORCH_DTYPES[a.dtype]) for a in args])
    devices = tuple([a.device for a in args])
    if not kwargs:
        return types, devices
    tensors = tuple((k, (v.shape, _TORCH_DTYPES[v.dtype]), v.device) for k, v in sorted(kwargs.items())
                    if isinstance(v, torch.Tensor))
    return types, devices, tensors, _python_values(kwargs)


def _python_values(kwargs: dict) -> tuple:
    """The non-tensor kwargs, by name: each by its value, or by its repr when unhashable."""
    out = []
    for k, v in sorted(kwargs.items()):
        if isinstance(v, torch.Tensor):
            continue
        try:
            hash(v)
            out.append((k, "value", v))
        except TypeError:
            out.append((k, "repr", repr(v)))
    return tuple(out)


def program_key(graph, args: tuple, kwargs: dict, kwarg_order: tuple[str, ...]) -> tuple:
    """:func:`call_key` of a call that fits the traced `graph`, built from ``graph.signature``."""
    sig = graph.signature.key()
    n = len(args)
    devices = tuple([a.device for a in args])
    if not kwargs:
        return sig[:n], devices
    by_name = dict(zip(kwarg_order, sig[n:]))
    tensors = tuple((k, by_name[k], kwargs[k].device) for k in sorted(by_name))
    return sig[:n], devices, tensors, _python_values(kwargs)


def signature_name(args: tuple, kwargs: dict) -> str:
    """The signature as ``SHAPE:DTYPE`` per input (the CLI's ``--input`` form), kwargs as ``name=...``."""
    def one(t: torch.Tensor) -> str:
        return ("x".join(str(int(s)) for s in t.shape) or "scalar") + ":" + str(t.dtype).removeprefix("torch.")

    parts = [one(a) for a in args]
    for k in sorted(kwargs):
        v = kwargs[k]
        parts.append(f"{k}={one(v) if isinstance(v, torch.Tensor) else repr(v)}")
    devices = {str(t.device) for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)}
    off_cpu = sorted(d for d in devices if d != "cpu")
    return ",".join(parts) + (f"@{'+'.join(off_cpu)}" if off_cpu else "")


def check_call(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Clear errors for inputs egraft cannot compile for, before torch.export sees them."""
    for k, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise InputError(f"input {k} is a {type(a).__name__}, not a torch.Tensor; a compiled model takes "
                             "tensors as positional inputs (pass python values as keyword arguments, where they "
                             "are baked into the program)")
    for k, a in list(enumerate(args)) + list(kwargs.items()):
        if isinstance(a, torch.Tensor) and a.dtype not in _TORCH_DTYPES:
            raise InputError(f"input {k!r} has dtype {a.dtype}; egraft compiles {', '.join(dtypes.DTYPES)}")
    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as e:
        raise InputError(f"{type(model).__name__}.forward cannot take these inputs ({len(args)} positional, "
                         f"keywords {sorted(kwargs) or 'none'}): {e}") from None
    except ValueError:  # no signature to read (a C-implemented forward): torch.export will say
        pass


# --- the stages -----------------------------------------------------------------------------------

def build(model: torch.nn.Module, args: tuple, kwargs: dict, key: tuple, config: CompileConfig,
          status: Callable[[str], None], reuse: CompiledProgram | None = None, weights=None,
          tracer: Callable[[], Any] | None = None) -> CompiledProgram:
    """Trace one signature, then compile it through the one pipeline (the module docstring).

    With `reuse` (another size of the same model, compiled before), the traced
    program is lowered with `reuse`'s backend and knobs and checked, with no
    search (``search.pipeline.compile_program`` with a prior; it searches only when that fails).
    `weights`: the :class:`~egraft.frontend.weights.WeightCopies` the trace
    takes its weight arrays from (the same one for several sizes of a model:
    their programs share one copy of its weights); default: this trace's own.
    `tracer`: makes the graph instead of ``trace(model, args, kwargs, weights)``
    (generation's :class:`~egraft.frontend.causal_lm.StepTracer`: one export
    for many sizes); its seconds count as this program's trace stage.
    """
    check_call(model, args, kwargs)
    name = signature_name(args, kwargs)
    t = _time.perf_counter()
    if config.budget.started is None:  # the budget is the whole compile's: tracing counts (Budget.started)
        config = replace(config, budget=replace(config.budget, started=t))
    status(f"tracing {type(model).__name__} for {name}")
    graph = tracer() if tracer is not None else trace(model, args, kwargs or None, weights)
    traced_s = _time.perf_counter() - t
    states = graph.signature.state
    written = [s.source for s in states if s.source is not None]
    if written:
        raise InputError(f"{type(model).__name__}.forward writes into its input(s) {written} in place; "
                         "egraft.compile compiles models that update their own buffers, not their inputs yet: "
                         "return the new value instead")
    tensor_kwargs = tuple(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    kwarg_order = _kwarg_order(graph.signature.sources()[len(args):], tensor_kwargs)
    values = {k: v for k, v in kwargs.items() if k not in tensor_kwargs}
    fresh = like(args, kwargs, config.seed)
    outs: list = []
    state = tuple((s.name, s) for s in states)
    n_user = len(args) + len(kwarg_order)
    products = float_products_for(model)  # (a CPU without half-precision matrix instructions: half_products)

    def reference(*flat):  # the model in eager PyTorch, on one flat input list (then the state's values)
        saved = [model.get_buffer(n).clone() for n, _ in state]
        with torch.no_grad():
            for (n, _), v in zip(state, flat[n_user:]):
                model.get_buffer(n).copy_(v)
        try:
            with products:
                out = model(*flat[:len(args)], **dict(zip(kwarg_order, flat[len(args):n_user])), **values)
            new = tuple(model.get_buffer(n).clone() for n, _ in state)
        finally:
            with torch.no_grad():
                for (n, _), v in zip(state, saved):
                    model.get_buffer(n).copy_(v)
        outs.append(out)
        return (new, out) if state else out

    status(f"searching and checking ({graph.summary().splitlines()[0]})")
    mark("trace")
    bufs = [model.get_buffer(n).detach().clone() for n, _ in state]
    sets = [flat_inputs(args, kwargs, kwarg_order) + bufs,
            flat_inputs(*fresh, kwarg_order) + list(like(tuple(bufs), None, config.seed + 1)[0])]
    label = f"{type(model).__name__} for {name}"
    prior = None if reuse is None else reuse.compiled
    against = "eager PyTorch" + (" (its half-precision matrix products in float32, rounded once)"
                                 if isinstance(products, FloatProducts) else "")
    done = compile_program(graph, config, reference=reference, check_sets=sets, label=label,
                           against=against, prior=prior)
    if not outs:  # not checked (validate=False): one eager call for the output structure
        with torch.no_grad():
            reference(*sets[0])
    traced = {"nodes": len(graph.nodes), "ops": dict(sorted(graph.op_counts().items())),
              "weights": len(graph.weight_ids),
              "weight_bytes": int(sum(np.asarray(w).nbytes for w in graph.weights.values())),
              "inputs": [{"name": n, "shape": list(s), "dtype": d}
                         for n, (s, d) in zip(graph.input_names(), graph.input_types())]}
    if program_key(graph, args, kwargs, kwarg_order) != key:  # the lookup key is the program's own signature
        raise InputError(f"{type(model).__name__} for {name}: the traced program's inputs "
                         f"{graph.signature.key()} do not match the call's {key}; pass these tensors positionally")
    return CompiledProgram(name, key, done, graph.input_names(), kwarg_order, describe(outs[0]), fresh, traced,
                           {"trace": round(traced_s, 4), **done.stages}, state=state, model=model)


def _kwarg_order(sources: list[str | None], tensor_kwargs: tuple[str, ...]) -> tuple[str, ...]:
    """Which kwarg feeds each program input after the positionals: the user's own names, which the
    tracer records in the graph's signature (``InputSpec.source``)."""
    order = tuple(sources)
    if sorted(map(str, order)) == sorted(tensor_kwargs):
        return order
    raise InputError(f"the traced program's keyword inputs {list(order)} do not match the tensor keyword "
                     f"arguments {list(tensor_kwargs)}; pass these tensors positionally")


def flat_inputs(args: tuple, kwargs: dict, kwarg_order: tuple[str, ...]) -> list:
    return list(args) + [kwargs[k] for k in kwarg_order]
