"""Backends: lower an ``ir.Graph`` to an executable for a device.

``lower(graph, backend, device, knobs=None)``: backend is a registered
backend's name (egraft's own: ``"jax"``, ``"triton"``, ``"torch"``, ATen ops
through torch.fx, eager or Inductor) or ``"auto"``: the registered backend
with the highest priority on the device's kind among those that import here
(``Backend.devices``; egraft's own give Triton, then JAX, then torch on CUDA;
JAX, then torch on CPU; JAX on TPU).

Every list of backends egraft keeps is derived from the registered
:class:`Backend` records: :func:`candidates` (what ``auto`` and the search
choose among), the cost model's kernel plans, the genome's recompute bits
and late knobs, the artifact writers and the loaders recorded in manifests.
egraft's own backends are the packages of this directory (``NAMES``); each
registers its record when imported, which :func:`get_backend` and
:func:`registered` do on first use.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..errors import BackendError
from ..ir.graph import Graph
from .base import BACKENDS, Backend, Executable, KernelPlan, default_knobs, device_kind, register

NAMES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg))  # egraft's own backends
_UNAVAILABLE: dict[str, str] = {}  # own backend -> why its package does not import here


def _import_own(name: str) -> None:
    if name in BACKENDS or name not in NAMES:
        return
    if name not in _UNAVAILABLE:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ImportError as e:  # its library is not installed here
            _UNAVAILABLE[name] = f"{type(e).__name__}: {e}"
        else:
            rec = getattr(mod, "BACKEND", None)
            if not isinstance(rec, Backend) or rec.name != name:
                raise BackendError(f"{mod.__name__} defines no BACKEND record named {name!r} (it has {rec!r}): "
                                   "a package of egraft/backends/ is a backend and registers its record")
            register(rec)  # (again, where a test cleared the registry after the first import)
            return
    raise BackendError(f"the {name} backend cannot be imported here ({_UNAVAILABLE[name]}): install its library, "
                       "or choose another backend")


def get_backend(name: str) -> Backend:
    """A registered backend by name; egraft's own are imported (and so registered) on first use."""
    _import_own(name)
    if name not in BACKENDS:
        known = sorted(set(NAMES) | set(BACKENDS))
        raise BackendError(f"unknown backend {name!r}; the registered backends are {', '.join(known)} (or 'auto')")
    return BACKENDS[name]


def registered() -> dict[str, Backend]:
    """Every backend that imports here, by name: egraft's own (imported now if they were not) and any registered."""
    for name in NAMES:
        try:
            _import_own(name)
        except BackendError:
            continue
    return dict(BACKENDS)


def candidates(backend: str, device: str, state_in_place: bool = False) -> list[str]:
    """The backends to choose among on `device`, best first: `backend` itself when named (checked to run
    there), or for ``"auto"`` every registered one with a priority on the device's kind, highest first.

    `state_in_place`: for ``"auto"``, only the backends whose executables write a torch tensor passed as
    state in place (``Backend.state_in_place``: torch, Triton), when one runs on the device; a caller that
    holds the state tensors (the torch.compile backend, whose graphs update a KV cache) would otherwise copy
    each new state value into them on every call.  Where none does, every candidate stays (the copy is
    correct, only slower)."""
    kind = device_kind(device)
    if backend != "auto":
        b = get_backend(backend)
        if kind not in b.devices:
            raise BackendError(f"backend {b.name!r} does not run on {device!r} (it runs on {', '.join(b.devices)})")
        return [b.name]
    ranked = [b for b in registered().values() if b.priority(kind) is not None]
    if not ranked:
        why = "".join(f"; {n}: {r}" for n, r in sorted(_UNAVAILABLE.items()))
        raise BackendError(f"no registered backend runs on {device!r} here{why}: install jax (or torch), "
                           "or register a backend for it")
    if state_in_place and any(b.state_in_place for b in ranked):
        ranked = [b for b in ranked if b.state_in_place]
    return [b.name for b in sorted(ranked, key=lambda b: (-b.priority(kind), b.name))]


def resolve(backend: str, device: str) -> str:
    """The backend `backend` means on `device`: itself (checked), or the first of ``candidates("auto", device)``."""
    return candidates(backend, device)[0]


def lower(graph: Graph, backend: str = "auto", device: str = "cpu", knobs: dict | None = None) -> Executable:
    """Compile `graph` for `device` with `backend`; unknown knob names are an error."""
    b = get_backend(resolve(backend, device))
    space = b.knobs(graph)
    chosen = default_knobs(space)
    for k, v in (knobs or {}).items():
        if k not in space:
            raise BackendError(f"backend {b.name!r} has no knob {k!r}; its knobs are {', '.join(space) or 'none'}")
        chosen[k] = v
    return b.lower(graph, device, chosen)


__all__ = ["BACKENDS", "NAMES", "Backend", "Executable", "KernelPlan", "candidates", "get_backend", "lower",
           "registered", "resolve"]
