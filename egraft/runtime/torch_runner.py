"""The torch call path, one for ``egraft.compile`` and ``egraft.load``: an ATen program and how to call it.

A :class:`TorchRunner` holds the program (the torch backend's FX module
``forward``, or the module ``torch.export.load`` returns for a saved one),
the weights it takes as its first inputs (none for the backend's own
module, which holds them as buffers), the device, and each input's shape
and dtype.  The torch backend's executable builds one after building its
module (``egraft.backends.torch.executable``), the runtime's loader builds
one from ``program.pt2`` (``egraft.runtime.torch_loader``), so a compiled
and a loaded program run the same code:

* ``fast(inputs) -> list | None``: a call with exactly the declared inputs
  (numpy arrays, or torch tensors on the runner's device) compared in one
  signature test; numpy arrays cross as zero-copy tensors and outputs go
  back with ``Tensor.numpy()``; tensors go in as they are and come back as
  the module returns them.  None for anything else: the caller's checking
  path explains it.
* ``run_numpy(arrays)`` / ``run_torch(tensors)``: the checking path's last
  step, on inputs whose count, shapes and dtypes the caller has checked;
  tensors on another device are moved, outputs go to the first input's
  device.

Under the knob ``mode="inductor"`` the program is compiled by Inductor with
:data:`INDUCTOR_OPTIONS` (the one place they are written) on the first call,
under a lock, so concurrent first calls compile once; the backend's
executable makes that first call at build, on placeholder inputs.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from ..ir import dtypes
from ..ir.tensors import to_numpy, to_torch, torch_dtype
from .device import parse

# Inductor keeps every rounding of a half type: by default it drops the round trips between fused
# float16 ops, which the reference interpreter (and eager) performs
INDUCTOR_OPTIONS = {"emulate_precision_casts": True}


def torch_device(device: str, error: type, who: str) -> torch.device:
    """The torch device for `device` (``"cpu"``, ``"cuda[:N]"``), or `error` saying what there is; `who` runs on it."""
    d = parse(device, error)
    kind = d.kind
    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise error(f"{who} runs on cpu or cuda, not {device!r}")
    index = d.index or 0
    if not torch.cuda.is_available():
        raise error(f"device {device!r} is not available: torch sees no CUDA device here; use device='cpu'")
    if index >= torch.cuda.device_count():
        raise error(f"device {device!r} is not available: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


class TorchRunner:
    """One ATen program, its device-resident weights and its call path (see the module docstring)."""

    def __init__(self, module, weights: tuple, types, dev: torch.device, inductor: bool):
        """`module(*weights, *inputs)` runs the program; `types`: (shape, IR dtype name) per input."""
        self.module = module
        self.weights = tuple(weights)
        self.dev = dev
        self.inductor = inductor
        self._fn = None if inductor else module
        self._lock = threading.Lock()
        self._n_in = len(types)
        self._np_sig = tuple((np.ndarray, tuple(s), dtypes.to_numpy(d)) for s, d in types)
        self._torch_sig = tuple((torch.Tensor, torch.Size(s), torch_dtype(d)) for s, d in types)

    @property
    def compiled(self) -> bool:
        """Whether the program runs compiled by Inductor (made by the first call under that mode)."""
        return self.inductor and self._fn is not None

    def _run(self, xs: list) -> list:
        """The program on tensors already on the device."""
        if self.inductor:  # its guards were made for contiguous inputs without grad
            xs = [x.contiguous() for x in xs]
            with torch.no_grad():
                fn = self._fn
                if fn is None:
                    return self._first_call(xs)
                return list(fn(*self.weights, *xs))
        return list(self._fn(*self.weights, *xs))

    def _first_call(self, xs: list) -> list:
        """Compile with Inductor on the first call, once, however many threads arrive together."""
        with self._lock:
            if self._fn is not None:
                return list(self._fn(*self.weights, *xs))
            fn = torch.compile(self.module, backend="inductor", fullgraph=True, dynamic=False,
                               options=INDUCTOR_OPTIONS)
            outs = list(fn(*self.weights, *xs))
            self._fn = fn
            return outs

    # -- the fast path ---------------------------------------------------------------------------
    def fast(self, inputs) -> list | None:
        """Exactly the declared inputs (numpy, or tensors on the device) in one compare; None otherwise."""
        if len(inputs) != self._n_in:
            return None
        try:
            sig = tuple([(x.__class__, x.shape, x.dtype) for x in inputs])
        except AttributeError:
            return None
        if sig == self._np_sig:
            return self.run_numpy(inputs)
        if sig == self._torch_sig:
            dev = self.dev
            xs = []
            for x in inputs:
                if x.device != dev:
                    return None
                xs.append(x.detach() if x.requires_grad else x)
            return self._run(xs)
        return None

    # -- the checking path, after the caller's checks --------------------------------------------
    def run_numpy(self, xs) -> list[np.ndarray]:
        """numpy in (shared with the program on the CPU where memory allows), numpy out."""
        return [to_numpy(o) for o in self._run([to_torch(a, self.dev, copy=False) for a in xs])]

    def run_torch(self, xs: list) -> list:
        """torch in, torch out on the first input's device."""
        out_dev = xs[0].device if xs else self.dev
        outs = self._run([x if x.device == self.dev else x.to(self.dev) for x in xs])
        return [o if o.device == out_dev else o.to(out_dev) for o in outs]


__all__ = ["INDUCTOR_OPTIONS", "TorchRunner", "torch_device"]
