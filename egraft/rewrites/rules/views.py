"""View rules: compose, cancel, push through elementwise ops, reduce over a broadcast axis.

Views are one general constructor ``(View x shape strides offset)`` (see
:mod:`egraft.rewrites.schema`; no separate reshape/permute/...), so view
algebra is done by ``strided.compose_views`` in procedural rules: two stacked
views become one when the composition is strided, and a view equal to the
identity is its input (that is how inverse permutes and reshapes cancel).
Moving a view through an elementwise op only moves its attributes, so those
are plain egglog rewrites, in both directions, generated for every op of
``Group.ELEMENTWISE`` (push) and ``Group.UNARY`` / ``Group.BINARY`` (pull).
"""

from __future__ import annotations

from ...ir import Op, shapes, strided
from ...ir.builder import GraphBuilder, Tensor
from ..rule import (Group, RuleSpec, Witness, arity, call, drop, norm_strides, ops_in, pair, program, rand_shape,
                    scalar, term, view_attrs, view_term)


# -- procedural rules ------------------------------------------------------------------

def compose(snap):
    """View(View(x)) -> View(x) when strided; -> x when the composition is the identity."""
    for v in snap.by_op("View"):
        for u in snap.nodes_of(v.children[0], "View"):
            src = u.children[0]
            comp = strided.compose_views(snap.shape[src], view_attrs(u), view_attrs(v))
            if comp is None:
                continue
            shape, strides, off = comp
            strides = norm_strides(shape, strides)
            if shapes.is_identity_view(snap.shape[src], shape, strides, off):
                yield v.cls, src
            else:
                yield v.cls, view_term(src, shape, strides, off)


def identity(snap):
    """A view that reads its input unchanged is its input."""
    for v in snap.by_op("View"):
        x = v.children[0]
        if shapes.is_identity_view(snap.shape[x], *view_attrs(v)):
            yield v.cls, x


def reduce_broadcast(snap):
    """sum over a stride-0 axis = n * (view without it); max over it = the view without it."""
    for op in ("SumReduce", "MaxReduce"):  # named, not Group.REDUCE: each has its own right side
        for r in snap.by_op(op):
            ax = r.attrs["axis"]
            for u in snap.nodes_of(r.children[0], "View"):
                shape, strides, off = view_attrs(u)
                if strides[ax] != 0:
                    continue
                inner = view_term(u.children[0], drop(shape, ax), drop(strides, ax), off)
                if op == Op.MaxReduce:
                    yield r.cls, inner
                    continue
                dt = snap.dtype[r.cls]
                n = shape[ax]
                c = float(n) if dt.startswith(("float", "bfloat")) else int(n)
                yield r.cls, term("Mul", inner, scalar(c, dt, drop(shape, ax)))


# -- egglog rules ------------------------------------------------------------------------

_MAP = [op for op in ops_in(Group.ELEMENTWISE) if arity(op) == 1]  # f(a): unary ops and casts
_ZIP = [op for op in ops_in(Group.ELEMENTWISE) if arity(op) > 1]  # f(a, b, ..): binary ops and Where
_KIDS = "abc"


def _push(op: str) -> str:
    kids = _KIDS[:arity(op)]
    return f"(rewrite (View {call(op, *kids)} s st o) {call(op, *(f'(View {k} s st o)' for k in kids))})"


PUSH_UNARY = "\n".join(_push(op) for op in _MAP)
PUSH_BINARY = "\n".join(_push(op) for op in _ZIP)
PULL_BINARY = "\n".join(
    f"(rule ((= e ({op} (View a s st o) (View b s st o))) (= sh (shape a)) (= sh (shape b)))"
    f" ((union e (View ({op} a b) s st o))))" for op in ops_in(Group.BINARY)
)
PULL_UNARY = "\n".join(f"(rewrite ({op} (View a s st o)) (View ({op} a) s st o))" for op in ops_in(Group.UNARY))


# -- witnesses ---------------------------------------------------------------------------------

def _raw_view(t: Tensor, shape, strides, offset=0) -> Tensor:
    """A View node added as is (the builder would fold it into its input's view)."""
    return t.builder.add("View", (t,), shape=tuple(shape), strides=tuple(strides), offset=offset)


def _w_compose(rng):
    s = rand_shape(rng, 2, lo=2)
    b = GraphBuilder()
    x = b.input("x0", s, "float32")
    tr = _raw_view(x, (s[1], s[0]), (1, s[1]))
    back = _raw_view(tr, s, (1, s[0]))  # transpose of the transpose
    sl = _raw_view(tr, (s[1], s[0] - 1), (s[0], 1), 1)  # a slice of the transpose
    return Witness(b.build([back.sin(), sl * 2.0]))


def _w_identity(rng):
    s = rand_shape(rng, 2)
    b = GraphBuilder()
    x = b.input("x0", s, "float32")
    y = _raw_view(x.sin(), s, shapes.contiguous_strides(s))
    return Witness(b.build([y * 3.0]))


def _w_push_binary(rng):
    s = rand_shape(rng, 2, lo=2)  # a [1, 1] transpose is no view
    return pair(lambda x, y: (x * y).T.sin(), lambda x, y: (x.T * y.T).sin(), s, s)


