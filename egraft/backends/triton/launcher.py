"""The Triton executable: generated kernels launched in order through the runtime's ``TritonRunner``.

Weights (including the values folded at build) and tensor constants are
moved to the device once, when the executable is built.  Per call
(``runtime.triton_runner``, the runner ``egraft.load`` builds for a saved
Triton program): the model's inputs go to the device, each kernel's output
is allocated with ``torch.empty`` and the kernels run in topological order.
On ``cuda`` they are compiled Triton kernels; on ``cpu`` they run in
Triton's interpreter on CPU tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import BackendError
from ...ir import Op, dtypes
from ...ir.evaluate import check_inputs
from ...ir.tensors import to_torch, torch_dtype
from ...runtime.checked import checked_tensors, torch_signature
from ...runtime.triton_runner import TritonRunner
from ..base import Executable


@dataclass
class TritonExecutable(Executable):
    """A graph compiled to Triton kernels (see ``kernels`` for their sources)."""

    kernels: list = field(default_factory=list)  # KernelSpec, in launch order
    main: object = None  # the per-call graph (weight-only work folded out)
    folded: dict = field(default_factory=dict)  # name -> folded weight value (numpy)

    def __post_init__(self):
        import torch

        dev = torch.device(self.device)
        g = self.main
        fixed = {}
        for i in g.weight_ids:
            name = g.nodes[i].attrs["name"]
            if name not in g.weights:
                raise BackendError(f"weight {name!r} has no bound value; bind it with graph.with_weights({{...}})")
            fixed[i] = to_torch(np.asarray(g.weights[name]), dev)
        for i, n in enumerate(g.nodes):
            if n.op == Op.Constant and n.shape != ():
                fixed[i] = to_torch(np.asarray(n.attrs["value"].array).astype(dtypes.to_numpy(n.dtype)), dev)
        launches = []
        for k in self.kernels:
            rn = g.nodes[k.root]
            launches.append((k.fn, list(k.inputs), k.root, tuple(rn.shape), torch_dtype(rn.dtype), (k.grid,),
                             dict(k.constexprs), k.num_warps, k.num_stages))
        leaves = [o for o in g.outputs if g.nodes[o].op in (Op.Input, Op.Constant)]
        names = g.input_names()
        states = {k: names.index(name) for k, name in g.aliases.items()}
        self.runner = TritonRunner(launches, fixed, list(g.input_ids), list(g.outputs), leaves, dev, states)
        self._tsig = torch_signature(g.input_types())

    @property
    def launches(self) -> int:
        """Kernels launched so far (tests check folding with it)."""
        return self.runner.launched

    def sources(self) -> str:
        return "\n\n".join(k.source for k in self.kernels)

    def run_numpy(self, inputs):
        return self.runner.run_numpy(inputs)

    def run_torch(self, inputs):
        return self.runner.run_torch(checked_tensors(inputs, self._tsig, lambda: check_inputs(self.graph, inputs)))
