"""The backend interface: one :class:`Backend` record per backend, and the :class:`Executable` it builds.

A backend turns an ``ir.Graph`` into an :class:`Executable` for a device.
Its record holds everything the rest of egraft knows of it: the device kinds
it runs on and its priority there (``auto`` picks the highest), its lowering
and rule table (keyed by op name), its tunable knobs (``knobs(graph)``: name
-> list of choices, the first being the default) and which of them are
*late* (a long compile: tried once, on the search's winner), whether its
kernels can recompute a shared value (the search's materialise-or-recompute
bits), whether it writes a torch tensor passed as state in place
(``state_in_place``), its kernel plan (:class:`KernelPlan`, what the cost model prices) and
the modules that save (``writer``) and load (``loader``) its artifacts.
Backends register their record in ``BACKENDS`` when their module is imported;
``egraft.backends`` derives ``auto``, the device checks and the candidate
list from the registered records.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import BackendError, InputError
from ..ir.evaluate import check_inputs
from ..ir.graph import Graph
from ..runtime.device import KINDS, parse as parse_device

DEVICE_KINDS = KINDS


@dataclass(frozen=True)
class KernelPlan:
    """The kernels one call of a lowered graph runs, as the roofline cost model (``egraft.search.cost``) prices them.

    ``graph`` is the per-call graph the kernels compute (after the backend's
    weight folding and whatever rewriting its build does); ``roots`` its
    materialised nodes, one kernel each (every node computed between a root
    and the buffers or roots it reads runs inside that kernel); ``dots`` the
    ``SumReduce`` nodes that run as a matrix product of two operands (node ->
    (a, b); the ``Mul`` between them is never formed); ``tf32``: its float32
    contractions run at the tf32 rate; ``stored``: per-call weights read in a
    narrower dtype than the graph's (node -> that dtype: a folded widening of
    a bfloat16 or int8 weight that the product reads as stored and widens in
    registers).
    """

    graph: Graph
    roots: frozenset
    dots: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    tf32: bool = False
    stored: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    """What egraft knows of one backend (see the module docstring); register it with :func:`register`."""

    name: str
    # device kind ("cpu", "cuda", "tpu") -> priority for backend="auto" (the highest that imports wins);
    # None: it runs there when asked for by name, but auto never picks it
    devices: Mapping[str, int | None]
    lower: Callable[[Graph, str, dict], "Executable"]
    knobs: Callable[[Graph], dict[str, list]]
    rule_table: Callable[[], Mapping[str, Any]]  # op name -> lowering rule
    plan: Callable[[Graph, dict], KernelPlan]  # (graph, every knob chosen) -> the kernels one call runs
    late_knobs: Mapping[str, Any] = field(default_factory=dict)  # knob -> the value tried once, on the winner
    recomputes: bool = False  # its kernels can recompute a value shared by several consumers inside each
    # its executables hand back each torch tensor passed as state, updated in place (the Executable contract's
    # torch case); False: a new value comes back (JAX), which a caller holding the tensor must copy into it
    state_in_place: bool = False
    writer: str | None = None  # module with write(executable, directory, **options) -> artifact.WrittenProgram
    # knob -> the value under which its programs read every weight where the model stores it (no relaid copy);
    # CompileConfig.weight_copies=False (the default) holds these knobs to them (:func:`search_knobs`)
    copy_free: Mapping[str, Any] = field(default_factory=dict)
    # knobs whose copy-free value is offered only then (it is slower elsewhere, e.g. on the prompt's products)
    copy_free_only: tuple[str, ...] = ()
    loader: str | None = None  # module with load(directory, manifest, weights, device) and files(manifest)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or self.name == "auto":
            raise BackendError(f"a backend's name is a non-empty string other than 'auto', not {self.name!r}")
        if not isinstance(self.devices, Mapping) or not self.devices:
            raise BackendError(f"backend {self.name!r}: devices maps device kinds ({', '.join(DEVICE_KINDS)}) to "
                               f"a priority for 'auto' (None: never picked by auto), not {self.devices!r}")
        for kind, prio in self.devices.items():
            if kind not in DEVICE_KINDS or not (prio is None or (isinstance(prio, int) and not isinstance(prio, bool))):
                raise BackendError(f"backend {self.name!r}: devices[{kind!r}] = {prio!r}; keys are "
                                   f"{', '.join(DEVICE_KINDS)}, values an int priority or None")
        if (self.writer is None) != (self.loader is None):
            raise BackendError(f"backend {self.name!r}: give both an artifact writer and a loader module, or neither "
                               f"(writer={self.writer!r}, loader={self.loader!r})")
        object.__setattr__(self, "devices", MappingProxyType(dict(self.devices)))
        object.__setattr__(self, "late_knobs", MappingProxyType(dict(self.late_knobs)))
        object.__setattr__(self, "copy_free", MappingProxyType(dict(self.copy_free)))

    def priority(self, kind: str) -> int | None:
        """Its priority for ``auto`` on device kind `kind` (None: auto never picks it there)."""
        return self.devices.get(kind)


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def device_kind(device: str) -> str:
    return parse_device(device).kind


def guarded_lower(label: str, graph: Graph, build: Callable[[], "Executable"]) -> "Executable":
    """`build()`, with any failure but a user-facing one reported as `label`'s backend bug on this graph."""
    try:
        return build()
    except (BackendError, InputError):
        raise
    except Exception as e:  # a rule or the compiler below failing is a backend bug: say which graph
        raise BackendError(f"the {label} backend failed to lower graph {graph.structural_hash()[:12]}: "
                           f"{type(e).__name__}: {e}") from e


