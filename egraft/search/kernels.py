"""The work of a per-call graph, kernel by kernel: what the roofline model (``cost.py``) prices.

Three parts, each a plain function of an ``ir.Graph``:

* :data:`FLOPS`: arithmetic per op, one entry for every op of ``Group.ALL``
  (a test checks the table against the op registry, so a new op cannot be
  priced by accident).  A multiply-add is 2; elementwise ops count per output
  element, weighted for the transcendental ones; reductions one per input
  element; ``MatMul`` ``2*M*N*K`` (times batch); ``Attention`` its two
  products plus the softmax; leaves, views, ``Iota``, ``Gather`` and
  ``Scatter`` none (they move or index data, their cost is bytes).
* which nodes are *materialised* (written to memory): each backend says, in
  its record's kernel plan (``Backend.plan`` -> ``backends.base.KernelPlan``:
  the Triton backend its own partitioner, ``jax`` / ``torch`` an approximation
  of XLA's / Inductor's fusion in ``backends.xla_fusion``).
* :func:`kernels`: one :class:`Kernel` per materialised node, holding every
  node computed between it and the buffers it reads, the elements it reads
  from each buffer and the arithmetic it does.

Bytes read from a buffer are counted once per kernel, capped at the buffer's
size: a direct read takes the whole buffer, a read through a ``View`` (a
slice of a fused QKV output, a broadcast bias) or as a ``Gather`` source
(an embedding table) only as many elements as that view or gather has.
Bytes written (:func:`written`) are the root's output; a ``Scatter`` root
also stores its updates: its own traffic is the bytes of ``upd`` and ``idx``
read and of ``upd`` written, on top of the copy of ``x`` into its new output
that the functional Scatter makes (``x`` read, the output written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ..ir import Group, Op, dtypes
from ..ir.graph import Graph
from ..runtime.llvm_spec import ITEMSIZE as STORED_ITEMSIZE

Shape = Sequence[int]


def numel(shape: Shape | None) -> int:
    return math.prod(shape or ())


def itemsize(dtype: str | None) -> float:
    """Bytes per element of an IR dtype, or of a stored format that is none (packed int4: the generated CPU
    product's table, ``runtime.llvm_spec.ITEMSIZE``)."""
    if dtype in STORED_ITEMSIZE and dtype not in dtypes.ROWS:
        return STORED_ITEMSIZE[dtype]
    return dtypes.to_numpy(dtype).itemsize if dtype else 4


# FLOPs per output element of each elementwise op: transcendental ops cost several
# (a polynomial or an SFU pass plus range reduction), a select or compare one.
ELEMENTWISE_FLOPS = {
    "Exp2": 4.0, "Log2": 4.0, "Sin": 8.0, "Sqrt": 2.0, "Recip": 2.0,
    "Add": 1.0, "Mul": 1.0, "Mod": 4.0, "Nibble": 3.0, "LessThan": 1.0, "Where": 1.0, "Cast": 1.0,
}
# FLOPs per element of each row idiom: softmax max/sub/exp/sum/scale, layer norm
# mean/centre/square/sum/scale, RMS norm square/sum/scale (per-row rsqrt amortised)
ROW_FLOPS = {"Softmax": 8.0, "LayerNorm": 7.0, "RMSNorm": 4.0}
SOFTMAX_FLOPS = ROW_FLOPS[Op.Softmax]


def _per_output(w: float):
    return lambda out, ins: w * numel(out)


def _per_input(out, ins):
    return float(numel(ins[0]))


def _none(out, ins):
    return 0.0


def _dim(shape: Shape, i: int) -> int:
    return shape[i] if len(shape) >= -i else 1  # (a shape an e-graph analysis left unknown reads as ())


def _matmul(out, ins):
    return 2.0 * numel(out) * _dim(ins[0], -1)


def _attention(out, ins):
    q, k, v = ins[0], ins[1], ins[2]
    scores = numel(q[:-1]) * _dim(k, -2)  # batch * Sq * Sk
    extra = 2.0 if len(ins) == 4 else 1.0  # the scale, and the bias add when there is one
    return 2.0 * scores * (_dim(q, -1) + _dim(v, -1)) + (SOFTMAX_FLOPS + extra) * scores


FLOPS: dict[str, Callable[[Shape, list], float]] = {
    **{op: _per_output(w) for op, w in ELEMENTWISE_FLOPS.items()},
    **{op: _per_output(w) for op, w in ROW_FLOPS.items()},
    "SumReduce": _per_input, "MaxReduce": _per_input,
    "Iota": _none, "Gather": _none,  # index generation and indexed loads: bytes, not arithmetic
    "Scatter": _none,  # indexed stores: bytes (idx and upd read, upd written: see written()), not arithmetic
    "Input": _none, "Constant": _none, "View": _none,
    "MatMul": _matmul, "Attention": _attention,
}
"""op -> (output shape, input shapes) -> FLOPs.  Keys are exactly ``Group.ALL`` (tested)."""


def op_flops(op: str, out: Shape, ins: list) -> float:
    return FLOPS[op](tuple(out or ()), [tuple(s or ()) for s in ins])


CONTRACTING = Group.CONTRACTION | Group.ATTENTION  # ops that run on the matrix units


@dataclass
class Kernel:
    root: int
    nodes: list[int]  # computed nodes fused in it (views and leaves included), ascending
    reads: dict[int, float]  # buffer node id -> elements read
    flops: float
    contraction: int | None  # its matmul / attention node, if any (sets the peak it runs at)
    writes: float = 0.0  # elements written (:func:`written`)


def written(graph: Graph, root: int) -> float:
    """Elements a kernel rooted at `root` writes: its output, and for a Scatter also its updates (stored
    over the copy of its target)."""
    n = graph.nodes[root]
    extra = numel(graph.nodes[n.inputs[2]].shape) if n.op == Op.Scatter else 0
    return float(numel(n.shape) + extra)


def is_buffer(graph: Graph, i: int) -> bool:
    """A leaf held in memory: an input, a weight or a tensor constant (a scalar constant is inlined)."""
    n = graph.nodes[i]
    return n.op == Op.Input or (n.op == Op.Constant and numel(n.shape) > 1)


def _children(graph: Graph, i: int, dots: dict) -> tuple[int, ...]:
    return dots[i] if i in dots else graph.nodes[i].inputs


def kernel(graph: Graph, root: int, mat: set, dots: dict) -> Kernel:
    """The kernel materialising `root`: everything between it and the buffers / materialised values it reads."""
    readers: dict[int, dict[int, int]] = {}  # buffer -> {direct reader: elements it can touch}
    region, seen, stack = [], set(), [root]
    flops, contraction = 0.0, None
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        n = graph.nodes[i]
        region.append(i)
        if i in dots:  # the product's Mul is never formed
            flops += 2.0 * numel(graph.nodes[graph.nodes[i].inputs[0]].shape)
            contraction = i
        else:
            flops += op_flops(n.op, n.shape, [graph.nodes[j].shape for j in n.inputs])
            if n.op in CONTRACTING:
                contraction = i
        for pos, j in enumerate(_children(graph, i, dots)):
            if j in mat or is_buffer(graph, j):
                narrow = n.op == Op.View or (n.op == Op.Gather and pos == 0)
                cap = numel(n.shape) if narrow else numel(graph.nodes[j].shape)
                mine = readers.setdefault(j, {})
                mine[i] = max(mine.get(i, 0), cap)
            else:
                stack.append(j)
    reads = {j: float(min(numel(graph.nodes[j].shape), sum(r.values()))) for j, r in readers.items()}
    return Kernel(root, sorted(region), reads, flops, contraction, written(graph, root))


def kernels(graph: Graph, mat: set, dots: dict) -> list[Kernel]:
    """One kernel per materialised node, in topological (launch) order."""
    return [kernel(graph, r, mat, dots) for r in sorted(mat)]
