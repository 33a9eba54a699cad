"""View rules: compose, cancel, push through elementwise ops, reduce over a broadcast axis.

Views are one general constructor ``(View x shape strides offset)`` (see
encode.py), so view algebra is done by ``shapes.compose_views`` in procedural
rules: two stacked views become one when the composition is strided, and a
view equal to the identity is its input (that is how inverse permutes and
reshapes cancel).  Moving a view through an elementwise op only moves its
attributes, so those are plain egglog rewrites, in both directions.
"""

from __future__ import annotations

from ..ir import shapes
from ..ir.builder import GraphBuilder, Tensor
from .encode import RuleSpec, T, Witness, scalar
from .witnesses import pair, rand_shape

FAMILY = "views"
_ELEMENTWISE_UNARY = ("Exp2", "Log2", "Sin", "Sqrt", "Recip")


def _norm(shape, strides):
    return tuple(0 if n == 1 else s for n, s in zip(shape, strides))


def view_term(x, shape, strides, offset):
    shape = tuple(int(n) for n in shape)
    return T("View", x, shape=shape, strides=_norm(shape, strides), offset=int(offset))


def _view_attrs(n):
    return n.attrs["shape"], n.attrs["strides"], n.attrs["offset"]


# -- procedural rules ------------------------------------------------------------------

def compose(snap):
    """View(View(x)) -> View(x) when strided; -> x when the composition is the identity."""
    for v in snap.by_op("View"):
        for u in snap.nodes_of(v.children[0], "View"):
            src = u.children[0]
            comp = shapes.compose_views(snap.shape[src], _view_attrs(u), _view_attrs(v))
            if comp is None:
                continue
            shape, strides, off = comp
            strides = _norm(shape, strides)
            if shapes.is_identity_view(snap.shape[src], shape, strides, off):
                yield v.cls, src
            else:
                yield v.cls, view_term(src, shape, strides, off)


def identity(snap):
    """A view that reads its input unchanged is its input."""
    for v in snap.by_op("View"):
        x = v.children[0]
        if shapes.is_identity_view(snap.shape[x], *_view_attrs(v)):
            yield v.cls, x


def _drop(seq, ax):
    return tuple(seq[:ax]) + tuple(seq[ax + 1:])


def reduce_broadcast(snap):
    """sum over a stride-0 axis = n * (view without it); max over it = the view without it."""
    for op in ("SumReduce", "MaxReduce"):
        for r in snap.by_op(op):
            ax = r.attrs["axis"]
            for u in snap.nodes_of(r.children[0], "View"):
                shape, strides, off = _view_attrs(u)
                if strides[ax] != 0:
                    continue
                inner = view_term(u.children[0], _drop(shape, ax), _drop(strides, ax), off)
                if op == "MaxReduce":
                    yield r.cls, inner
                    continue
                dt = snap.dtype[r.cls]
                n = shape[ax]
                c = float(n) if dt.startswith(("float", "bfloat")) else int(n)
                yield r.cls, T("Mul", inner, scalar(c, dt, _drop(shape, ax)))


# -- egglog rules ------------------------------------------------------------------------

PUSH_UNARY = "\n".join(f"(rewrite (View ({op} a) s st o) ({op} (View a s st o)))" for op in _ELEMENTWISE_UNARY) + \
    "\n(rewrite (View (Cast a d) s st o) (Cast (View a s st o) d))"
PUSH_BINARY = "\n".join(
    f"(rewrite (View ({op} a b) s st o) ({op} (View a s st o) (View b s st o)))" for op in ("Add", "Mul", "Mod", "LessThan")
) + "\n(rewrite (View (Where c a b) s st o) (Where (View c s st o) (View a s st o) (View b s st o)))"
PULL_BINARY = "\n".join(
    f"(rule ((= e ({op} (View a s st o) (View b s st o))) (= sh (shape a)) (= sh (shape b)))"
    f" ((union e (View ({op} a b) s st o))))" for op in ("Add", "Mul", "Mod", "LessThan")
)
PULL_UNARY = "\n".join(f"(rewrite ({op} (View a s st o)) (View ({op} a) s st o))" for op in _ELEMENTWISE_UNARY)


# -- witnesses ---------------------------------------------------------------------------------

def _raw_view(t: Tensor, shape, strides, offset=0) -> Tensor:
    """A View node added as is (the builder would fold it into its input's view)."""
    return t.b.add("View", (t,), shape=tuple(shape), strides=tuple(strides), offset=offset)


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


def _w_push_unary(rng):
    s = rand_shape(rng, 2, lo=2)  # a [1, 1] transpose is no view
    return pair(lambda x: x.exp2().T, lambda x: x.T.exp2(), s)


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


RULES = [
    RuleSpec("views.compose", FAMILY, apply=compose, witness=_w_compose,
             doc="View(View(x)) = one View when strided; identity compositions cancel"),
    RuleSpec("views.identity", FAMILY, apply=identity, witness=_w_identity, doc="an identity view is its input"),
    RuleSpec("views.push-unary", FAMILY, PUSH_UNARY, witness=_w_push_unary, doc="view(f(a)) = f(view(a))"),
    RuleSpec("views.push-binary", FAMILY, PUSH_BINARY, witness=_w_push_binary,
             doc="view(a op b) = view(a) op view(b); also Where"),
    RuleSpec("views.pull-binary", FAMILY, PULL_BINARY, witness=_w_pull_binary,
             doc="view(a) op view(b) = view(a op b) for equal views of equal shapes"),
    RuleSpec("views.pull-unary", FAMILY, PULL_UNARY, witness=_w_pull_unary, doc="f(view(a)) = view(f(a))"),
    RuleSpec("views.reduce-broadcast", FAMILY, apply=reduce_broadcast, witness=_w_reduce_broadcast,
             doc="sum over a stride-0 axis = n * x; max over it = x"),
]
