"""``ir.Graph`` <-> egglog text: the encoding context, literals, encoding and decoding.

The constructors are those of :mod:`egraft.rewrites.schema`.  Encoding a
graph turns every node i into ``(union (H h_i) term_i)`` so Python can name
its e-class later; :class:`Decoder` turns egglog's frozen rows back into IR
ops and attributes.  What stays outside the e-graph (constant values, input
roles, weights) is kept in a :class:`Context`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import IRError
from ..ir import Op
from ..ir.graph import Attrs, Graph
from ..ir.ops import TensorValue
from .rule import Term
from .schema import BOOL, F64, HANDLE, I64, SIGS, STR, VEC, ctor_for

# --- literals -------------------------------------------------------------------------

_SAFE_STRING = re.compile(r'^[^"\\\n]*$')


def lit_str(s: str) -> str:
    if not _SAFE_STRING.match(s):
        raise IRError(f"name {s!r} cannot be encoded for the e-graph: rename it without quotes, backslashes or newlines")
    return f'"{s}"'


def lit_f64(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        raise IRError("NaN cannot be an f64 literal in the e-graph (encode it as an opaque Const)")
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    r = repr(v)
    return r if any(c in r for c in ".en") else r + ".0"


def lit_vec(xs: Sequence[int]) -> str:
    return f"(vec-of {' '.join(str(int(x)) for x in xs)})" if len(xs) else "(vec-empty)"


def lit_bool(b: bool) -> str:
    return "true" if b else "false"


LITERAL = {I64: lambda v: str(int(v)), F64: lit_f64, STR: lit_str, VEC: lit_vec, BOOL: lit_bool}


def split_commands(text: str) -> list[str]:
    """Top-level s-expressions of an egglog program (string literals respected)."""
    out, depth, start, in_str, i = [], 0, None, False, 0
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == ";":
            while i < len(text) and text[i] != "\n":
                i += 1
        elif c == "(":
            if depth == 0:
                start = i
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                out.append(text[start:i + 1])
        i += 1
    if depth != 0:
        raise ValueError(f"unbalanced parentheses in egglog text: {text[:80]!r}")
    return out


# --- encoding context: what lives outside the e-graph -------------------------------------

@dataclass
class Context:
    """Facts that stay outside the e-graph: constant values by key, input roles, weights.

    One ``Context`` belongs to one saturation; the Space carries it so an
    extraction can rebuild ``Constant`` and ``Input`` nodes exactly.
    """

    constants: dict[str, tuple[Any, tuple[int, ...], str]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    input_names: list[str] = field(default_factory=list)  # model inputs, in the model's order
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    next_handle: int = 0

    def new_handle(self) -> int:
        h = self.next_handle
        self.next_handle += 1
        return h

    def constant_key(self, value, shape, dtype) -> str:
        if isinstance(value, TensorValue):
            key = f"t:{value._key[2][:20]}:{dtype}"
        else:
            key = f"s:{value!r}:{dtype}"
        self.constants.setdefault(key, (value, tuple(shape), dtype))
        return key

    @classmethod
    def for_graph(cls, graph: Graph) -> "Context":
        ctx = cls()
        ctx.add_graph_leaves(graph)
        ctx.input_names = graph.input_names()
        ctx.weights = dict(graph.weights)
        return ctx

    def add_graph_leaves(self, graph: Graph) -> None:
        for n in graph.nodes:
            if n.op == Op.Input:
                self.roles[n.attrs["name"]] = n.attrs["role"]


# --- IR op + attrs -> egglog text ----------------------------------------------------------

def _scalar_ctor(value, dtype) -> tuple[str, Any] | None:
    """Which literal constructor holds this scalar Constant, or None for an opaque Const."""
    if isinstance(value, (bool, np.bool_)):
        return "ScalarI", int(bool(value))
    if isinstance(value, (int, np.integer)):
        return "ScalarI", int(value)
    if isinstance(value, float) and math.isfinite(value) and not (value == 0.0 and math.copysign(1.0, value) < 0):
        return "ScalarF", value
    return None


def constant_attrs(attrs: Mapping[str, Any], ctx: Context) -> Attrs:
    """The attrs a Constant has after a trip through the e-graph (what the Decoder returns)."""
    shape, dtype = tuple(attrs["shape"]), attrs["dtype"]
    lit = None if shape else _scalar_ctor(attrs["value"], dtype)
    if lit is None:
        value = ctx.constants[ctx.constant_key(attrs["value"], shape, dtype)][0]
    elif lit[0] == "ScalarF":
        value = float(lit[1])
    else:
        value = bool(lit[1]) if dtype == "bool" else int(lit[1])
    return Attrs({"value": value, "shape": shape, "dtype": dtype})


def encode_op(op: str, attrs: Mapping[str, Any], children: Sequence[str], ctx: Context) -> str:
    """egglog text of one node whose children are already egglog expressions."""
    if op == Op.Constant:
        shape, dtype = tuple(attrs["shape"]), attrs["dtype"]
        lit = None if shape else _scalar_ctor(attrs["value"], dtype)
        if lit is None:
            key = ctx.constant_key(attrs["value"], shape, dtype)
            return f"(Const {lit_str(key)} {lit_vec(shape)} {lit_str(dtype)})"
        ctor, v = lit
        return f"({ctor} {lit_f64(v) if ctor == 'ScalarF' else int(v)} {lit_str(dtype)})"
    try:
        sig = SIGS[ctor_for(op, len(children))]
    except KeyError:
        raise IRError(f"op {op!r} with {len(children)} inputs has no e-graph constructor; the schema is "
                      "generated from egraft.ir.OPS (see egraft/rewrites/schema.py)") from None
    parts = [sig.ctor, *children]
    for name, sort in sig.attrs:
        parts.append(LITERAL[sort](attrs[name]))
    return "(" + " ".join(parts) + ")"


def encode_term(t: Term, ref: Callable[[int], str], ctx: Context) -> str:
    """egglog text of a procedural rule's Term; ``ref`` names a class id as an expression."""
    kids = [encode_term(c, ref, ctx) if isinstance(c, Term) else ref(c) for c in t.children]
    return encode_op(t.op, t.attrs, kids, ctx)


