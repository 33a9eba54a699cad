"""The torch executable: weights folded and placed on the device once, one FX module call per run.

Building an executable (1) folds weight-only subgraphs on the host
(``backends.fold``), (2) builds the per-call graph as an FX module of ATen
calls whose weights are tensors on the device (:mod:`.fx_module`; on the CPU
they share the bound numpy arrays' memory), (3) under ``mode="inductor"``
compiles its ``forward`` with ``torch.compile(backend="inductor",
fullgraph=True, dynamic=False)`` and runs it once on placeholder inputs, so
the compile happens in ``lower`` and not in the first call.  (The method,
not the module: ``GraphModule.__call__`` formats a kernel's error with a
generator, which Dynamo then tries to compile, turning an integer division
by zero into a misleading ``Unsupported: Attempt to trace generator``.)

Calls go through a ``runtime.torch_runner.TorchRunner``, the runner
``egraft.load`` builds for a saved torch program, with the Inductor options
it holds.  A call with exactly the declared inputs (numpy arrays, or torch
tensors on the executable's device) takes the runner's precomputed fast
path: numpy arrays cross as zero-copy tensors (``torch.from_numpy``;
bfloat16 through an int16 view) and outputs go back with
``Tensor.numpy()``; torch tensors go in as they are and come back as the
module returns them.  Anything else (another device, mixed kinds, a wrong
shape or dtype) takes the checking path, where a mismatch raises
:class:`~egraft.errors.InputError` from ``ir.evaluate.check_inputs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...errors import BackendError
from ...ir import Op
from ...ir.evaluate import check_inputs
from ...ir.graph import Graph
from ...runtime.checked import checked_tensors, torch_signature
from ...runtime.torch_runner import TorchRunner, torch_device
from ..base import Executable, device_kind, guarded_lower
from ..fold import fold_weights
from .emit import TORCH_DTYPES
from .fx_module import FxProgram

KNOBS = {
    # run the FX module op by op, or compile it with Inductor (fused C++ / Triton kernels; seconds to build)
    "mode": ["eager", "inductor"],
    # idioms as library calls (mm/bmm, _softmax, native_layer_norm, ...) or through their primitive form
    "idioms": ["library", "primitive"],
    # SumReduce(Mul(expand a, expand b)), a matrix product in primitives, as one bmm (see .peephole)
    "peephole": [True, False],
    # bias-free attention as one scaled_dot_product_attention call, or composed of bmm + _softmax + bmm
    # (with a bias operand it is always composed: sdpa gives 0 for a fully masked row, the IR NaN)
    "attention": ["sdpa", "composed"],
    # a bfloat16 / float16 weight a product reads widened to float32 (or any weight-only value larger than the
    # weights it is computed from: a dequantised int8 weight): a copy made once (a second, larger copy of the
    # weight), or computed on every call; False is what weight_copies=False asks for
    "fold_widened": [True, False],
}
# the knob values under which no program keeps a copy of a weight (CompileConfig.weight_copies=False)
COPY_FREE = {"fold_widened": False}


def knobs(graph: Graph) -> dict[str, list]:
    return {k: list(v) for k, v in KNOBS.items()}


def check_knobs(chosen: dict) -> None:
    for k, v in chosen.items():
        if k in KNOBS and (v not in KNOBS[k] or type(v) is not type(KNOBS[k][0])):
            raise BackendError(f"the torch backend's knob {k!r} takes one of {KNOBS[k]}, got {v!r}")


@dataclass(eq=False)  # identity equality/hash: executables are cache values, not data
class TorchExecutable(Executable):
    """An FX module of ATen calls; calls go through its :class:`~egraft.runtime.torch_runner.TorchRunner`."""

    program: Any = field(default=None, repr=False)
    folded: dict = field(default_factory=dict, repr=False)  # weight-only values computed at build

    def __post_init__(self):
        check_knobs(self.knobs)
        device_kind(self.device)  # an unknown device string is refused first
        self._dev = torch_device(self.device, BackendError, "the torch backend")
        wide = self.knobs.get("fold_widened", True)
        main, self.folded = fold_weights(self.graph, wide, grow=wide)
        self.program = FxProgram(main, self.knobs, self._dev)
        self.module = self.program.module
        # the method, not the module (see the module docstring); it holds its weights as buffers
        self.runner = TorchRunner(self.module.forward, (), main.input_types(), self._dev,
                                  self.knobs.get("mode") == "inductor")
        self._fast = self.runner.fast
        self._tsig = torch_signature(main.input_types())
        if self.runner.inductor:
            self._warm_up(main)

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """The per-call graph's weights (folded values included) as the module holds them, by name."""
        return dict(self.program.weights)

    def _warm_up(self, graph: Graph):
        """Compile now, by running once on placeholder inputs that no op rejects.

        Inputs that feed a Gather or Scatter index are 0 (always in range; the repeated writes of a
        Scatter here only land in a result that is thrown away), all others 1
        (no integer division by zero), so the compiled kernels run through and
        a failure here is a compile failure.
        """
        index = _feeds_an_index(graph)
        xs = [torch.full(s, 0 if i in index else 1, dtype=TORCH_DTYPES[d], device=self._dev)
              for i, (s, d) in zip(graph.input_ids, graph.input_types())]
        self.runner.run_torch(xs)

    # -- the checking paths (Executable.__call__) ---------------------------------------
    def run_numpy(self, inputs) -> list[np.ndarray]:
        return self.runner.run_numpy(inputs)

    def run_torch(self, inputs: list) -> list:
        """torch in (numpy arrays may be mixed in), torch out on the first tensor's device."""
        return self.runner.run_torch(checked_tensors(inputs, self._tsig, lambda: check_inputs(self.graph, inputs)))

    # -- inspection ---------------------------------------------------------------------
    @property
    def stats(self) -> dict:
        """Counts from the build: primitive matrix products run as bmm."""
        return dict(self.program.stats)

    def sources(self) -> str:
        """The FX module's code (one ATen call per line); under Inductor, what it compiles."""
        return self.program.code


def _feeds_an_index(graph: Graph) -> set[int]:
    """Node ids whose values reach a Gather's or Scatter's index operand."""
    marked: set[int] = set()
    stack = [n.inputs[1] for n in graph.nodes if n.op in (Op.Gather, Op.Scatter)]
    while stack:
        i = stack.pop()
        if i not in marked:
            marked.add(i)
            stack.extend(graph.nodes[i].inputs)
    return marked


def lower(graph: Graph, device: str, chosen: dict) -> TorchExecutable:
    return guarded_lower("torch", graph, lambda: TorchExecutable(graph, "torch", device, dict(chosen)))
