"""One input signature of a model, compiled: trace, search, lower, then check against eager PyTorch.

A :class:`Program` is everything ``egraft.compile`` knows about one input
signature (the shapes, dtypes and devices of the tensor inputs, and the
values of the non-tensor keyword arguments): the lowered executable, the
search result, the model's output structure, how the compiled program
compared with eager PyTorch, and the seconds each stage took.

Checking against eager PyTorch.  The search validates every candidate
against the *traced* program (the float64 reference interpreter).  That
proves the rewrites and the backend right, but not the tracing itself, so
before a program is handed out it is run once more, here, against the
user's own model in eager PyTorch, on two input sets: the example inputs
(real data, e.g. valid token ids) and one fresh random set drawn like them
(floats standard normal, never all zero; integers uniform within the
example's own range, so indices stay valid; bools random).  Each float
output may differ from eager by twice the graph's error budget
(:func:`egraft.measure.tolerance_for`: both eager and the program carry up
to one budget of rounding error relative to the exact result); integer and
bool outputs must match exactly.  A disagreement raises
:class:`egraft.errors.ValidationError`; a wrong program is never returned.
"""

from __future__ import annotations

import inspect
import math
import time as _time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..backends import lower
from ..errors import InputError, ValidationError
from ..frontend import trace
from ..ir import dtypes
from ..ir.tensors import to_torch
from ..measure import random_array, rel_err, tolerance_for
from ..runtime.outputs import count, describe, rebuild
from ..search import search

_TORCH_DTYPES = {getattr(torch, d): d for d in dtypes.DTYPES}


@dataclass(frozen=True)
class Options:
    """What ``egraft.compile`` was asked for; the same for every signature."""

    device: str
    backend: str
    budget: Any
    fitness: str | None
    seed: int
    cache: Any
    progress: Any


@dataclass
class Program:
    """One compiled signature: the executable and the evidence for it (see the module docstring)."""

    name: str  # "4x32:float32,2x8:int64" (+ "@cuda:0" off the CPU): the signature as a user reads it
    key: tuple  # what a call is looked up by (shapes, dtypes, devices; kwarg names and values)
    executable: Any
    result: Any  # egraft.search.SearchResult
    input_names: list[str]
    kwarg_order: tuple[str, ...]  # tensor kwargs, in the order the program takes them (after the positionals)
    output_tree: dict
    example: tuple[tuple, dict]  # the fresh random input set (args, kwargs): the comparison times calls on it
    traced: dict  # nodes, ops, weights, weight bytes of the traced program
    stages: dict[str, float]  # seconds: trace, saturate, search, lower, validate
    validation: dict = field(default_factory=dict)
    comparison: dict | None = None  # filled by the first report (egraft.api.measure)
    call: Callable = field(default=None, repr=False)  # flat tensors in -> the model's output structure

    def __post_init__(self):
        ex, tree = self.executable, self.output_tree
        self.call = (lambda *xs: ex(*xs)[0]) if tree.get("type") == "tensor" else (lambda *xs: rebuild(tree, ex(*xs)))


# --- signatures -----------------------------------------------------------------------------------

def call_key(args: tuple, kwargs: dict) -> tuple:
    """The lookup key of a call: one (shape, dtype, device) per positional tensor, then the kwargs.

    The positional part is what the call path computes for every call (one
    tuple, one dict lookup); kwargs are rarer and sorted by name, a tensor by
    its type and a python value by itself (or its repr when unhashable).
    """
    key = tuple([(a.shape, a.dtype, a.device) for a in args])
    if not kwargs:
        return key
    extra = []
    for k in sorted(kwargs):
        v = kwargs[k]
        if isinstance(v, torch.Tensor):
            extra.append((k, v.shape, v.dtype, v.device))
        else:
            try:
                hash(v)
                extra.append((k, "value", v))
            except TypeError:
                extra.append((k, "repr", repr(v)))
    return key + (tuple(extra),)


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

