"""The Triton rule table: one entry per IR op (primitives, leaves, View, idioms).

``RULES[op].emit(writer, nid, node, idx)`` returns the node's value at index
``idx`` inside a kernel (see ``emitter.py``).  Elementwise ops are Triton
expression templates over their operands' values, written in the op's
compute dtype; index ops (View, Gather, Iota) are index arithmetic; the
reductions, idioms and Scatter (a kernel of its own) have their own modules.  Each op has exactly one
entry - a template in ``_UNARY`` / ``_BINARY`` or a line of ``RULES`` - and
``tests/backends/test_rule_tables.py`` checks every op of ``Group.ALL`` has one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ...errors import BackendError
from ...ir import Op, dtypes, shapes
from . import attention, matmul, reduction, scatter
from .emitter import TL_DTYPE, ZERO, Ix, Val, compute_dtype
from ...ir.strided import digit_map


@dataclass(frozen=True)
class Rule:
    kind: str  # elementwise | index | leaf | reduce | row | dot | attention
    emit: Callable
    doc: str = ""


# --- elementwise templates: op -> {operand dtype class -> template} ---------------
_UNARY = {
    "Exp2": "tl.exp2({0})",
    "Log2": "tl.log2({0})",
    "Sin": "tl.sin({0})",
    "Sqrt": "tl.sqrt({0})",
    "Recip": "1.0 / {0}",
}
_BINARY = {
    # (op, operand is bool) -> template.  Bool add/mul are logical or/and.
    ("Add", False): "{0} + {1}",
    ("Add", True): "{0} | {1}",
    ("Mul", False): "{0} * {1}",
    ("Mul", True): "{0} & {1}",
    # Triton's % is the truncated (C) remainder for ints, as the IR's Mod is (floats: _FLOAT_MOD)
    ("Mod", False): "{0} % {1}",
    ("LessThan", False): "{0} < {1}",
    # the IR's Nibble: bits 0-3 (b even) or 4-7 (b odd) of int8 a, sign-extended (>> on a signed int is arithmetic)
    ("Nibble", False): "((({0}.to(tl.int32) << (28 - 4 * ({1}.to(tl.int32) & 1))) >> 28).to(tl.int8))",
    # i1 compares as signed (True = -1): compare bools as int32
    ("LessThan", True): "{0}.to(tl.int32) < {1}.to(tl.int32)",
}


def _unary(op):
    def emit(w, nid, node, idx):
        x = w.value(node.inputs[0], idx)
        return w.combine(nid, _UNARY[op], [x], node.dtype)
    return emit


# A float remainder is the device function fmod (device_functions: exact, C's special values; Triton's % on floats
# is not exact on a GPU)
_FLOAT_MOD = "fmod({0}, {1})"


def _binary(op):
    def emit(w, nid, node, idx):
        a = w.value(node.inputs[0], idx)
        b = w.value(node.inputs[1], idx)
        dt = w.graph.nodes[node.inputs[0]].dtype
        if op == Op.Mod and dtypes.is_float(dt):
            w.use("fmod")
            tmpl = _FLOAT_MOD
        else:
            tmpl = _BINARY[(op, dt == "bool")]
        return w.combine(nid, tmpl, [a, b], node.dtype)
    return emit


def _where(w, nid, node, idx):
    c, a, b = (w.value(j, idx) for j in node.inputs)
    return w.combine(nid, "tl.where({0}, {1}, {2})", [c, a, b], node.dtype)


def _cast(w, nid, node, idx):
    x = w.value(node.inputs[0], idx)
    src, dst = w.graph.nodes[node.inputs[0]].dtype, node.dtype
    if dst == "bool":
        tmpl = "{0}" if src == "bool" else "{0} != 0"
    elif dtypes.is_half(dst):
        # round to the half type, keep computing in float32
        tmpl = f"{{0}}.to({TL_DTYPE[dst]}).to({TL_DTYPE[compute_dtype(dst)]})"
    elif compute_dtype(src) == compute_dtype(dst):
        return replace(x, dtype=dst)
    else:
        tmpl = f"{{0}}.to({TL_DTYPE[dst]})"  # float -> int truncates toward zero, like the reference
    return w.combine(nid, tmpl, [x], dst)


# --- leaves and index ops ------------------------------------------------------------
def _input(w, nid, node, idx):
    raise BackendError(f"internal: input %{nid} ({node.attrs['name']!r}) is not a kernel argument")


def _constant(w, nid, node, idx):
    if node.shape != ():
        raise BackendError(f"internal: tensor constant %{nid} is not a kernel argument")
    return w.const(node.attrs["value"], node.dtype)


def _iota(w, nid, node, idx):
    ix = idx[0]
    if ix.expr.lstrip("-").isdigit():
        return w.const(int(ix.expr), node.dtype)
    v = Val(ix.expr, "int32", block=ix.block, masks=ix.masks, axes=ix.axes)
    return w.combine(nid, f"({{0}}).to({TL_DTYPE[compute_dtype(node.dtype)]})", [v], node.dtype, f"iota{nid}")


def _union(ixs, attr):
    return frozenset().union(*(getattr(ix, attr) for ix in ixs)) if ixs else frozenset()


def _view(w, nid, node, idx):
    src = node.inputs[0]
    snode = w.graph.nodes[src]
    shape, strides, off = node.attrs["shape"], node.attrs["strides"], node.attrs["offset"]
    if src in w.buffers:
        # a materialised source: one load at the flat offset, whatever the view
        flat = w.affine([(s, ix) for s, ix in zip(strides, idx)], off, "off")
        return w.load_flat(src, flat, _union(idx, "masks"), _union(idx, "axes"))
    dm = digit_map(snode.shape, shape, strides, off)
    if dm is not None:
        sidx = [ZERO if snode.shape[j] == 1 else w.affine([(c, idx[d]) for d, c in terms], base, "i")
                for j, (base, terms) in enumerate(dm)]
    else:
        flat = w.affine([(s, ix) for s, ix in zip(strides, idx)], off, "flat")
        cs = shapes.contiguous_strides(snode.shape)
        first = next((j for j, n in enumerate(snode.shape) if n > 1), None)
        sidx = []
        for j, n in enumerate(snode.shape):
            if n == 1:
                sidx.append(ZERO)
                continue
            e = flat.expr if cs[j] == 1 else f"({flat.expr} // {cs[j]})"
            if j != first:
                e = f"{e} % {n}"
            sidx.append(w.new_index(e, flat.block, flat.masks, flat.axes))
    return w.value(src, tuple(sidx))


def _gather(w, nid, node, idx):
    x, ind = node.inputs
    axis = node.attrs["axis"]
    iv = w.value(ind, idx)
    # garbage indices in masked-off lanes must stay masked: carry the tile's masks along
    g = Ix(iv.expr, block=iv.block, masks=iv.masks | _union(idx, "masks"), axes=iv.axes)
    j = tuple(idx[:axis]) + (g,) + tuple(idx[axis + 1:])
    return w.value(x, j)


RULES: dict[str, Rule] = {}
for _op, _tmpl in _UNARY.items():
    RULES[_op] = Rule("elementwise", _unary(_op), _tmpl)
for (_op, _is_bool), _tmpl in _BINARY.items():
    if not _is_bool:
        RULES[_op] = Rule("elementwise", _binary(_op), _tmpl)
RULES.update({
    "Where": Rule("elementwise", _where, "tl.where(c, a, b)"),
    "Cast": Rule("elementwise", _cast, ".to(dtype); to bool is x != 0; half types round then widen"),
    "Iota": Rule("index", _iota, "the index itself"),
    "Gather": Rule("index", _gather, "a load at a computed index along the axis"),
    # a kernel root, never inlined (partition.py): its rule writes the kernel body, not a value at an index
    "Scatter": Rule("scatter", scatter.emit_scatter_functional, "copy x, barrier, store upd at idx (whole lines)"),
    "View": Rule("index", _view, "index arithmetic (per-digit affine, else divmod)"),
    "Input": Rule("leaf", _input, "a kernel argument"),
    "Constant": Rule("leaf", _constant, "scalar: tl.full literal; tensor: a kernel argument"),
    "SumReduce": Rule("reduce", reduction.emit_reduce, "tl.sum over a row tile or a reduction axis/loop"),
    "MaxReduce": Rule("reduce", reduction.emit_reduce, "tl.max over a row tile or a reduction axis/loop"),
    "Softmax": Rule("row", reduction.emit_row_idiom, "max, exp, sum over one row tile"),
    "LayerNorm": Rule("row", reduction.emit_row_idiom, "mean, variance over one row tile"),
    "RMSNorm": Rule("row", reduction.emit_row_idiom, "mean square over one row tile"),
    "MatMul": Rule("dot", matmul.emit_dot, "tl.dot over a K loop"),
    "Attention": Rule("attention", attention.emit_attention, "single-pass online softmax"),
})

__all__ = ["RULES", "Rule"]
