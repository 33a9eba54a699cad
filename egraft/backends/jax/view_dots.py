"""Products that read an operand where it lies: a view into a larger value, as attention reads a KV cache.

A decode step's attention multiplies the queries by the first ``C`` slots of each layer's key cache, and the
probabilities by the same slots of its value cache.  In the IR those operands are views (``View``) of the
caches' updated values; the peephole's dot (:mod:`.peephole`) realises each view, and XLA copies the slots
into a buffer of its own before its dot reads them: two such copies and two small dots a layer, 18 % of the
135 M Llama-shape model's int8 decode step on one core of the Zen 1 host (``bench/step_profile.py``).

Under the knob ``view_dots="llvm"`` (the JAX backend's, on the CPU) such a product is a generated CPU
product (``runtime.llvm_kernels``) that reads the view where it lies: its operand is the whole value (as it is) and the kernel's spec holds the view's offset and strides.  It is a batch of
products, one per index of the batch axes (a cache's rows and key-value heads), whose ``W`` is one
``[slots, head_dim]`` block of the cache:

* the keys, contracted along ``head_dim`` (unit stride): ``W`` read as stored rows (layout ``"rows"``; rows
  of at most ``runtime.llvm_short.SHORT_K`` values take that module's form);
* the values, contracted along the slots: ``W`` read as a ``[k, n]`` matrix (layout ``"kn"``).

The queries of a key-value head (grouped-query attention's group, and a chunk's tokens) are the product's
rows.  The sums are float32 dot products over the contracted axis, as XLA's dot's are, in another order.
A product that does not have this shape (a view of all of its value,
more than one axis of the view's own, strides the batch axes do
not compose into one, sizes the kernels do not take, more than :data:`MAX_ROWS` rows) keeps the dot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...ir import Op, strided
from ...ir.graph import Graph
from ...runtime import llvm_kernels
from ...runtime.llvm_spec import FLOATS, TILE, VEC, KernelSpec
from .peephole import DotPlan, place_output

MAX_ROWS = 64  # rows of x (queries of one key-value head) past which the dot keeps the product: these forms were
#                built and measured for a decode step's few rows; a long prompt chunk's attention is a matrix product
KN_WIDTHS = (32, 16)  # (values) columns a panel of the [slots, head_dim] matrix holds, the first that divides it


@dataclass(frozen=True)
class ViewDotPlan:
    """A :class:`~.peephole.DotPlan` whose right side is read in place by the generated product `kernel`."""

    dot: DotPlan
    kernel: KernelSpec
    source: int  # node id of the value the kernel reads (under the right side's views and widening casts)
    batch: tuple[int, ...]  # Mul-output axes of the batch (both factors), in order
    free: tuple[int, ...]  # Mul-output axes of the left side's own (the product's rows)
    n_axis: int  # the Mul-output axis of the right side's own (the product's columns)

    def deps(self) -> tuple[int, ...]:
        return (self.dot.lhs.src, self.source)


def _walks(graph: Graph, nid: int, view) -> tuple[int, list, int] | None:
    """(the value read, its flat walks per view axis, the offset): `view` of node `nid` followed down through
    Views and widening Casts (elementwise, so a view of a cast is the cast of the view) to the value under them.
    A walk is ``(size, stride)``, stride None for a broadcast, digits of an axis outer first."""
    shape, strides, offset = view
    axes = strided.view_axes(shape, strides)
    while True:
        node = graph.nodes[nid]
        if node.op == Op.Cast and node.dtype == "float32" and graph.nodes[node.inputs[0]].dtype in FLOATS:
            nid = node.inputs[0]
        elif node.op == Op.View:
            m = strided.read_pieces(node.shape, axes, offset)
            if m is None:
                return None
            axes, offset = strided.through_view(m, node.attrs["strides"], node.attrs["offset"])
            nid = node.inputs[0]
        else:
            return nid, [_merged(w) for w in axes], offset


def _merged(walks: list) -> list:
    """`walks` with neighbours that step as one (outer stride = inner stride x inner size) made one walk."""
    out: list = []
    for size, stride in walks:
        if out and stride is not None and out[-1][1] == stride * size:
            out[-1] = (out[-1][0] * size, stride)
        else:
            out.append((size, stride))
    return out


def _batch(walks: list) -> tuple[int, int, int] | None:
    """(products, the stride between them, repeats): the batch digits (outer first) as one strided run of
    products followed by broadcast digits (grouped-query attention's query heads of one key-value head), which
    become rows of each product; None when they are not."""
    walks = [w for w in walks if w[0] > 1]
    repeats = 1
    while walks and walks[-1][1] is None:
        repeats *= walks.pop()[0]
    merged = _merged(walks)
    if len(merged) > 1 or any(st is None for _, st in merged):
        return None
    return (merged[0] if merged else (1, 0)) + (repeats,)


def _plan(graph: Graph, p: DotPlan) -> ViewDotPlan | None:
    if p.rhs.view is None:  # the operand is a whole value: XLA's dot reads it as it is
        return None
    found = _walks(graph, p.rhs.src, p.rhs.view)
    if found is None:
        return None
    source, walks, offset = found
    src, lhs = graph.nodes[source], graph.nodes[p.lhs.src]
    if src.op == Op.Input and src.attrs.get("role") == "weight":  # a weight's products are the panels' (panels.py)
        return None
    if src.dtype not in FLOATS or lhs.dtype not in FLOATS:
        return None
    if math.prod(n for w in walks for n, st in w if st is not None) >= math.prod(src.shape):
        return None  # the whole value (a transpose or reshape of it): XLA's dot reads it without a copy of a part
    r = p.axis
    batch = [d for d in p.lhs.axes if d in p.rhs.axes and d != r]
    free = [d for d in p.lhs.axes if d not in p.rhs.axes]
    own = [d for d in p.rhs.axes if d not in p.lhs.axes]
    if len(own) != 1:
        return None
    (n_axis,) = own
    walk = {d: walks[i] for i, d in enumerate(p.rhs.axes)}
    found = _batch([w for d in batch for w in walk[d]])
    if found is None or len(walk[r]) != 1 or len(walk[n_axis]) != 1:
        return None
    products, bstride, repeats = found
    (k, sk), (n, sn) = walk[r][0], walk[n_axis][0]
    rows = repeats * math.prod(p.mul_shape[d] for d in free)
    if sk is None or sn is None or min(sk, sn, bstride, offset) < 0 or rows > MAX_ROWS:
        return None
    common = dict(dtype=src.dtype, rows=rows, k=k, batch=products, bstride=bstride, offset=offset)
    if sk == 1 and sn == k and k % VEC == 0 and n % TILE == 0:  # keys: [slots, head_dim] rows
        width = 64 if n >= 64 else TILE
        panels = -(-n // width)
        spec = KernelSpec(layout="rows", panels=panels, width=width, n=0 if panels * width == n else n, **common)
    elif sn == 1 and sk >= n and any(n % w == 0 for w in KN_WIDTHS):  # values: [slots, head_dim]
        width = next(w for w in KN_WIDTHS if n % w == 0)
        spec = KernelSpec(layout="kn", panels=n // width, width=width, ldw=sk, **common)
    else:
        return None
    return ViewDotPlan(p, spec, source, tuple(batch), tuple(free), n_axis)


def find(graph: Graph, plans: dict) -> dict[int, ViewDotPlan]:
    """The peephole's dots (in `plans`) that read a view of a float value in place (the module docstring)."""
    out = {}
    for nid, p in plans.items():
        if type(p) is DotPlan:
            found = _plan(graph, p)
            if found is not None:
                out[nid] = found
    return out


def emit(ctx, plan: ViewDotPlan, a, b, view_fn):
    """The product: the left side realised as ``[batch * rows, k]`` float32, the right side's whole value passed
    flat (the kernel reads the view), the result put in the SumReduce's axes as the peephole's dot would."""
    import jax.numpy as jnp

    p, spec = plan.dot, plan.kernel
    if p.lhs.view is not None:
        a = view_fn(a, *p.lhs.view)
    order = list(plan.batch) + list(plan.free) + [p.axis]
    a = jnp.transpose(a, [p.lhs.axes.index(d) for d in order])
    lead = a.shape[:-1]
    # b goes in as it is (the kernel reads its flat storage): a reshape there would be a second value, which XLA
    # makes by computing b again (a cache's update, twice) rather than by a bitcast of the one buffer
    y = llvm_kernels.call(spec, a.reshape(-1, spec.k).astype(jnp.float32), b)
    n = p.mul_shape[plan.n_axis]
    y = y[:, :n].reshape(*lead, n)
    ctx.stats["view_dots"] += 1
    return place_output(y, list(plan.batch) + list(plan.free) + [plan.n_axis], p)


__all__ = ["KN_WIDTHS", "MAX_ROWS", "ViewDotPlan", "emit", "find"]
