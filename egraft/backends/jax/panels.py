"""Products against a weight with few rows: the weight stored in column panels, one batched dot.

A decode step multiplies a handful of rows (one per sequence) by every
weight matrix; the time is reading the weights.  XLA's CPU dot reads a
``[K, N]`` weight at close to memory bandwidth for one row, but for 2 to 64
rows it packs the weight into its GEMM layout on every call, and the same
products took twice as long (measured, jax 0.10.2, one core, Llama-style
4 x 512 weights: 1 row 4.5 ms, 4 rows 8.7 ms).  Stored once, at build, as
``[N / w, K, w]`` panels of ``w`` columns, the product is one batched
``dot_general`` of ``[N / w, M, K] x [N / w, K, w]`` whose panels XLA uses
as they are: 4 rows then took 3.8-4.7 ms, 16 rows 8-11 ms against 13; at
64 rows the plain dot was faster (a chunk step of the same model, 64 rows
per product: 32.5 ms against 36.8 with panels), so panels stop at
``MAX_ROWS = 16``.

The best width depends on the CPU.  Those times were panels of 64 columns;
on another host of the same name (an AVX2-only Zen 3 EPYC, where one row
took 4.4 ms) panels of 64 gave 4 rows in 8.7-10 ms, panels of 16 in 6.0-6.7
ms and the plain dot 9.2-11.3 ms; at 1 and 16 rows the widths were level.
The whole Llama decode step at 4 rows: 8.7 ms with panels of 16, 11.9 with
64, 14.3 without (interleaved medians, one pinned core).  So the knob offers
16 (first, the direct candidate's) and 64 and the search times them on the
machine it compiles for.

So under the knob ``panels`` (the width ``w``; 0 is off) a product
``a [M, K] @ W [K, N]`` whose right side is a weight (as stored, or the
transposed view of a ``[N, K]`` weight, as ``nn.Linear`` keeps it), with
``M <= MAX_ROWS`` and ``N >= 2 w``, reads the weight's panel form instead
(when ``w`` does not divide ``N``, as GPT-2's 50,257-word output layer, the
last panel is padded with zero columns and the product's extra columns are
dropped).  The product is either a ``MatMul`` idiom node or the primitive
form the peephole runs as a dot (a ``DotPlan`` with no batch axis, whose
left side's free axes flatten to the ``M`` rows): the traced graph that a
reused lowering runs (``search.pipeline.compile_like``) has only the latter.
The sums are the same dot products over ``K`` (float32 or wider), so the
result is the plain dot's up to summation order.  The panel
form is made on the host when the executable is built (:func:`panel_form`)
and passed like any weight; a weight that nothing else reads is passed only
in panel form.  The panel form of one weight array is made once per process
and shared (read-only, 64-byte aligned, so XLA's CPU client aliases it
rather than copying): a generation's step programs, one per chunk size and
context bucket, bind the same weights and so the same panels.

Under the knob ``stream="llvm"`` (the JAX backend's, on the CPU) the panels
are read by a generated CPU product instead (``runtime.llvm_kernels``), for
any number of rows, and in the weight's stored dtype: a bfloat16 or float16
model's product is traced as float32 over ``Cast(W)`` (a folded float32 copy
of the weight, ``backends.fold.widened``), and the kernel reads ``W``'s own
panels and widens them in registers, so the float32 copy is never made and
a step reads half the bytes.  XLA's own dot of bfloat16 weights is a slow
path on the CPU (18x the float32 dot, measured), so this is the only form
that gains from the narrower weights; the search times both.

The generated product can also read a ``[N, K]`` weight (``nn.Linear``'s
layout) where it is stored, with no panel copy (knob ``stream_layout="rows"``,
``runtime.llvm_ir``'s layout ``"rows"``), when 16 divides ``N`` and ``K``; the
program then passes the weight itself under its panel name (the same array:
bound, and saved, once).  Other products keep the panel copy.  It is what
``CompileConfig(weight_copies=False)`` asks for, and the search does not
offer it otherwise: measured on one core (AVX-512 host, the 494 M model's
weights), one row reads a bfloat16 weight as fast as its panels (0.97-1.09
times their time) and a float32 one 1.0-1.4 times slower, but 4 to 64 rows
take 1.0-1.6 times the panels' time, and the search times only the decode
step, not the prompt's products.

A one-row product of an int8 weight read in place whose left side widens an
int8 value (a quantised activation of ``quantize="w8a8"``) reads that int8
value instead and sums in int32 (``runtime.llvm_act8``): the same integers'
products, exact, where the float form rounds its sum.  A product of a
bfloat16 weight whose left side widens a bfloat16 value reads that value
as it is (``runtime.llvm_bf16``) only where the CPU has a bfloat16 dot
product instruction (``llvm_bf16.dot_instruction``): without it that form
widens the same row of x again for every weight row, and the one-row step
of the 494 M model in bfloat16 took 76.6 ms that way against 71.8 with x
widened once by XLA and the float32-x product (the 135 M model: 23.8
against 22.8; AVX2 Zen 3, one core, 21 interleaved rounds each).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...ir import Op
from ...ir.analysis import weight_operand
from ...ir.graph import Graph
from ...runtime import llvm_kernels
from ...runtime.derived import derived
from ...runtime.llvm_bf16 import dot_instruction
from ...runtime.llvm_ir import TILE, VEC
from ...runtime.llvm_kernels import WIDEN, KernelSpec
from ...runtime.llvm_spec import ACT16_ROWS, ACT16_STEP, ACT8_STEP, DOTS_ROWS, tiles_alias
from ..fold import Widened
from .peephole import DotPlan, place_output

MAX_ROWS = 16  # past this the plain dot catches up (64 rows: the plain dot 12 % faster in a model's chunk step;
#               128 rows: equal; 256: the plain dot 1.6x faster)
SEP = "@panels"  # a panel weight's name: f"{weight}{SEP}{w}" (+ "T" when made from the [N, K] layout)


@dataclass(frozen=True)
class PanelPlan:
    """``lhs @ weight`` through the weight's panel form, the weight value named ``name`` in the program."""

    lhs: int  # node id of the left operand: [M, K] (a MatMul), or the DotPlan's lhs source
    name: str  # the panel weight's name
    n: int  # N, the product's columns
    dot: DotPlan | None = None  # the primitive product this replaces (None: a MatMul idiom node)
    kernel: KernelSpec | None = None  # the generated CPU product that reads the panels (None: XLA's batched dot)
    scales: str | None = None  # (an int4 kernel) the scales' weight name in the program

    def deps(self) -> tuple[int, ...]:
        return (self.lhs,)