def default_knobs(choices: Mapping[str, Sequence]) -> dict:
    return {k: v[0] for k, v in choices.items()}


def search_knobs(rec: Backend, graph: Graph, weight_copies: bool = False) -> dict[str, list]:
    """`rec`'s knob space for `graph` as a search sees it: with ``weight_copies=False`` each knob of
    ``rec.copy_free`` that offers its copy-free value is held to it (one value); otherwise the copy-free values
    of ``rec.copy_free_only`` are left out."""
    space = {k: list(v) for k, v in rec.knobs(graph).items()}
    for k, v in rec.copy_free.items():
        if k not in space or v not in space[k]:
            continue
        if not weight_copies:
            space[k] = [v]
        elif k in rec.copy_free_only and len(space[k]) > 1:
            space[k] = [x for x in space[k] if x != v]
    return space


def is_torch(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


@dataclass
class Executable:
    """A compiled graph.  Call it on numpy arrays or torch tensors (the model's own inputs).

    Returns a list of outputs of the same kind as the inputs.  Subclasses
    implement ``run_numpy`` (and may override ``run_torch`` to avoid copies).

    State (inputs of role ``state``, ``graph.state_ids``).  A state input is
    passed like an input, after the model's own inputs (``graph.input_ids``
    order), holding the state's current value; the output aliased to it
    (``graph.aliases``: output index -> state name) is its new value.  After
    a call the caller uses the returned value as the state and never the
    value it passed:

    * torch (and Triton): the returned tensor is the state tensor that was
      passed (the same object, on the CPU the same memory for a numpy array),
      updated in place; no state-sized buffer is allocated for the update;
    * JAX: the state argument is donated to the compiled call
      (``jax.jit(..., donate_argnums=<state positions>)``): a jax array passed
      as state is deleted by the call, and the returned jax array (kept a jax
      array, never converted to numpy) is the new state to pass next time;
      a numpy array or torch tensor passed as state is copied in and left
      unchanged.

    Writing in place is each backend's own decision, taken only where the
    graph reads nothing of the old value after the write; otherwise the new
    value is computed functionally (correct, but it allocates).
    """

    graph: Graph
    backend: str
    device: str
    knobs: dict = field(default_factory=dict)
    _fast = None  # the runner's precomputed common case, set by a backend that has one (not a field)

    def __call__(self, *inputs):
        fast = self._fast
        if fast is not None:
            out = fast(inputs)  # None unless the call is exactly the common case
            if out is not None:
                return out
        if inputs and any(is_torch(x) for x in inputs):
            return self.run_torch(list(inputs))
        return self.run_numpy(check_inputs(self.graph, inputs))

    def fast_path(self):
        """A precomputed ``fast(inputs) -> list | None`` for the common call (None: the backend has none).

        It returns None for any call that is not exactly the common case, so
        a caller that tries it first falls back to ``__call__``, which checks
        and explains.
        """
        return self._fast

    def run_numpy(self, inputs: list[np.ndarray]) -> list[np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def run_torch(self, inputs: list) -> list:
        """torch in, torch out through ``run_numpy``: each output a tensor of its own.

        Outputs go to the device of the first tensor input.  An output ``run_numpy``
        may share (a read-only or strided view, an input handed back, one array
        returned twice) is copied, so a torch output never aliases an input, another
        output or the backend's memory.
        """
        import torch

        from ..ir.tensors import as_numpy as to_numpy, to_torch

        dev = next((x.device for x in inputs if is_torch(x)), torch.device("cpu"))
        arrs = [to_numpy(x) for x in inputs]
        outs = self.run_numpy(check_inputs(self.graph, arrs))
        res, taken = [], {id(a) for a in arrs}
        for o in outs:
            owned = o.base is None and o.flags.writeable and o.flags.c_contiguous and id(o) not in taken
            taken.add(id(o))  # the same array twice: the second one is a copy
            res.append(to_torch(o, dev, copy=not owned))
        return res
