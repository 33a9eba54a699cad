"""The Triton call path, one for ``egraft.compile`` and ``egraft.load``: kernels launched in order over buffers.

A :class:`TritonRunner` holds the loaded ``@triton.jit`` kernels with their
launch plan (grid, ``constexprs``, warps, stages, the buffers each reads and
the one it writes, with that buffer's shape and dtype), the fixed buffers
(weights, folded values and tensor constants, on the device once), which
buffers the model's inputs fill and which are the outputs.  The Triton
backend's executable builds one from its generated kernels
(``egraft.backends.triton.launcher``), the runtime's loader from an
artifact's kernel sources and manifest (``egraft.runtime.triton_loader``), so
a compiled and a loaded program launch the same way.

A call (``run_torch`` on checked tensors, ``run_numpy`` on checked arrays)
moves the inputs to the device, allocates each kernel's output with
``torch.empty`` and launches the kernels in order; an output that is an
input or a constant is cloned, so no output aliases the caller's memory or
the runner's, except a state's new value: it is written into the state
tensor the caller passed, after the last kernel, and that tensor is returned.  On ``cuda`` the kernels are compiled by Triton's JIT on first
launch; on ``cpu`` they run in Triton's interpreter, which runs one program
at a time on shared numpy state, so calls are serialised there.
"""

from __future__ import annotations

import threading

import numpy as np

from ..ir.tensors import to_numpy, to_torch, torch_module


class TritonRunner:
    """Kernels, their launch plan and the device-resident buffers (see the module docstring)."""

    def __init__(self, launches: list, fixed: dict, inputs: list, outputs: list, copied, dev, states=None):
        """`launches`: per kernel (fn, reads, writes, shape, torch dtype, grid, constexprs, warps, stages);
        `fixed`: buffer id -> tensor on `dev`; `inputs`: the buffer id each model input fills, in order;
        `outputs`: the output buffer ids; `copied`: the output ids handed out as clones; `states`: output
        index -> the input position of the state it is the new value of (``backends.base.Executable``:
        the new value is written into the state tensor passed, which is returned)."""
        self.states = dict(states or {})
        self.launches = list(launches)
        self.fixed = dict(fixed)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.copied = set(copied)
        self.dev = dev
        self.launched = 0  # kernels launched so far (tests check folding with it)
        self._lock = threading.Lock() if dev.type == "cpu" else None

    def _launch_all(self, xs: list) -> list:
        torch = torch_module()
        passed = xs
        bufs = dict(self.fixed)
        for nid, x in zip(self.inputs, xs):
            bufs[nid] = x.contiguous()
        with np.errstate(all="ignore"):  # the interpreter computes masked-off lanes too; they are discarded
            for fn, reads, writes, shape, dt, grid, constexprs, warps, stages in self.launches:
                out = torch.empty(shape, dtype=dt, device=self.dev)
                bufs[writes] = out
                if out.numel():
                    fn[grid](*[bufs[i] for i in reads], out, **constexprs, num_warps=warps, num_stages=stages)
                    self.launched += 1
        outs = [bufs[o].clone() if o in self.copied else bufs[o] for o in self.outputs]
        for k, pos in self.states.items():  # after every kernel: nothing reads the old value any more
            state = passed[pos]
            if outs[k] is not state:
                state.copy_(outs[k])
                outs[k] = state
        return outs

    def run_torch(self, xs: list) -> list:
        """torch in, torch out on the first input's device."""
        out_dev = xs[0].device if xs else self.dev
        xs = [x if x.device == self.dev else x.to(self.dev) for x in xs]
        if self._lock is None:
            outs = self._launch_all(xs)
        else:
            with self._lock:
                outs = self._launch_all(xs)
        return [o if o.device == out_dev else o.to(out_dev) for o in outs]

    def run_numpy(self, xs) -> list[np.ndarray]:
        return [to_numpy(o) for o in self.run_torch([to_torch(np.asarray(a), self.dev) for a in xs])]


__all__ = ["TritonRunner"]