@dataclass(frozen=True)
class PanelWeight:
    source: str  # the weight it is made from (under ``stream``, the stored weight a folded float32 copy widens)
    width: int
    transposed: bool  # the source is [N, K] (read through its transposed view)
    layout: str = "panels"  # "rows": the source [N, K] itself, no copy (the generated product reads it in place)


def _dot_weight(graph: Graph, p: DotPlan, flat=frozenset()) -> tuple[str, bool, int, int, int] | None:
    """(weight name, transposed, M, N, K) when a primitive product is rows @ a 2-D weight with no batch axis (or
    a weight named in `flat`, a dequantised int4 ``[N, G, group]`` read as the ``[N, K]`` it reshapes)."""
    src = graph.nodes[p.rhs.src]
    r = p.axis
    if src.op != Op.Input or src.attrs["role"] != "weight" or len(p.rhs.axes) != 2:
        return None
    if len(src.shape) != 2 and not (src.attrs["name"] in flat and p.rhs.view is not None):
        return None
    if r not in p.rhs.axes or r not in p.lhs.axes or any(d in p.lhs.axes for d in p.rhs.axes if d != r):
        return None  # a batch axis (both sides vary along it)
    n_axis = next(d for d in p.rhs.axes if d != r)
    k, n = p.mul_shape[r], p.mul_shape[n_axis]
    # the weight's dims in rhs.axes order: its stored layout, or the view's (a plain transpose or none)
    shape, strides = (tuple(src.shape), None) if p.rhs.view is None else (p.rhs.view[0], p.rhs.view[1])
    if p.rhs.view is not None and p.rhs.view[2] != 0:
        return None
    rows_first = p.rhs.axes == (r, n_axis)  # the operand's dims are (K, N)
    if tuple(shape) != ((k, n) if rows_first else (n, k)):
        return None
    if strides is None:
        transposed = not rows_first
    elif tuple(strides) == (n, 1) if rows_first else tuple(strides) == (1, n):
        transposed = False  # stored [K, N]
    elif tuple(strides) == (1, k) if rows_first else tuple(strides) == (k, 1):
        transposed = True  # stored [N, K]
    else:
        return None
    m = 1
    for d in p.lhs.axes:
        if d != r:
            m *= p.mul_shape[d]
    return src.attrs["name"], transposed, m, n, k


