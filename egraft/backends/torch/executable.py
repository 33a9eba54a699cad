"""The torch executable: weights folded and placed on the device once, one FX module call per run.

Building an executable (1) folds weight-only subgraphs on the host
(``backends.fold``), (2) builds the per-call graph as an FX module of ATen
calls whose weights are tensors on the device (:mod:`.program`; on the CPU
they share the bound numpy arrays' memory), (3) under ``mode="inductor"``
compiles its ``forward`` with ``torch.compile(backend="inductor",
fullgraph=True, dynamic=False)`` and runs it once on placeholder inputs, so
the compile happens in ``lower`` and not in the first call.  (The method,
not the module: ``GraphModule.__call__`` formats a kernel's error with a
generator, which Dynamo then tries to compile, turning an integer division
by zero into a misleading ``Unsupported: Attempt to trace generator``.)

A call with exactly the declared inputs (numpy arrays, or torch tensors on
the executable's device) takes a precomputed fast path: numpy arrays cross
as zero-copy tensors (``torch.from_numpy``; bfloat16 through an int16
view) and outputs go back with ``Tensor.numpy()``; torch tensors go in as
they are and come back as the module returns them.  Anything else (another
device, mixed kinds, a wrong shape or dtype) takes the checking path, where
a mismatch raises :class:`~egraft.errors.InputError` from
``ir.evaluate.check_inputs``.

Inductor is asked to keep every rounding of a half type
(``emulate_precision_casts``): by default it drops the round trips between
fused float16 ops, which the reference interpreter (and eager) performs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...errors import BackendError, InputError
from ...ir import Op, dtypes
from ...ir.evaluate import check_inputs
from ...ir.graph import Graph
from ..base import Executable, device_kind, guarded_lower
from ..fold import fold_weights
from .emit import TORCH_DTYPES, from_numpy, to_numpy
from .fx_module import Program

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
}


def knobs(graph: Graph) -> dict[str, list]:
    return {k: list(v) for k, v in KNOBS.items()}


def check_knobs(chosen: dict) -> None:
    for k, v in chosen.items():
        if k in KNOBS and (v not in KNOBS[k] or type(v) is not type(KNOBS[k][0])):
            raise BackendError(f"the torch backend's knob {k!r} takes one of {KNOBS[k]}, got {v!r}")


def torch_device(device: str) -> torch.device:
    kind = device_kind(device)
    index = int(str(device).split(":")[1]) if ":" in str(device) else 0
    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise BackendError(f"the torch backend runs on cpu and cuda, not {device!r}")
    if not torch.cuda.is_available():
        raise BackendError(f"torch sees no CUDA device here, so {device!r} cannot be used; use device='cpu'")
    if index >= torch.cuda.device_count():
        raise BackendError(f"device {device!r} does not exist: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


@dataclass(eq=False)  # identity equality/hash: executables are cache values, not data
class TorchExecutable(Executable):
    program: Any = field(default=None, repr=False)
    folded: dict = field(default_factory=dict, repr=False)  # weight-only values computed at build

    def __post_init__(self):
        check_knobs(self.knobs)
        self._dev = torch_device(self.device)
        main, self.folded = fold_weights(self.graph)
        self.program = Program(main, self.knobs, self._dev)
        self.module = self.program.module
        self._inductor = self.knobs.get("mode") == "inductor"
        if self._inductor:
            self._fn = torch.compile(self.module.forward, backend="inductor", fullgraph=True, dynamic=False,
                                     options={"emulate_precision_casts": True})
            self._warm_up(main)
        else:
            self._fn = self.module.forward  # skips nn.Module.__call__'s hook machinery
        self._build_fast_path()

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """The per-call graph's weights (folded values included) as the module holds them, by name."""
        return dict(self.program.weights)

    def _warm_up(self, graph: Graph):
        """Compile now, by running once on placeholder inputs that no op rejects.

        Inputs that feed a Gather index are 0 (always in range), all others 1
        (no integer division by zero), so the compiled kernels run through and
        a failure here is a compile failure.
        """
        index = _feeds_an_index(graph)
        xs = [torch.full(s, 0 if i in index else 1, dtype=TORCH_DTYPES[d], device=self._dev)
              for i, (s, d) in zip(graph.input_ids, graph.input_types())]
        with torch.no_grad():
            self._fn(*xs)

    def _build_fast_path(self):
        """What a call needs, precomputed: the exact input signatures and per-input converters."""
        gtypes = self.graph.input_types()
        self._n_in = len(gtypes)
        self._np_sig = tuple((np.ndarray, tuple(s), dtypes.to_numpy(d)) for s, d in gtypes)
        self._torch_sig = tuple((torch.Tensor, torch.Size(s), TORCH_DTYPES[d]) for s, d in gtypes)
        self._np_bf16 = tuple(dtypes.row(d).bits is not None for _, d in gtypes)  # these cross through an int view
        self._cpu = self._dev.type == "cpu"

    def _run(self, xs: list) -> list:
        """The module on tensors already on the device."""
        if self._inductor:  # its guards were made for contiguous inputs without grad
            with torch.no_grad():
                return list(self._fn(*[x.contiguous() for x in xs]))
        return list(self._fn(*xs))

    def __call__(self, *inputs):
        if len(inputs) == self._n_in:
            try:
                sig = tuple([(x.__class__, x.shape, x.dtype) for x in inputs])
            except AttributeError:
                sig = None
            if sig is not None:
                if sig == self._np_sig:
                    return self.run_numpy(inputs)
                if sig == self._torch_sig:
                    out = self._fast_torch(inputs)
                    if out is not None:
                        return out
        return Executable.__call__(self, *inputs)

    def _fast_torch(self, inputs):
        """Tensors already on the device go straight in; None: take the checking path."""
        dev = self._dev
        xs = []
        for x in inputs:
            if x.device != dev:
                return None
            xs.append(x.detach() if x.requires_grad else x)
        return self._run(xs)

    # -- the checking paths (Executable.__call__) ---------------------------------------
    def run_numpy(self, inputs) -> list[np.ndarray]:
        xs = []
        for x, bf16 in zip(inputs, self._np_bf16):
            if not bf16 and x.flags.writeable:
                try:
                    xs.append(torch.from_numpy(x))
                    continue
                except ValueError:  # negative strides
                    pass
            xs.append(from_numpy(x))
        if not self._cpu:
            xs = [x.to(self._dev) for x in xs]
            return [to_numpy(o.cpu()) for o in self._run(xs)]
        return [to_numpy(o) for o in self._run(xs)]

    def run_torch(self, inputs: list) -> list:
        """torch in (numpy arrays may be mixed in), torch out on the first tensor's device."""
        types = self.graph.input_types()
        if len(inputs) != len(types):
            check_inputs(self.graph, inputs)  # raises, naming the inputs
        out_dev = next(x.device for x in inputs if isinstance(x, torch.Tensor))
        xs = []
        for (shape, dt), x in zip(types, inputs):
            if not isinstance(x, torch.Tensor):
                x = from_numpy(np.asarray(x))
            if tuple(x.shape) != tuple(shape) or x.dtype != TORCH_DTYPES[dt]:
                check_inputs(self.graph, inputs)  # raises the InputError that names the input
                raise InputError(f"an input does not match the graph's {shape}:{dt}")  # pragma: no cover
            xs.append(x.detach().to(self._dev))
        outs = self._run(xs)
        return [o if o.device == out_dev else o.to(out_dev) for o in outs]

    # -- inspection ---------------------------------------------------------------------
    @property
    def stats(self) -> dict:
        """Counts from the build: primitive matrix products run as bmm."""
        return dict(self.program.stats)

    def sources(self) -> str:
        """The FX module's code (one ATen call per line); under Inductor, what it compiles."""
        return self.program.code


def _feeds_an_index(graph: Graph) -> set[int]:
    """Node ids whose values reach a Gather's index operand."""
    marked: set[int] = set()
    stack = [n.inputs[1] for n in graph.nodes if n.op == Op.Gather]
    while stack:
        i = stack.pop()
        if i not in marked:
            marked.add(i)
            stack.extend(graph.nodes[i].inputs)
    return marked


def lower(graph: Graph, device: str, chosen: dict) -> TorchExecutable:
    return guarded_lower("torch", graph, lambda: TorchExecutable(graph, "torch", device, dict(chosen)))
