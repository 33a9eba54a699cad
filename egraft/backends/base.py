"""The backend interface.

A backend turns an ``ir.Graph`` into an :class:`Executable` for a device.
It states its tunable knobs (``knobs(graph)``: name -> list of choices, the
first choice being the default) so the search can tune them, and keeps its
lowering rules in tables keyed by op name (see ``rule_table``).
Backends register themselves in ``BACKENDS`` when their module is imported.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import BackendError, InputError
from ..ir.evaluate import check_inputs
from ..ir.graph import Graph


@dataclass(frozen=True)
class Backend:
    name: str
    devices: tuple[str, ...]  # device kinds it runs on: "cpu", "cuda", "tpu"
    lower: Callable[[Graph, str, dict], "Executable"]
    knobs: Callable[[Graph], dict[str, list]]
    rule_table: Callable[[], Mapping[str, Any]]  # op name -> lowering rule


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def device_kind(device: str) -> str:
    kind = str(device).split(":")[0]
    if kind not in ("cpu", "cuda", "tpu"):
        raise BackendError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'tpu'")
    return kind


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


def is_torch(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


@dataclass
class Executable:
    """A compiled graph.  Call it on numpy arrays or torch tensors (the model's own inputs).

    Returns a list of outputs of the same kind as the inputs.  Subclasses
    implement ``run_numpy`` (and may override ``run_torch`` to avoid copies).
    """

    graph: Graph
    backend: str
    device: str
    knobs: dict = field(default_factory=dict)

    def __call__(self, *inputs):
        if inputs and any(is_torch(x) for x in inputs):
            return self.run_torch(list(inputs))
        return self.run_numpy(check_inputs(self.graph, inputs))

    def fast_path(self):
        """A precomputed ``fast(inputs) -> list | None`` for the common call (None: the backend has none).

        It returns None for any call that is not exactly the common case, so
        a caller that tries it first falls back to ``__call__``, which checks
        and explains.
        """
        return None

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
