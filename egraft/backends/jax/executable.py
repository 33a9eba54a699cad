"""The JAX executable: weights folded and placed on the device once, one jitted call per run.

Building an executable (1) folds weight-only subgraphs on the host
(``backends.fold``), (2) moves the per-call graph's weights to the device
once, (3) traces and compiles the program, (4) hands it to a
``runtime.jax_runner.JaxRunner``, the call path ``egraft.load`` also uses
for a saved JAX program.  A call then converts the model's inputs, runs the
compiled program and converts outputs back; no weight crosses to the device
again.

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

from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from ...errors import BackendError
from ...ir import dtypes
from ...ir.evaluate import check_inputs
from ...ir.graph import Graph
from ...runtime.jax_runner import JaxRunner, jax_device, specs_on
from ...runtime.checked import checked_tensors, torch_signature
from ..base import Executable, device_kind, guarded_lower
from ...runtime import llvm_kernels
from ..fold import compute_folded, inline, plan as fold_plan, widened
from .function import JaxProgram, program_dtype, x64_scope


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
    # products of at most panels.MAX_ROWS rows against a weight read it as panels of this many columns (0: off);
    # the best width depends on the CPU (panels.py), so the search measures it
    "panels": [16, 64, 0],
    # products against a weight (on the CPU): XLA's dot, or a generated product that reads the weight's panels in
    # its stored dtype, widening bfloat16 / float16 in registers (runtime.llvm_kernels; offered where llvmlite is)
    "stream": ["llvm", "xla"],
    # (under stream="llvm") the generated product's panel width: 64 was fastest on an AVX-512 host (one row 5-15 %
    # ahead of 16, sixteen rows 1.6-2x), 32 is the next; the search times both
    "stream_width": [64, 32],
    # (under stream="llvm") a [N, K] weight read as column panels made once ("panels": a second copy of the
    # weight) or where it is stored ("rows": no copy; panels.py); "rows" is what weight_copies=False asks for
    "stream_layout": ["panels", "rows"],
    # (under stream_layout="rows") a product of 2 to 8 rows of float32 x (a batch's decode step) reads the weight
    # as blocks of dot products, four rows as four streams asked for ahead, or as 16 x 16 tiles transposed in
    # registers; on an Intel Xeon the dots read 1.06-1.4 times as fast at 2-8 rows (level at 16, where tiles stay)
    "few_rows": ["dots", "tiles"],
    # (on the CPU) a product whose operand is a view of a larger value (attention over a KV cache's first slots):
    # XLA's dot of the view (XLA copies the slots first), or a generated product reading it in place (view_dots.py)
    "view_dots": ["llvm", "xla"],
    # a weight-only value larger than the weights it is computed from (a quantised weight dequantised to float32:
    # four times its int8 values) folded once, or computed where it is read; False is what weight_copies=False
    # asks for (the search then takes the form that moves the scale out of the product: rewrites.reductions)
    "fold_growing": [True, False],
}
GENERATED = ("stream", "view_dots")  # knobs whose value "llvm" asks for generated CPU products (runtime.llvm_kernels)
# the knob values under which no product keeps a relaid copy of a weight (CompileConfig.weight_copies=False; the
# generated products widen a bfloat16 weight in registers, so no float32 copy is folded either)
COPY_FREE = {"stream": "llvm", "stream_layout": "rows", "panels": 0, "fold_growing": False}


# weights as closed-over constants only for a graph whose weights are small: XLA embeds constants in the compiled
# program, so each candidate would hold its own copy of a model's weights and compile for minutes
CONSTANT_WEIGHTS_MAX = 64 << 20  # bytes


def _weights_too_large(arrays) -> bool:
    return sum(np.asarray(w).nbytes for w in arrays) > CONSTANT_WEIGHTS_MAX


def knobs(graph: Graph) -> dict[str, list]:
    """The search space of this backend for `graph` (KNOBS, less weights as constants for large weights)."""
    out = {k: list(v) for k, v in KNOBS.items()}
    if _weights_too_large(graph.weights.values()):
        out["weights"] = ["arguments"]
    if not llvm_kernels.available():
        out.update({knob: ["xla"] for knob in GENERATED})
    return out


@dataclass(eq=False)  # identity equality/hash: executables are cache values, not data
class JaxExecutable(Executable):
    """A graph compiled by XLA; calls go through its :class:`~egraft.runtime.jax_runner.JaxRunner`.

    The runner is the same one ``egraft.load`` builds for a saved JAX
    program: the executable adds the graph (its input checks and messages,
    inspection, export) around it.
    """

    program: Any = field(default=None, repr=False)
    folded: dict = field(default_factory=dict, repr=False)  # weight-only values computed at build
    exported: Any = field(default=None, repr=False)  # (bytes, platforms): the serialised program it compiled

    def __post_init__(self):
        device_kind(self.device)  # an unknown device string is refused first
        self._dev = jax_device(self.device, BackendError)
        knobs = dict(self.knobs)
        for knob in GENERATED:  # the generated products are CPU code
            if knobs.get(knob) == "llvm" and (device_kind(self.device) != "cpu" or not llvm_kernels.available()):
                knobs[knob] = "xla"
        # weight-only values are folded once; a float32 copy that only widens a stored weight is made only if the
        # program reads it (the generated product reads the stored weight itself)
        fold = fold_plan(self.graph, grow=knobs.get("fold_growing", True))
        wide = widened(fold) if knobs.get("stream") == "llvm" else {}
        self.folded = compute_folded(fold, [n for n in fold.folded_names if n not in wide])
        main = fold.main.with_weights(self.folded) if self.folded else fold.main

        def more(names, fold=fold, into=self.folded, stored=self.graph.weights):
            """Folded values read after all, and stored weights only a folded value read (a widened one)."""
            got = compute_folded(fold, [n for n in names if n not in stored])
            into.update(got)
            return {**{n: stored[n] for n in names if n in stored}, **got}

        self.program = JaxProgram(main, knobs, widened=wide, fold=more)
        if not knobs.get("fold_growing", True):
            # no value larger than its weights is held: a widened weight that no product reads as stored (a
            # product written as a broadcast multiply and a sum, say) is computed where it is read, not folded
            after = [n for n in self.program.weight_names if n in wide]
            if after:
                main = inline(fold, main, after)
                wide = {k: v for k, v in wide.items() if k not in after}
                self.program = JaxProgram(main, knobs, widened=wide, fold=more)
        self._x64 = self.program.x64
        with x64_scope(self._x64):
            host = self.program.host_weights()
            # the host arrays are kept: on the CPU XLA aliases an aligned read-only array instead of copying it,
            # but holds its memory, not the array, and a derived array (``backends.derived``) is shared with
            # other executables only while some executable holds the array itself
            self._host = tuple(host)
            self.weights = tuple(jax.device_put(w, self._dev) for w in host)
            # the state inputs (the last of the inputs) are donated: their buffers hold the new state
            states = range(len(main.input_ids) - len(main.state_ids), len(main.input_ids))
            self._in_types = [(s, program_dtype(d, self._x64, k in states))
                              for k, (s, d) in enumerate(main.input_types())]
            specs = specs_on(self._dev, self._in_types)  # compiled for this device, not JAX's default one
            # (a graph whose weights are large takes them as arguments whatever the knob: a per-layer search may
            # have picked constants for one layer's weights; the whole model's would be copied into the program)
            as_arguments = bool(self.weights) and (self.knobs.get("weights", "arguments") != "constants"
                                                   or _weights_too_large(host))
            if not as_arguments:
                # (no weights: the same program either way, and a call passes no empty weight tuple)
                ws, prog = self.weights, self.program
                fn = jax.jit(lambda *xs: prog.fn(ws, *xs), donate_argnums=tuple(states))
                self._compiled = fn.lower(*specs).compile()
            else:
                # the program XLA compiles is the one a save writes and egraft.load compiles: the same module, so
                # the load of an artifact on the machine that compiled it finds it in XLA's persistent cache
                # (runtime.xla_cache), and what runs after a load is what was validated here
                self.exported = _exported(self)
                call = self.program.fn if self.exported is None else jax.export.deserialize(self.exported[0]).call
                fn = jax.jit(call, donate_argnums=tuple(k + 1 for k in states))
                wspecs = tuple(specs_on(self._dev, [(w.shape, w.dtype) for w in self.weights]))
                self._compiled = fn.lower(wspecs, *specs).compile()
        inputs = [(n, s, d) for n, (s, d) in zip(main.input_names(), main.input_types())]
        self.runner = JaxRunner(self._compiled, self.weights, inputs, [d for _, d in self._in_types],
                                [d for _, d in main.output_types()], self._dev, self._x64, as_arguments,
                                state_outputs=tuple(sorted(main.aliases)))
        self._fast = self.runner.fast
        self._tsig = None  # the torch input signature, made on the first checked torch call

    # -- inspection ---------------------------------------------------------------
    def jaxpr(self):
        """The traced program (for inspection and tests)."""
        with x64_scope(self._x64):
            specs = [jax.ShapeDtypeStruct(s, d) for s, d in self._in_types]
            return jax.make_jaxpr(self.program.fn)(self.weights, *specs)

    def hlo_text(self) -> str:
        """The optimised HLO XLA compiled."""
        return self._compiled.as_text()

    def export(self, directory: str, platforms=None) -> str:
        """Write this program as StableHLO plus weights (see :mod:`.export`; None: its default platforms)."""
        from .export import export_executable

        return export_executable(self, directory, platforms)

    @property
    def stats(self) -> dict:
        """Counts from the last trace: views needing a gather or a stack, peephole rewrites applied."""
        return dict(self.program.ctx.stats)

    # -- running ------------------------------------------------------------------
    def run_jax(self, inputs: list) -> list:
        """jax arrays in (program dtypes: int64 as int32 unless x64), jax arrays out, no conversions."""
        return self.runner.call(list(inputs))

    def __call__(self, *inputs):
        if self.graph.state_ids and any(isinstance(x, jax.Array) for x in inputs):
            out = self._fast(inputs)
            if out is not None:
                return out
            # jax arrays (a state kept on the device) are checked through zero-copy stand-ins of their
            # shape and IR dtype and passed on as they are, so the compiled call can donate them
            ir_np = [np.dtype(dtypes.to_numpy(d)) for _, d in self.graph.input_types()]
            stand = [np.broadcast_to(np.zeros((), w if x.dtype == p else x.dtype), x.shape)
                     if isinstance(x, jax.Array) else x
                     for x, w, p in zip(inputs, ir_np, self.runner.program_dtypes)] + list(inputs[len(ir_np):])
            checked = check_inputs(self.graph, stand)
            return self.runner.run_numpy([x if isinstance(x, jax.Array) else c for x, c in zip(inputs, checked)])
        return super().__call__(*inputs)

    def run_numpy(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Checked numpy arrays in (``Executable.__call__`` checks them against the graph), numpy out."""
        return self.runner.run_numpy(inputs)

    def run_torch(self, inputs: list) -> list:
        """torch in, torch out on the first tensor's device; zero-copy through DLPack where the device allows it."""
        if self._tsig is None:
            self._tsig = torch_signature(self.graph.input_types())
        return self.runner.run_torch(checked_tensors(inputs, self._tsig, lambda: check_inputs(self.graph, inputs)))


def _exported(ex: JaxExecutable) -> tuple[bytes, list[str]] | None:
    """`ex`'s program as its artifact holds it (``export.serialise``: the bytes and their platforms), or None when
    jax.export cannot write it (the program is then compiled from its function; a save reports the failure)."""
    from .export import serialise

    try:
        return serialise(ex)
    except BackendError:
        return None


def lower(graph: Graph, device: str, chosen: dict) -> JaxExecutable:
    return guarded_lower("JAX", graph, lambda: JaxExecutable(graph, "jax", device, dict(chosen)))
