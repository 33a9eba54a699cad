"""Products against a weight with few rows: the weight stored in column panels, one batched dot.

A decode step multiplies a handful of rows (one per sequence) by every
weight matrix; the time is reading the weights.  XLA's CPU dot reads a
``[K, N]`` weight at close to memory bandwidth for one row, but for 2 to 64
rows it packs the weight into its GEMM layout on every call, and the same
products took twice as long (measured, jax 0.10.2, one core, Llama-style
4 x 512 weights: 1 row 4.5 ms, 4 rows 8.7 ms).  Stored once, at build, as
``[N / w, K, w]`` panels of ``w`` columns, the product is one batched
``dot_general`` of ``[N / w, M, K] x [N / w, K, w]`` whose panels XLA uses
as they are: 4 rows then took 3.8-4.7 ms, 16 rows 8-11 ms against 13, and
from about 128 rows on the plain dot is as fast or faster.

So under the knob ``panels`` (the width ``w``; 0 is off) a ``MatMul`` idiom
node ``a [M, K] @ W [K, N]`` whose right side is a weight (as stored, or
the transposed view of a ``[N, K]`` weight, as ``nn.Linear`` keeps it),
with ``M <= MAX_ROWS`` and ``w`` dividing ``N``, reads the weight's panel
form instead.  The sums are the same dot products over ``K`` (float32 or
wider), so the result is the plain dot's up to summation order.  The panel
form is made on the host when the executable is built (:func:`panel_form`)
and passed like any weight; a weight that nothing else reads is passed only
in panel form, so no weight is held twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir import Op
from ...ir.graph import Graph

MAX_ROWS = 64  # past this the plain dot caught up (128 rows: equal; 256: the plain dot 1.6x faster)
SEP = "@panels"  # a panel weight's name: f"{weight}{SEP}{w}" (+ "T" when made from the [N, K] layout)


@dataclass(frozen=True)
class PanelPlan:
    """``lhs @ weight`` through the weight's panel form, the weight value named ``name`` in the program."""

    lhs: int  # node id of the [M, K] left operand
    name: str  # the panel weight's name
    n: int  # N, the product's columns

    def deps(self) -> tuple[int, ...]:
        return (self.lhs,)


@dataclass(frozen=True)
class PanelWeight:
    source: str  # the weight it is made from
    width: int
    transposed: bool  # the source is [N, K] (read through its transposed view)


def _weight_operand(graph: Graph, nid: int) -> tuple[str, bool] | None:
    """(weight name, transposed) when node `nid` is a 2-D weight as stored or the plain transpose of one."""
    n = graph.nodes[nid]
    if n.op == Op.Input:
        return (n.attrs["name"], False) if n.attrs["role"] == "weight" and len(n.shape) == 2 else None
    if n.op != Op.View or len(n.shape) != 2:
        return None
    src = graph.nodes[n.inputs[0]]
    k, m = n.shape
    if (src.op == Op.Input and src.attrs["role"] == "weight" and tuple(src.shape) == (m, k)
            and tuple(n.attrs["strides"]) == (1, k) and n.attrs["offset"] == 0):
        return src.attrs["name"], True
    return None


def find(graph: Graph, width: int) -> tuple[dict[int, PanelPlan], dict[str, PanelWeight]]:
    """The MatMul nodes that read a weight in panels of `width` columns, and the panel weights they need."""
    plans: dict[int, PanelPlan] = {}
    weights: dict[str, PanelWeight] = {}
    if width <= 0:
        return plans, weights
    for i, n in enumerate(graph.nodes):
        if n.op != Op.MatMul or len(n.shape) != 2 or n.dtype != "float32":
            continue
        m, cols = n.shape
        w = _weight_operand(graph, n.inputs[1])
        if w is None or m > MAX_ROWS or cols % width or cols // width < 2:
            continue
        name = f"{w[0]}{SEP}{width}{'T' if w[1] else ''}"
        weights[name] = PanelWeight(w[0], width, w[1])
        plans[i] = PanelPlan(n.inputs[0], name, cols)
    return plans, weights


def panel_form(value: np.ndarray, p: PanelWeight) -> np.ndarray:
    """The weight ``[K, N]`` (or ``[N, K]`` when transposed) as C-contiguous panels ``[N / w, K, w]``."""
    kn = value.T if p.transposed else value
    k, n = kn.shape
    return np.ascontiguousarray(kn.reshape(k, n // p.width, p.width).transpose(1, 0, 2))


def emit_panel_dot(ctx, plan: PanelPlan, a, panels):
    """``a [M, K] @ W`` from W's panels ``[J, K, w]``: one batched dot_general, then the panels side by side."""
    import jax.numpy as jnp
    from jax import lax

    j, k, w = panels.shape
    m = a.shape[0]
    ctx.stats["panel_dots"] += 1
    y = lax.dot_general(jnp.broadcast_to(a[None], (j, m, k)), panels, (((2,), (1,)), ((0,), (0,))),
                        precision=ctx.precision)  # [J, M, w]
    return y.transpose(1, 0, 2).reshape(m, plan.n)


__all__ = ["MAX_ROWS", "PanelPlan", "PanelWeight", "emit_panel_dot", "find", "panel_form"]
