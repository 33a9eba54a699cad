"""Run a list of generated kernels: allocate outputs, launch in order.

Weights (including the values folded at build) are moved to the device once,
when the executable is built.  Per call: the model's inputs go to the device,
each kernel's output is allocated with ``torch.empty`` and the kernels run in
topological order.  On ``cuda`` they are compiled Triton kernels; on ``cpu``
they run in Triton's interpreter on CPU tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import BackendError, InputError
from ...ir import Op, dtypes
from ...ir.tensors import to_numpy, to_torch, torch_dtype
from ..base import Executable


@dataclass
class TritonExecutable(Executable):
    """A graph compiled to Triton kernels (see ``kernels`` for their sources)."""

    kernels: list = field(default_factory=list)  # KernelSpec, in launch order
    main: object = None  # the per-call graph (weight-only work folded out)
    folded: dict = field(default_factory=dict)  # name -> folded weight value (numpy)
    launches: int = 0  # kernels launched so far (tests check folding with it)
    _dev_weights: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        import torch

        self._torch_device = torch.device(self.device)
        g = self.main
        for i in g.weight_ids:
            name = g.nodes[i].attrs["name"]
            if name not in g.weights:
                raise BackendError(f"weight {name!r} has no bound value; bind it with graph.with_weights({{...}})")
            self._dev_weights[i] = to_torch(np.asarray(g.weights[name]), self.device, copy=False)
        for i, n in enumerate(g.nodes):
            if n.op == Op.Constant and n.shape != ():
                self._dev_weights[i] = to_torch(np.asarray(n.attrs["value"].array).astype(dtypes.to_numpy(n.dtype)), self.device, copy=False)

    def sources(self) -> str:
        return "\n\n".join(k.source for k in self.kernels)

    def run_numpy(self, inputs):
        outs = self.run_torch([to_torch(np.asarray(x), self.device, copy=False) for x in inputs], _checked=True)
        return [to_numpy(o) for o in outs]

    def run_torch(self, inputs, _checked=False):
        import torch

        g = self.main
        if len(inputs) != len(g.input_ids):
            raise InputError(f"the graph takes {len(g.input_ids)} input(s) ({', '.join(g.input_names())}), got {len(inputs)}")
        bufs = dict(self._dev_weights)
        for i, x in zip(g.input_ids, inputs):
            n = g.nodes[i]
            if not isinstance(x, torch.Tensor):
                x = to_torch(np.asarray(x), self.device, copy=False)
            if tuple(x.shape) != n.shape or str(x.dtype).replace("torch.", "") != n.dtype:
                raise InputError(
                    f"input {n.attrs['name']!r} is {tuple(x.shape)}:{str(x.dtype).replace('torch.', '')}, "
                    f"the graph expects {n.shape}:{n.dtype}"
                )
            bufs[i] = x.to(self._torch_device).contiguous()
        # the interpreter computes masked-off lanes too (numpy warns about 0/0 there); their results are discarded
        with np.errstate(all="ignore"):
            self._launch_all(bufs)
        res = []
        for o in g.outputs:
            t = bufs[o]
            is_leaf = g.nodes[o].op in (Op.Input, Op.Constant)
            res.append(t.clone() if is_leaf else t)
        if inputs and not isinstance(inputs[0], torch.Tensor):
            return res
        dev = inputs[0].device if inputs else self._torch_device
        return [r.to(dev) for r in res]

    def _launch_all(self, bufs):
        import torch

        g = self.main
        for k in self.kernels:
            rn = g.nodes[k.root]
            out = torch.empty(rn.shape, dtype=torch_dtype(rn.dtype), device=self._torch_device)
            bufs[k.root] = out
            if out.numel() == 0:
                continue
            args = [bufs[i] for i in k.inputs] + [out]
            k.fn[(k.grid,)](*args, **k.constexprs, num_warps=k.num_warps, num_stages=k.num_stages)
            self.launches += 1

