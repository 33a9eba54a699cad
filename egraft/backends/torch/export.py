"""The torch artifact writer: the executable's FX module through ``torch.export``, as ``program.pt2``.

The executable's module holds its weights as buffers read by ``get_attr``.
For the artifact they become the module's first inputs (placeholders, in the
manifest's weight order), so ``program.pt2`` holds the program and its
literal tensor constants only, and the weights live in
``weights.safetensors`` like every backend's.  ``torch.export.export``
re-traces that module (every node is already an ATen call, so the trace is
the same program; composite ops such as ``reshape`` may be written as the
view or copy they dispatch to) and ``torch.export.save`` writes it.  The
runtime loads it with ``torch.export.load`` (``egraft.runtime.torch_loader``)
and runs it through the executable's own runner
(``egraft.runtime.torch_runner``), which under the knob ``mode="inductor"``
compiles it again with the same Inductor options.
"""

from __future__ import annotations

import os

import torch

from ...errors import BackendError
from ...runtime.manifest import library_version
from .emit import TORCH_DTYPES, to_numpy

PROGRAM_FILE = "program.pt2"


def weights_as_inputs(module: torch.fx.GraphModule, weights: dict) -> torch.fx.GraphModule:
    """A copy of `module` taking ``weights``' tensors (name -> the module's buffer) as its first inputs."""
    by_id = {id(t): k for k, t in enumerate(weights.values())}
    g = torch.fx.Graph()
    env: dict = {}
    params = [g.placeholder(f"w{k}") for k in range(len(weights))]
    for n in module.graph.nodes:
        if n.op == "placeholder":
            env[n] = g.placeholder(n.name)
    root = torch.nn.Module()
    for n in module.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "get_attr":
            held = getattr(module, n.target)
            if id(held) in by_id:
                env[n] = params[by_id[id(held)]]
                continue
            root.register_buffer(n.target, held)  # a tensor constant stays in the program
        env[n] = g.node_copy(n, lambda a: env[a])
    g.lint()
    return torch.fx.GraphModule(root, g, class_name="EgraftTorchArtifact")


def write(ex, directory: str):
    """Write ``program.pt2`` for `ex` (a TorchExecutable) into `directory`; see the module docstring."""
    from ..artifact import WrittenProgram

    prog = ex.program
    weights = dict(prog.weights)
    gm = weights_as_inputs(prog.module, weights)
    xs = [torch.zeros(s, dtype=TORCH_DTYPES[d], device=ex._dev) for s, d in prog.graph.input_types()]
    try:
        # traced with contiguous weights: what the runtime passes (safetensors holds them contiguous)
        ep = torch.export.export(gm, (*[t.contiguous() for t in weights.values()], *xs), strict=False)
        torch.export.save(ep, os.path.join(directory, PROGRAM_FILE))
    except Exception as e:
        raise BackendError(f"torch.export could not serialise the torch backend's program "
                           f"({type(e).__name__}: {e})") from e
    kernel = {
        "kind": "torch.export",
        "file": PROGRAM_FILE,
        "calling_convention": "module(*weights, *inputs) -> tuple of outputs (weights in the manifest's order)",
        "mode": ex.knobs.get("mode", "eager"),
        "device": str(ex._dev),
        "aten_calls": sum(1 for n in ep.graph.nodes if n.op == "call_function"),
    }
    fields = {
        "target": {"device": ex.device, "backend": "torch"},
        "backend_versions": {"torch": library_version("torch") or torch.__version__.split("+")[0]},
        "kernels": [kernel],
    }
    return WrittenProgram({name: to_numpy(t.detach().cpu()) for name, t in weights.items()}, fields)


__all__ = ["PROGRAM_FILE", "weights_as_inputs", "write"]
