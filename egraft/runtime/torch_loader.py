"""Load a torch artifact: ``torch.export.load`` its program, bind the weights on the device, hand it to a runner.

The program (``program.pt2``, written by ``egraft.backends.torch.export``)
takes the weights as its first inputs; they are put on the device once
here.  A program saved on one device kind and loaded on another is moved
with ``torch.export.passes.move_to_device_pass`` (ops such as ``full`` carry
the device they were traced on).  Calls go through
:class:`~egraft.runtime.torch_runner.TorchRunner`, the runner the torch
backend's executable uses: under the knob ``mode="inductor"`` it compiles
the program with the backend's Inductor options on the first call (under a
lock, so concurrent first calls compile once).
"""

from __future__ import annotations

import io
import os

import numpy as np
import torch

from ..errors import ArtifactError
from .manifest import read_verified, single_kernel
from ..ir.tensors import to_torch, view_torch
from .torch_runner import TorchRunner, torch_device


def _entry(manifest: dict) -> dict:
    return single_kernel(manifest, "torch.export", "torch")


def files(manifest: dict) -> list[str]:
    """The files this loader reads (and checks) itself."""
    return [_entry(manifest)["file"]]


def load(directory: str, manifest: dict, weights: list[np.ndarray], device: str) -> "TorchRunner":
    entry = _entry(manifest)
    path = os.path.join(directory, entry["file"])
    data = read_verified(directory, manifest, entry["file"])
    dev = torch_device(device, ArtifactError, "a torch artifact")
    try:
        ep = torch.export.load(io.BytesIO(bytes(data)))
    except Exception as e:
        raise ArtifactError(f"{path} could not be loaded by torch.export ({type(e).__name__}: {e}); it was written "
                            f"with torch {manifest['backend_versions'].get('torch')}, this is torch "
                            f"{torch.__version__}: rebuild it with `egraft compile`") from None
    if torch.device(entry.get("device", "cpu")).type != dev.type:
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, dev)
    ws = tuple(_weight(w, dev) for w in weights)
    types = [(tuple(i["shape"]), i["dtype"]) for i in manifest["inputs"]]
    return TorchRunner(plain_forward(ep), ws, types, dev, entry.get("mode") == "inductor")


def plain_forward(ep):
    """The exported program as a plain FX function ``(*weights, *inputs) -> tuple``, as the executable runs its own.

    ``ep.module()`` wraps the graph in torch.export's pre-hooks (input
    constraint checks, ~50 us a call), pytree flattening of the inputs and
    outputs and a shape-guard call (~10 us more on a small program).  The
    artifact has checked the inputs against the manifest before a call, and
    the program was exported from flat tensors, so the graph runs as it is.
    """
    gm = ep.module()
    gm.graph.set_codegen(torch.fx.graph.CodeGen())  # flat arguments in, the output tuple out
    for n in list(gm.graph.nodes):
        if n.op == "call_module" and n.target == "_guards_fn" and not n.users:
            gm.graph.erase_node(n)
    gm.recompile()
    return gm.forward


__all__ = ["files", "load", "plain_forward"]


def _weight(w, dev):
    """A weight as a tensor on `dev`; on the CPU the array's own memory, even read-only (a memory-mapped weights
    file shared by a generation's programs): the program never writes a weight, and a copy per program would
    hold the weights once per program."""
    if dev.type != "cpu":
        return to_torch(w, dev, copy=False)
    import warnings

    with warnings.catch_warnings():  # torch warns that a read-only array's tensor is writable
        warnings.simplefilter("ignore", UserWarning)
        return view_torch(np.ascontiguousarray(w))