def build(model: torch.nn.Module, args: tuple, kwargs: dict, key: tuple, opts: Options,
          status: Callable[[str], None]) -> Program:
    """Trace, search, lower and validate one signature (the module docstring says how it is checked)."""
    check_call(model, args, kwargs)
    name = signature_name(args, kwargs)
    stages: dict[str, float] = {}
    t = _time.perf_counter()
    status(f"tracing {type(model).__name__} for {name}")
    graph = trace(model, args, kwargs or None)
    stages["trace"] = _time.perf_counter() - t
    tensor_kwargs = tuple(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    kwarg_order = _kwarg_order(graph.input_names()[len(args):], tensor_kwargs)
    status(f"searching ({graph.summary().splitlines()[0]})")
    t = _time.perf_counter()
    if opts.backend in ("auto", "jax") and opts.cache is not False:
        _enable_xla_cache(opts.cache)  # before any XLA compile: JAX reads the setting once, at its first compile
    res = search(graph, opts.backend, opts.device, opts.budget, opts.seed, fitness=opts.fitness, cache=opts.cache,
                 progress=opts.progress)
    total = _time.perf_counter() - t
    stages["saturate"] = float(res.stages.get("saturate", 0.0))
    stages["search"] = max(0.0, total - stages["saturate"])
    status(f"lowering the chosen program ({res.backend}{' from the cache' if res.from_cache else ''})")
    t = _time.perf_counter()
    ex = lower(res.graph, res.backend, opts.device, res.knobs)
    stages["lower"] = _time.perf_counter() - t
    status("checking the compiled program against eager PyTorch")
    t = _time.perf_counter()
    fresh = like(args, kwargs, opts.seed)
    sets = [(args, kwargs), fresh]
    validation, tree = validate(model, ex, graph, sets, kwarg_order, name)
    stages["validate"] = _time.perf_counter() - t
    traced = {"nodes": len(graph.nodes), "ops": dict(sorted(graph.op_counts().items())),
              "weights": len(graph.weight_ids),
              "weight_bytes": int(sum(np.asarray(w).nbytes for w in graph.weights.values())),
              "inputs": [{"name": n, "shape": list(s), "dtype": d}
                         for n, (s, d) in zip(graph.input_names(), graph.input_types())]}
    return Program(name, key, ex, res, graph.input_names(), kwarg_order, tree,
                   fresh, traced, {k: round(v, 4) for k, v in stages.items()},
                   validation)


def _kwarg_order(names: list[str], tensor_kwargs: tuple[str, ...]) -> tuple[str, ...]:
    """Which kwarg feeds each program input after the positionals.

    The tracer names inputs after the forward's parameters, with a trailing
    ``_`` added where a name was taken (by a weight, say).
    """
    order = tuple(n if n in tensor_kwargs else n.rstrip("_") for n in names)
    if sorted(order) == sorted(tensor_kwargs):
        return order
    raise InputError(f"the traced program's keyword inputs {names} do not match the tensor keyword arguments "
                     f"{list(tensor_kwargs)}; pass these tensors positionally")


def flat_inputs(args: tuple, kwargs: dict, kwarg_order: tuple[str, ...]) -> list:
    return list(args) + [kwargs[k] for k in kwarg_order]


def _enable_xla_cache(cache) -> None:
    """XLA's persistent compilation cache under the search cache, so lowering a cached winner is a read."""
    from ..search.evaluators import enable_xla_cache as enable
    from ..search.evaluators import xla_cache_dir

    root = getattr(cache, "root", None)
    enable(str(root / "xla") if root is not None else xla_cache_dir())


def like(args: tuple, kwargs: dict, seed: int) -> tuple[tuple, dict]:
    """A fresh random input set shaped like the example (module docstring: how each dtype is drawn)."""
    rng = np.random.default_rng([int(seed), 0x65677261])

    def draw(t):
        if not isinstance(t, torch.Tensor):
            return t
        dt = _TORCH_DTYPES[t.dtype]
        low = high = None
        if dtypes.is_int(dt) and t.numel():
            low, high = int(t.min()), int(t.max()) + 1
        a = random_array(tuple(t.shape), dt, rng, low, high)
        return to_torch(a, t.device)

    return tuple(draw(a) for a in args), {k: draw(v) for k, v in kwargs.items()}


def _leaves(out) -> list:
    return [x for x in torch.utils._pytree.tree_leaves(out) if x is not None]


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.double() if t.is_floating_point() else t).numpy()


def validate(model, ex, graph, sets, kwarg_order, name) -> tuple[dict, dict]:
    """Compare `ex` with eager `model` on each input set; the validation record and the output tree."""
    tols = [2 * tolerance_for(graph, k, d) if dtypes.is_float(d) else 0.0
            for k, (_, d) in enumerate(graph.output_types())]
    worst = [0.0] * len(tols)
    tree = None
    for n, (args, kwargs) in enumerate(sets):
        with torch.no_grad():
            want = model(*args, **kwargs)
        tree = tree or describe(want)
        wants = _leaves(want)
        got = ex(*flat_inputs(args, kwargs, kwarg_order))
        if len(got) != len(wants) or count(tree) != len(got):
            raise ValidationError(f"{type(model).__name__} for {name}: the compiled program returns {len(got)} "
                                  f"outputs, eager PyTorch {len(wants)}; this is a bug in egraft's tracing")
        for k, (g, w) in enumerate(zip(got, wants)):
            what = f"{type(model).__name__} for {name}, output {k}"
            if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
                raise ValidationError(f"{what}: the compiled program gives {tuple(g.shape)} {g.dtype}, eager "
                                      f"PyTorch {tuple(w.shape)} {w.dtype}")
            e = rel_err(_numpy(g), _numpy(w)) if w.is_floating_point() else (
                0.0 if torch.equal(g.cpu(), w.cpu()) else math.inf)
            worst[k] = max(worst[k], e)
            if not e <= tols[k]:
                which = "the example inputs" if n == 0 else "fresh random inputs"
                raise ValidationError(
                    f"{what}: on {which} the compiled program ({ex.backend}) differs from eager PyTorch by "
                    f"{e:.3g} (relative), more than the {tols[k]:.3g} allowed; it was not returned. Try "
                    "backend='torch' or another backend, and please report this model to egraft")
    record = {"sets": len(sets), "errors": worst, "tolerances": tols,
              "max_error": max(worst, default=0.0)}
    return record, tree
