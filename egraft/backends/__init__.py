"""Backends: lower an ``ir.Graph`` to an executable for a device.

``lower(graph, backend, device, knobs=None)``: backend is ``"jax"``,
``"triton"``, ``"torch"`` (ATen ops through torch.fx, eager or Inductor) or
``"auto"`` (Triton on CUDA, JAX/XLA on CPU and TPU).
"""

from __future__ import annotations

import importlib

from ..errors import BackendError
from ..ir.graph import Graph
from .base import BACKENDS, Backend, Executable, default_knobs, device_kind

_MODULES = {"jax": "egraft.backends.jax", "triton": "egraft.backends.triton", "torch": "egraft.backends.torch"}
NAMES = tuple(_MODULES)  # egraft's own backends (importing one registers it in BACKENDS)


def get_backend(name: str) -> Backend:
    """A registered backend by name; egraft's own are imported (and so registered) on first use."""
    if name not in BACKENDS and name in _MODULES:
        importlib.import_module(_MODULES[name])
    if name not in BACKENDS:
        known = sorted(set(_MODULES) | set(BACKENDS))
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(known)} or 'auto'")
    return BACKENDS[name]


def resolve(backend: str, device: str) -> str:
    kind = device_kind(device)
    if backend == "auto":
        return "triton" if kind == "cuda" else "jax"
    return backend


def lower(graph: Graph, backend: str = "auto", device: str = "cpu", knobs: dict | None = None) -> Executable:
    """Compile `graph` for `device` with `backend`; unknown knob names are an error."""
    b = get_backend(resolve(backend, device))
    kind = device_kind(device)
    if kind not in b.devices:
        raise BackendError(f"backend {b.name!r} does not run on {device!r} (it runs on {', '.join(b.devices)})")
    space = b.knobs(graph)
    chosen = default_knobs(space)
    for k, v in (knobs or {}).items():
        if k not in space:
            raise BackendError(f"backend {b.name!r} has no knob {k!r}; its knobs are {', '.join(space) or 'none'}")
        chosen[k] = v
    return b.lower(graph, device, chosen)


__all__ = ["BACKENDS", "NAMES", "Backend", "Executable", "get_backend", "lower", "resolve"]
