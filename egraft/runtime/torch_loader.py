"""Run a torch artifact: ``torch.export.load`` its program, bind the weights on the device, call it.

The program (``program.pt2``, written by ``egraft.backends.torch.export``)
takes the weights as its first inputs; they are put on the device once
here.  A program saved on one device kind and loaded on another is moved
with ``torch.export.passes.move_to_device_pass`` (ops such as ``full`` carry
the device they were traced on).  Under the knob ``mode="inductor"`` the
program is compiled by Inductor with the backend's options on the first
call (under a lock, so concurrent first calls compile once).
"""

from __future__ import annotations

import io
import os
import threading

import numpy as np
import torch

from ..errors import ArtifactError
from .manifest import read_verified, single_kernel
from ..ir.tensors import to_numpy, to_torch

# the torch backend's Inductor options (egraft.backends.torch.executable): keep every half-type rounding
INDUCTOR_OPTIONS = {"emulate_precision_casts": True}


def _entry(manifest: dict) -> dict:
    return single_kernel(manifest, "torch.export", "torch")


def files(manifest: dict) -> list[str]:
    """The files this loader reads (and checks) itself."""
    return [_entry(manifest)["file"]]


def torch_device(device: str) -> torch.device:
    kind = device.split(":")[0]
    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise ArtifactError(f"a torch artifact runs on cpu or cuda, not {device!r}")
    index = int(device.split(":")[1]) if ":" in device else 0
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise ArtifactError(f"device {device!r} is not available: torch sees "
                            f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA device(s)")
    return torch.device("cuda", index)


def load(directory: str, manifest: dict, weights: list[np.ndarray], device: str) -> "TorchRunner":
    entry = _entry(manifest)
    path = os.path.join(directory, entry["file"])
    data = read_verified(directory, manifest, entry["file"])
    dev = torch_device(device)
    try:
        ep = torch.export.load(io.BytesIO(bytes(data)))
    except Exception as e:
        raise ArtifactError(f"{path} could not be loaded by torch.export ({type(e).__name__}: {e}); it was written "
                            f"with torch {manifest['backend_versions'].get('torch')}, this is torch "
                            f"{torch.__version__}: rebuild it with `egraft compile`") from None
    if torch.device(entry.get("device", "cpu")).type != dev.type:
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, dev)
    ws = tuple(to_torch(w, dev, copy=False) for w in weights)
    return TorchRunner(ep.module(), ws, dev, entry.get("mode") == "inductor")


class TorchRunner:
    """The loaded module and its device-resident weights."""

    def __init__(self, module, weights: tuple, dev: torch.device, inductor: bool):
        self.module = module
        self.weights = weights
        self.dev = dev
        self.inductor = inductor
        self._fn = None if inductor else module
        self._lock = threading.Lock()

    def _run(self, xs: list) -> list:
        if self.inductor:  # its guards were made for contiguous inputs
            xs = [x.contiguous() for x in xs]
        with torch.no_grad():
            fn = self._fn
            if fn is None:
                return self._first_call(xs)
            return list(fn(*self.weights, *xs))

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

    def run_torch(self, xs: list) -> list:
        out_dev = xs[0].device
        outs = self._run([x if x.device == self.dev else x.to(self.dev) for x in xs])
        return [o if o.device == out_dev else o.to(out_dev) for o in outs]

    def run_numpy(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        outs = self._run([to_torch(a, self.dev, copy=False) for a in xs])
        return [to_numpy(o) for o in outs]


__all__ = ["TorchRunner", "files", "load"]