def handle(h: int) -> str:
    return f"({HANDLE} {int(h)})"


def encode_graph(graph: Graph, ctx: Context, rename: Mapping[str, str] | None = None,
                 bind: Mapping[int, str] | None = None) -> tuple[str, list[int]]:
    """egglog commands that add `graph` to an e-graph; returns (text, handle per node).

    Every node i becomes ``(union (H h_i) term_i)`` so Python can name its
    e-class later.  `rename` maps input names (used when one saturated
    segment is instantiated for another layer); `bind` maps node ids to an
    egglog expression that replaces them (the segment's placeholder input).
    """
    rename = rename or {}
    bind = bind or {}
    lines, hs = [], []
    for i, n in enumerate(graph.nodes):
        h = ctx.new_handle()
        hs.append(h)
        if i in bind:
            lines.append(f"(union {handle(h)} {bind[i]})")
            continue
        if n.op == Op.Input:
            name = rename.get(n.attrs["name"], n.attrs["name"])
            term = f"(Input {lit_str(name)} {lit_vec(n.shape)} {lit_str(n.dtype)})"
        else:
            term = encode_op(n.op, n.attrs, [handle(hs[j]) for j in n.inputs], ctx)
        lines.append(f"(union {handle(h)} {term})")
    return "\n".join(lines), hs


# --- egglog row -> IR op + attrs ----------------------------------------------------------------

def input_attrs(name: str, shape, dtype: str, role: str) -> Attrs:
    """An Input's attrs as the decoder returns them (its role comes from the Context)."""
    return Attrs({"name": name, "shape": tuple(int(x) for x in shape), "dtype": dtype, "role": role})


class Decoder:
    """Decodes frozen e-graph rows into (IR op, Attrs, child class values), with caches."""

    def __init__(self, egraph, ctx: Context):
        self.eg, self.ctx = egraph, ctx
        self._cache: dict[tuple[str, Any], Any] = {}
        self._read = {I64: egraph.value_to_i64, F64: egraph.value_to_f64, STR: egraph.value_to_string,
                      BOOL: egraph.value_to_bool,
                      VEC: lambda v: tuple(egraph.value_to_i64(x) for x in egraph.value_to_vec(v))}

    def prim(self, sort: str, v):
        key = (sort, v)
        hit = self._cache.get(key)
        if hit is not None or key in self._cache:
            return hit
        out = self._cache[key] = self._read[sort](v)
        return out

    def row(self, ctor: str, inputs: Sequence[Any]) -> tuple[str, Attrs, tuple[Any, ...]]:
        sig = SIGS[ctor]
        kids = tuple(inputs[: sig.children])
        vals = {name: self.prim(sort, v) for (name, sort), v in zip(sig.attrs, inputs[sig.children:])}
        if ctor == Op.Input:
            name = vals["name"]
            return "Input", input_attrs(name, vals["shape"], vals["dtype"], self.ctx.roles.get(name, "input")), kids
        if ctor == "Const":
            value, shape, dtype = self.ctx.constants[vals["key"]]
            return "Constant", Attrs({"value": value, "shape": shape, "dtype": dtype}), kids
        if ctor in ("ScalarF", "ScalarI"):
            dt = vals["dtype"]
            v = vals["value"]
            v = float(v) if ctor == "ScalarF" else (bool(v) if dt == "bool" else int(v))
            return "Constant", Attrs({"value": v, "shape": (), "dtype": dt}), kids
        return sig.op, Attrs(vals), kids