def find(graph: Graph, width: int, dots: dict | None = None, stream: bool = False,
         widened: dict[str, Widened] | None = None,
         layout: str = "panels", few_rows: str = "tiles") -> tuple[dict[int, PanelPlan], dict[str, PanelWeight]]:
    """The products that read a weight in panels of `width` columns (MatMul nodes, and the primitive products
    among the peephole's `dots`: node id -> DotPlan), and the panel weights they need.

    Under `stream` every such product of a float32, bfloat16 or float16 weight (any number of rows) is the
    generated CPU product of ``runtime.llvm_kernels``, and a product of a folded value that only widens a
    stored weight (`widened`: ``backends.fold.widened``) reads that weight's own panels, in its stored dtype;
    with `layout` ``"rows"`` a stored ``[N, K]`` weight whose ``N`` the width divides (and ``K`` the kernel's
    vector) is read in place (module docstring); a product of 2 to ``DOTS_ROWS`` rows of float32 x reads it in
    the form `few_rows` names (``"dots"``: blocks of dots, ``"tiles"``: transposed tiles; ``runtime.llvm_tiles``).
    """
    plans: dict[int, PanelPlan] = {}
    weights: dict[str, PanelWeight] = {}
    if width <= 0:
        return plans, weights
    stored = {n.attrs["name"]: n.dtype for n in graph.nodes if n.op == Op.Input and n.attrs["role"] == "weight"}

    bf16_dot = dot_instruction()  # (the module docstring: a bfloat16 x read as it is only with the instruction)

    def add(i, lhs, w, m, cols, k, dot=None):
        name, transposed = w
        kernel, scales = None, None
        if stream:
            wide = (widened or {}).get(name)
            dtype = stored[name]
            if wide is not None:
                name, transposed, dtype = wide.source, transposed != wide.transposed, wide.dtype
            if dtype not in WIDEN or cols < 2 * width:
                return
            rows = layout == "rows" and transposed and cols % TILE == 0 and k % VEC == 0
            if dtype == "int4":  # read as stored only (else XLA's product reads the dequantised value after all)
                if not rows:
                    return
                kernel = KernelSpec(dtype, m, k, -(-cols // width), width, "rows", cols % width and cols, wide.group)
                scales = f"{wide.scales}{SEP}{width}S"
                weights[scales] = PanelWeight(wide.scales, width, False, "rows")
            elif rows:
                kernel = KernelSpec(dtype, m, k, -(-cols // width), width, "rows", cols % width and cols)
                narrow = _narrow_source(graph, lhs, dtype) if (
                    dtype == "int8" and m == 1 and k % ACT8_STEP == 0
                    or dtype == "bfloat16" and bf16_dot and k % ACT16_STEP == 0 and (m == 1 or m <= ACT16_ROWS
                                                                        and not tiles_alias(kernel))
                ) else None
                if narrow is not None:  # x as it was before its widening: an integer dot product (w8a8), or a
                    kernel, lhs = replace(kernel, act=dtype), narrow  # bfloat16 one (runtime.llvm_bf16)
                elif few_rows == "dots" and 1 < m <= DOTS_ROWS:
                    kernel = replace(kernel, form="dots")
            else:
                kernel = KernelSpec(dtype, m, k, -(-cols // width), width)
        elif m > MAX_ROWS or cols < 2 * width:
            return
        if kernel is not None and kernel.layout == "rows":
            pname, pw = f"{name}{SEP}{width}R", PanelWeight(name, width, transposed, "rows")
        else:
            pname, pw = f"{name}{SEP}{width}{'T' if transposed else ''}", PanelWeight(name, width, transposed)
        weights[pname] = pw
        plans[i] = PanelPlan(lhs, pname, cols, dot, kernel, scales)

    flat = frozenset(name for name, wide in (widened or {}).items() if wide.group) if stream else frozenset()
    for i, n in enumerate(graph.nodes):
        if n.op == Op.MatMul and len(n.shape) == 2 and n.dtype == "float32":
            w = weight_operand(graph, n.inputs[1]) or _int4_operand(graph, n.inputs[1], flat)
            if w is not None:
                add(i, n.inputs[0], w, n.shape[0], n.shape[1], graph.nodes[n.inputs[0]].shape[1])
    for i, p in (dots or {}).items():
        if isinstance(p, DotPlan) and graph.nodes[i].dtype == "float32":
            found = _dot_weight(graph, p, flat)
            if found is None:  # the weight as the product's first factor (the e-graph commutes a Mul's operands)
                p = replace(p, lhs=p.rhs, rhs=p.lhs)
                found = _dot_weight(graph, p, flat)
            if found is not None:
                add(i, p.lhs.src, found[:2], found[2], found[3], found[4], p)
    return plans, weights


def _narrow_source(graph: Graph, nid: int, dtype: str) -> int | None:
    """The node of `dtype` that node `nid` widens to float32 (int8: a quantised activation, ``quantize="w8a8"``;
    bfloat16: a bfloat16 model's activation), or None."""
    n = graph.nodes[nid]
    if n.op == Op.Cast and n.dtype == "float32" and graph.nodes[n.inputs[0]].dtype == dtype:
        return n.inputs[0]
    return None


def _int4_operand(graph: Graph, nid: int, flat) -> tuple[str, bool] | None:
    """(name, True) when node `nid` is ``W.T [K, N]`` of a dequantised int4 weight ``[N, G, group]`` named in
    `flat` (the transposed view of the ``[N, K]`` it reshapes)."""
    n = graph.nodes[nid]
    if n.op != Op.View or len(n.shape) != 2 or n.attrs["offset"]:
        return None
    src = graph.nodes[n.inputs[0]]
    k, rows = n.shape
    if (src.op == Op.Input and src.attrs["name"] in flat and src.shape[0] == rows
            and int(np.prod(src.shape[1:])) == k and tuple(n.attrs["strides"]) == (1, k)):
        return src.attrs["name"], True
    return None


def panel_form(value: np.ndarray, p: PanelWeight) -> np.ndarray:
    """The weight ``[K, N]`` (or ``[N, K]`` when transposed) as C-contiguous panels ``[ceil(N / w), K, w]``, the
    last one padded with zero columns; read-only, made once per weight array while a program binds it
    (the ``panels`` recipe of ``runtime.derived``, which a saved generation stores instead of the panels).
    Layout ``"rows"``: the ``[N, K]`` weight itself (a copy only if it is not C-contiguous)."""
    if p.layout == "rows":
        return value if value.flags.c_contiguous else derived("contiguous", {}, (value,), (p.source,))
    return derived("panels", {"width": p.width, "transposed": p.transposed}, (value,), (p.source,))


def emit_panel_dot(ctx, plan: PanelPlan, a, panels, view_fn, scales=None):
    """``a [M, K] @ W`` from W's panels ``[J, K, w]``: one batched dot_general, then the panels side by side.

    For a primitive product `a` is the DotPlan's lhs source: read through its
    view, its free axes flattened to rows, and the result put back in the
    product's output axes as the peephole's dot would.
    """
    import jax.numpy as jnp
    from jax import lax

    if plan.kernel is not None:  # (panels [J, K, w], or the stored rows [J * w, K])
        j, k, w = plan.kernel.panels, plan.kernel.k, plan.kernel.width
    else:
        j, k, w = panels.shape
    p = plan.dot
    if p is not None:
        if p.lhs.view is not None:
            a = view_fn(a, *p.lhs.view)
        free = [d for d in p.lhs.axes if d != p.axis]
        a = jnp.transpose(a, [p.lhs.axes.index(d) for d in free] + [p.lhs.axes.index(p.axis)])
        free_shape = a.shape[:-1]
        a = a.reshape(-1, k)
    m = a.shape[0]
    if plan.kernel is not None:  # the generated CPU product (runtime.llvm_kernels): [M, J * w] float32
        ctx.stats["kernel_dots"] += 1
        y = llvm_kernels.call(plan.kernel, a if plan.kernel.act != "float32" else a.astype(jnp.float32), panels, scales)
    else:
        ctx.stats["panel_dots"] += 1
        y = lax.dot_general(jnp.broadcast_to(a[None], (j, m, k)), panels, (((2,), (1,)), ((0,), (0,))),
                            precision=ctx.precision)  # [J, M, w]
        y = y.transpose(1, 0, 2).reshape(m, j * w)
    if j * w != plan.n:
        y = y[:, :plan.n]  # the padded columns of the last panel
    if p is None:
        return y
    # y's axes: the lhs free axes, then the rhs's N axis (as product axes)
    n_axis = next(d for d in p.rhs.axes if d != p.axis)
    return place_output(y.reshape(*free_shape, plan.n), free + [n_axis], p)


__all__ = ["MAX_ROWS", "PanelPlan", "PanelWeight", "emit_panel_dot", "find", "panel_form"]
