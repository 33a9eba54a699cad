"""The JAX executable: weights folded and placed on the device once, one jitted call per run.

Building an executable (1) folds weight-only subgraphs on the host
(``backends.fold``), (2) moves the per-call graph's weights to the device
once, (3) traces and compiles the program.  A call then converts the
model's inputs, runs the compiled program and converts outputs back; no
weight crosses to the device again.

Weights are either jit *arguments* (default: one compiled program that any
weight values fit, small HLO) or closed-over *constants* (XLA may fold them
into the code; big programs, slow compiles); the knob ``weights`` picks.

CPU threads (measured, jax 0.10.2, 2-core machine).  XLA runs dots through
YNNPACK on a pool sized to the process's CPU affinity;
``--xla_cpu_multi_thread_eigen=false`` does not reach it, so to limit XLA to
N cores restrict the affinity (``taskset``, ``os.sched_setaffinity`` before
the first JAX call).  Per-call dispatch (~15 us) and weight layout (torch's
[out, in] vs pre-transposed) measured no difference.  When torch ops and
these calls alternate on few cores, torch's libgomp workers spin-wait for
milliseconds after each op and hold the cores XLA's pool needs: a 2-core
mlp call went from ~2.3 ms alone to ~4 ms interleaved.  Setting
``GOMP_SPINCOUNT`` low (e.g. 10000) or ``OMP_WAIT_POLICY=PASSIVE`` before
torch is imported removes most of that, at some cost to torch's own ops;
it is process-wide, so this backend leaves it to the user.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from ...errors import BackendError, InputError
from ...ir import dtypes
from ...ir.graph import Graph
from ...ir.tensors import to_numpy, to_torch, torch_dtype, view_numpy
from ..base import Executable, device_kind, guarded_lower
from ..fold import fold_weights
from .callpath import fast_call
from .function import INT32_MAX, INT32_MIN, Program, program_dtype, to_program_dtype, x64_scope


def _torch():
    return sys.modules["torch"]


KNOBS = {
    # idioms as library calls (dot_general, softmax) or through their primitive form
    "idioms": ["library", "primitive"],
    # recognise SumReduce(Mul(expand, expand)) as dot_general and index_select gathers as take
    "peephole": [True, False],
    # (with peephole) sliding-window reductions as conv_general_dilated / reduce_window, not im2col
    "windows": [True, False],
    # dot precision: 'highest' is exact float32 everywhere; 'default' lets TPUs use bf16 passes
    "precision": ["highest", "default"],
    # weights as jit arguments or as closed-over constants
    "weights": ["arguments", "constants"],
}


def knobs(graph: Graph) -> dict[str, list]:
    return {k: list(v) for k, v in KNOBS.items()}


def jax_device(device: str):
    kind = device_kind(device)
    index = int(str(device).split(":")[1]) if ":" in str(device) else 0
    platform = {"cpu": "cpu", "cuda": "gpu", "tpu": "tpu"}[kind]
    try:
        devs = jax.devices(platform)
    except RuntimeError as e:
        raise BackendError(f"JAX has no {kind} device here ({e}); use device='cpu' or install jax for {kind}") from None
    if index >= len(devs):
        raise BackendError(f"device {device!r} does not exist: JAX sees {len(devs)} {kind} device(s)")
    return devs[index]


@dataclass(eq=False)  # identity equality/hash: executables are cache values, not data
class JaxExecutable(Executable):
    program: Any = field(default=None, repr=False)
    folded: dict = field(default_factory=dict, repr=False)  # weight-only values computed at build

    def __post_init__(self):
        self._dev = jax_device(self.device)
        main, self.folded = fold_weights(self.graph)
        self.program = Program(main, self.knobs)
        self._x64 = self.program.x64
        with x64_scope(self._x64):
            host = self.program.host_weights()
            self.weights = tuple(jax.device_put(w, self._dev) for w in host)
            self._in_types = [(s, program_dtype(d, self._x64)) for s, d in main.input_types()]
            self._out_dtypes = [d for _, d in main.output_types()]
            specs = [jax.ShapeDtypeStruct(s, d) for s, d in self._in_types]
            if self.knobs.get("weights", "arguments") == "constants" or not self.weights:
                # (no weights: the same program either way, and a call passes no empty weight tuple)
                ws, prog = self.weights, self.program
                fn = jax.jit(lambda *xs: prog.fn(ws, *xs))
                self._compiled = fn.lower(*specs).compile()
                self._call = self._compiled
                self._prefix = ()
            else:
                fn = jax.jit(self.program.fn)
                wspecs = tuple(jax.ShapeDtypeStruct(w.shape, w.dtype) for w in self.weights)
                self._compiled = fn.lower(wspecs, *specs).compile()
                compiled, ws = self._compiled, self.weights
                self._call = lambda *xs: compiled(ws, *xs)
                self._prefix = (ws,)
            self._jitted = fn
        self._fast = fast_call(self)

    def fast_path(self):
        return self._fast

    def __call__(self, *inputs):
        out = self._fast(inputs)  # the precomputed common case (see .callpath), None otherwise
        return out if out is not None else Executable.__call__(self, *inputs)

    # -- inspection ---------------------------------------------------------------
    def jaxpr(self):
        """The traced program (for inspection and tests)."""
        with x64_scope(self._x64):
            specs = [jax.ShapeDtypeStruct(s, d) for s, d in self._in_types]
            return jax.make_jaxpr(self.program.fn)(self.weights, *specs)

    def hlo_text(self) -> str:
        """The optimised HLO XLA compiled."""
        return self._compiled.as_text()

    def export(self, directory: str, platforms=("cpu", "cuda", "tpu")) -> str:
        """Write this program as StableHLO plus weights (see :mod:`.export`)."""
        from .export import export_executable

        return export_executable(self, directory, platforms)

    @property
    def stats(self) -> dict:
        """Counts from the last trace: views needing a gather or a stack, peephole rewrites applied."""
        return dict(self.program.ctx.stats)

    # -- running ------------------------------------------------------------------
    def run_jax(self, inputs: list) -> list:
        """Fast path: jax arrays in (program dtypes: int64 as int32 unless x64), jax arrays out."""
        with x64_scope(self._x64):
            return list(self._call(*inputs))

    def run_numpy(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        names = self.graph.input_names()
        with x64_scope(self._x64):
            xs = [to_program_dtype(np.asarray(x), self._x64, f"input {n!r}") for n, x in zip(names, inputs)]
            if self._dev.platform != "cpu":  # on CPU the compiled call takes numpy directly (see _from_torch)
                xs = [jax.device_put(x, self._dev) for x in xs]
            outs = self._call(*xs)
            return [self._out_numpy(o, d) for o, d in zip(outs, self._out_dtypes)]

    def _out_numpy(self, o, dt: str) -> np.ndarray:
        a = np.asarray(o)
        want = dtypes.to_numpy(dt)
        return a if a.dtype == want else a.astype(want)

    def run_torch(self, inputs: list) -> list:
        """torch in, torch out; zero-copy through DLPack where the device allows it."""
        import torch

        types = self.graph.input_types()
        names = self.graph.input_names()
        if len(inputs) != len(types):
            raise InputError(f"the graph takes {len(types)} input(s) ({', '.join(names)}), got {len(inputs)}")
        dev = next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
        xs = []
        with x64_scope(self._x64):
            for name, (shape, dt), x in zip(names, types, inputs):
                if not isinstance(x, torch.Tensor):
                    x = torch.as_tensor(np.asarray(x))
                if tuple(x.shape) != tuple(shape):
                    raise InputError(f"input {name!r} has shape {tuple(x.shape)}, the graph expects {tuple(shape)}")
                if dtypes.from_torch(x.dtype) != dt:
                    raise InputError(f"input {name!r} has dtype {x.dtype}, the graph expects {dt}; "
                                     f"convert it with tensor.to(torch.{dt})")
                x = x.detach()
                if dt == "int64" and not self._x64:
                    if x.numel() and (int(x.min()) < INT32_MIN or int(x.max()) > INT32_MAX):
                        raise InputError(f"input {name!r} holds int64 values outside the int32 range")
                    x = x.to(torch.int32)
                xs.append(_from_torch(x.contiguous(), self._dev))
            outs = self._call(*xs)
            return [_to_torch(o, d, dev) for o, d in zip(outs, self._out_dtypes)]


def _from_torch(t, dev):
    if t.device.type == "cpu" and dev.platform == "cpu":
        # A CPU tensor goes in as its zero-copy numpy view: the compiled call copies it into an
        # XLA buffer inline, measured ~0.2-0.4 ms faster per call than DLPack or device_put
        # (both of which import an external / asynchronously transferred buffer).
        try:
            return view_numpy(t)  # bfloat16 (no numpy twin) as a reinterpreted int16 view
        except Exception:
            pass
        try:
            return jax.dlpack.from_dlpack(t)
        except Exception:  # some dtypes (bool on older stacks) do not cross DLPack
            pass
    elif t.device.type == "cuda" and dev.platform == "gpu":
        try:  # shares the tensor's memory; moved only if it lives on another GPU
            x = jax.dlpack.from_dlpack(t)
            return x if dev in x.devices() else jax.device_put(x, dev)
        except Exception:
            pass
    return jax.device_put(to_numpy(t), dev)


def _to_torch(o, dt: str, dev):
    import torch

    try:
        t = torch.from_dlpack(o)
    except Exception:
        t = to_torch(np.asarray(o))
    want = torch_dtype(dt)
    if t.dtype != want:
        t = t.to(want)
    return t.to(dev) if t.device != dev else t


def lower(graph: Graph, device: str, chosen: dict) -> JaxExecutable:
    return guarded_lower("JAX", graph, lambda: JaxExecutable(graph, "jax", device, dict(chosen)))