def _w_pull_binary(rng):
    s = rand_shape(rng, 2, lo=2)  # a [1, 1] transpose is no view
    return pair(lambda x, y: x.T + y.T, lambda x, y: (x + y).T, s, s)


def _w_pull_unary(rng):
    s = rand_shape(rng, 2, lo=2)  # a [1, 1] transpose is no view
    return pair(lambda x: x.T.sin(), lambda x: x.sin().T, s)


def _w_reduce_broadcast(rng):
    a, n, c = rand_shape(rng, 3, lo=2)
    return pair(lambda x: x.unsqueeze(1).expand((a, n, c)).sum(1) + x.unsqueeze(1).expand((a, n, c)).max(1),
                lambda x: x * float(n) + x, (a, c))


def _pos(t):
    return t * t + 0.5


def _apply(op: str, *xs: Tensor) -> Tensor:
    """`op` of the inputs, through the builder's own spelling (positive inputs for log2/sqrt/recip)."""
    if op == Op.Cast:
        return xs[0].cast("float16")
    if op == Op.Where:
        return Tensor.where(xs[0] < xs[1], xs[0], xs[1])
    if len(xs) == 1:
        return xs[0].builder.add(op, (_pos(xs[0]),))
    return xs[0].builder.add(op, xs)


OWN_DTYPE = {Op.Nibble: "int8"}  # ops defined on one dtype only: their witnesses' inputs


def _per_op(ops, build, n):
    """One witness per op (each op is one egglog command of the rule)."""
    def make(op):
        def wit(rng):
            s = rand_shape(rng, 2, lo=2)
            return Witness(program(lambda *xs: build(op, *xs), *[s] * n, dtype=OWN_DTYPE.get(op, "float32")))
        return wit
    return tuple(make(op) for op in ops)


def _w_nm_pull_binary(rng):
    """Equal view attributes over sources of different shapes: a + b would not even be typed."""
    r, c = rand_shape(rng, 2, lo=2)
    b = GraphBuilder()
    x, y = b.input("x0", (r + 1, c), "float32"), b.input("x1", (r, c), "float32")
    return Witness(b.build([_raw_view(x, (r, c), (c, 1)) + _raw_view(y, (r, c), (c, 1))]))


def _w_nm_compose(rng):
    """A flatten of a transpose: no single strided view reads it."""
    s = rand_shape(rng, 2, lo=2)
    b = GraphBuilder()
    tr = _raw_view(b.input("x0", s, "float32"), (s[1], s[0]), (1, s[1]))
    return Witness(b.build([_raw_view(tr, (s[0] * s[1],), (1,)).sin()]))


def _w_nm_identity(rng):
    s = rand_shape(rng, 2, lo=2)
    b = GraphBuilder()
    return Witness(b.build([_raw_view(b.input("x0", s, "float32"), (s[1], s[0]), (1, s[1])).sin()]))


def _w_reduce_broadcast_int(rng):
    a, n, c = rand_shape(rng, 3, lo=2)
    return Witness(program(lambda x: x.cast("int64").unsqueeze(1).expand((a, n, c)).sum(1), (a, c)))


def _w_nm_reduce(rng):
    """Reductions over a view's axis that is not broadcast (stride != 0)."""
    a, n, c = rand_shape(rng, 3, lo=2)
    return Witness(program(lambda x: x.transpose(1, 2).sum(1) + x.transpose(1, 2).max(1), (a, c, n)))


_PUSH_U = _per_op(_MAP, lambda op, x: _apply(op, x).T, 1)
_PUSH_B = _per_op(_ZIP, lambda op, x, y: _apply(op, x, y).T, 2)
_PULL_U = _per_op(ops_in(Group.UNARY), lambda op, x: x.builder.add(op, (_pos(x).T,)), 1)
_PULL_B = _per_op(ops_in(Group.BINARY), lambda op, x, y: _apply(op, x.T, y.T), 2)


RULES = [
    RuleSpec("views.compose", apply=compose, witness=_w_compose, near_misses=(_w_nm_compose,),
             doc="View(View(x)) = one View when strided; identity compositions cancel"),
    RuleSpec("views.identity", apply=identity, witness=_w_identity, near_misses=(_w_nm_identity,),
             doc="an identity view is its input"),
    RuleSpec("views.push-unary", PUSH_UNARY, witness=_PUSH_U[0], witnesses=_PUSH_U[1:],
             doc="view(f(a)) = f(view(a))"),
    RuleSpec("views.push-binary", PUSH_BINARY, witness=_w_push_binary, witnesses=_PUSH_B,
             doc="view(a op b) = view(a) op view(b); also Where"),
    RuleSpec("views.pull-binary", PULL_BINARY, witness=_w_pull_binary, witnesses=_PULL_B,
             near_misses=(_w_nm_pull_binary,), doc="view(a) op view(b) = view(a op b) for equal views of equal shapes"),
    RuleSpec("views.pull-unary", PULL_UNARY, witness=_w_pull_unary, witnesses=_PULL_U, doc="f(view(a)) = view(f(a))"),
    RuleSpec("views.reduce-broadcast", apply=reduce_broadcast, witness=_w_reduce_broadcast,
             witnesses=(_w_reduce_broadcast_int,), near_misses=(_w_nm_reduce,),
             doc="sum over a stride-0 axis = n * x; max over it = x"),
]
