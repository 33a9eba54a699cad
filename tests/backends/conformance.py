"""The backend conformance cases, written once and run on every backend by ``test_conformance.py``.

A :class:`Case` is a name, a function building an ``ir.Graph``, and how to
draw its inputs (random, never all zero; some inputs need a domain: positive,
a non-zero divisor, an index range).  Op lists come from ``egraft.ir.Group``
and the op table: a new unary primitive gets its cases here without an edit
(only an input domain, if it is not defined on every float).  Shapes stay
tiny - the Triton cases run in Triton's interpreter on the CPU.

The primitive cases are here; the idiom cases in ``conformance_idioms.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from egraft.errors import IRError
from egraft.ir import GraphBuilder, Group, Tensor, cat, dtypes
from egraft.ir.graph import Graph
from egraft.testing import random_array
from egraft.measure.inputs import distinct_index

FLOATS = ("float32", "float16", "bfloat16")
NUMERIC = ("float32", "float16", "int32", "int64")
SHAPES = [(7,), (3, 5), (2, 3, 33)]

# input domain per op where the op is not defined (or not well conditioned) on every value
DOMAIN = {"Log2": "positive", "Sqrt": "positive", "Recip": "positive", "Mod": "divisor", "Nibble": "bytes"}
OWN_DTYPES = {"Nibble": ("int8",)}  # binary ops defined on other dtypes than NUMERIC + bool


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], Graph]
    domains: Mapping[str, object] = field(default_factory=dict)  # input name -> domain (see draw)
    tol: float | None = None

    def graph(self) -> Graph:
        return self.build()

    def inputs(self, graph: Graph, rng: np.random.Generator) -> list[np.ndarray]:
        return [draw(shape, dt, rng, self.domains.get(name))
                for name, (shape, dt) in zip(graph.input_names(), graph.input_types())]


@dataclass(frozen=True)
class Distinct:
    """Scatter indices: values in [0, n), distinct along `axis` within each line (None: over the whole array)."""

    n: int
    axis: int | None


def draw(shape, dt: str, rng: np.random.Generator, domain=None) -> np.ndarray:
    """A random input: ``positive`` (|x| + 0.5), ``divisor`` (both signs, away from 0), ``bytes`` (ints over
    the whole int8 range), ``wide``
    (floats x7 with a +0 and -0, ints in [-50, 50)), an int n (indices in [0, n)), a :class:`Distinct`
    (scatter indices), or None."""
    npdt = dtypes.to_numpy(dt)
    if isinstance(domain, Distinct):
        return distinct_index(shape, dt, rng, domain.n, domain.axis)
    if isinstance(domain, int):
        return rng.integers(0, domain, size=shape).astype(npdt)
    if domain == "bytes":
        return rng.integers(-128, 128, size=shape).astype(npdt)
    a = random_array(shape, dt, rng)
    if domain == "positive":
        return (np.abs(a.astype(np.float32)) + 0.5).astype(npdt)
    if domain == "divisor":
        sign = rng.choice([-1, 1], size=shape)
        mag = rng.uniform(0.5, 3, size=shape) if dtypes.is_float(dt) else rng.integers(1, 7, size=shape)
        return (sign * mag).astype(npdt)
    if domain == "wide":
        if dtypes.is_float(dt):
            a = (a.astype(np.float32) * 7).astype(npdt)
            a.flat[:2] = [0.0, -0.0][:a.size]
            return a
        if dtypes.is_int(dt):
            return rng.integers(-50, 50, size=shape).astype(npdt)
    return a


def builds(op: str, ts, **attrs) -> bool:
    """Whether the op table accepts `op` on these operands (e.g. Mod on bool does not)."""
    try:
        ts[0].builder.add(op, ts, **attrs)
    except IRError:
        return False
    return True


def graph_of(fn: Callable[[GraphBuilder], list]) -> Callable[[], Graph]:
    def build():
        b = GraphBuilder()
        return b.build(fn(b))
    return build


# --- elementwise primitives -------------------------------------------------------------------
def _unary_cases():
    for op in sorted(Group.UNARY):
        for dt in FLOATS:
            def fn(b, op=op, dt=dt):
                return [b.add(op, (b.input(f"x{k}", s, dt),)) for k, s in enumerate(SHAPES)]
            dom = {f"x{k}": DOMAIN.get(op) for k in range(len(SHAPES))}
            yield Case(f"unary_{op}_{dt}", graph_of(fn), dom)


def _binary_cases():
    for op in sorted(Group.BINARY):
        for dt in OWN_DTYPES.get(op, NUMERIC + ("bool",)):
            probe = GraphBuilder()
            x = probe.input("x", (2,), dt)
            if not builds(op, (x, x)):
                continue

            def fn(b, op=op, dt=dt):
                outs = [b.add(op, (b.input(f"x{k}", s, dt), b.input(f"y{k}", s, dt))) for k, s in enumerate(SHAPES)]
                xb = b.input("xb", (3, 1, 6), dt).expand((3, 4, 6))  # broadcast: stride-0 views of both
                yb = b.input("yb", (4, 6), dt).expand((3, 4, 6))
                return outs + [b.add(op, (xb, yb))]
            names = [f"x{k}" for k in range(len(SHAPES))] + ["xb"]
            dom = {}
            if DOMAIN.get(op) == "divisor":  # a wide dividend, a non-zero divisor of either sign
                dom = {**{n: "wide" for n in names}, **{"y" + n[1:]: "divisor" for n in names}}
            elif DOMAIN.get(op):
                dom = {p + n[1:]: DOMAIN[op] for n in names for p in "xy"}
            yield Case(f"binary_{op}_{dt}", graph_of(fn), dom)


def _binary_broadcast(b, dt):
    x = b.input("x", (3, 1, 6), dt)
    y = b.input("y", (4, 6), dt)
    z = x + y
    return [z, x * y, x < y, (z * 2) + 1]


def _mod_mixed(b):
    a = b.input("a", (4, 9), "int64")
    d = b.input("d", (4, 9), "int64")
    f = b.input("f", (4, 9), "float32")
    return [a % d, f % 0.75, (-f) % 0.75]


def _bool_logic(b):
    p = b.input("p", (6, 5), "bool")
    q = b.input("q", (5,), "bool")
    x = b.input("x", (6, 5), "float32")
    return [p | q, p & q, b.add("LessThan", (p, q.expand((6, 5)))), Tensor.where(p & q, x, -x), ~p]


def _where(b, dt):
    c = b.input("c", (3, 1), "bool")
    x = b.input("x", (1, 5), dt)
    y = b.input("y", (3, 5), dt)
    outs = [Tensor.where(c, x, y)]  # c and x are broadcast with stride-0 views
    if dtypes.is_float(dt):
        z = b.input("z", (4, 8), dt)
        c2 = b.input("c2", (1, 8), "bool")
        outs += [Tensor.where(c2, z, float("-inf")), Tensor.where(z > 0, z, 0.0)]
    return outs


CAST_PAIRS = [("float32", "int32"), ("float32", "int64"), ("float32", "bool"), ("int64", "float32"),
              ("bool", "float32"), ("float32", "float16"), ("float16", "float32"), ("float32", "bfloat16"),
              ("int32", "int64"), ("int64", "bool"), ("bool", "int64")]


def _cast(b, src, dst):
    x = b.input("x", (3, 10), src)
    outs = [x.cast(dst)]
    if src != "bool":
        outs.append((x * 3).cast(dst))  # a computed operand
    return outs


def _iota(b, dt):
    x = b.input("x", (6,), dt)
    return [b.iota(6, dt) + x, b.iota(1, dt)]


def _iota_and_scalar_constants(b):
    x = b.input("x", (4, 6), "float32")
    i = b.iota(6, "int64")
    j = b.iota(4, "float32")
    return [x + i.cast("float32"), i * 3, j.reshape((4, 1)) * x, b.constant(2.5, "float32", (2, 3)) + 0.0,
            b.constant(True, "bool", (2,)), b.constant(7, "int64")]


def _tensor_constants(b):
    rng = np.random.default_rng(7)
    x = b.input("x", (3, 4), "float32")
    t = b.tensor_constant(random_array((3, 4), "float32", rng))
    k = b.tensor_constant(np.array([[1, -2, 3, 4]], dtype=np.int64))
    return [x * 2.5 + t + k.cast("float32").expand((3, 4)), x * t + t.sum(1, keepdim=True)]


GATHER_FORMS = [((5,), (8,), 0), ((4, 6), (4, 3), 1), ((4, 6), (9, 6), 0), ((2, 3, 4), (2, 5, 4), 1)]


def _gather(b, idt):
    outs = []
    for k, (xs, ish, axis) in enumerate(GATHER_FORMS):
        outs.append(b.add("Gather", (b.input(f"x{k}", xs, "float32"), b.input(f"i{k}", ish, idt)), axis=axis))
    return outs


def _gather_computed_and_index_select(b):
    x = b.input("x", (5, 7), "float32")
    idx = b.input("idx", (5, 3), "int64")
    e = b.input("e", (4,), "int32")
    table = b.input("table", (10, 6), "float32")
    w = b.weight("w", random_array((11, 6), "float32", np.random.default_rng(3)))
    ids = b.input("ids", (2, 5), "int64")
    return [x.gather(1, idx), (x * 2).gather(1, idx) + 1.0, table.index_select(0, e), w.index_select(0, ids)]


# (target shape, index/update shape, axis): a partial line, a full permutation, a middle axis, a long line
SCATTER_FORMS = [((7,), (4,), 0), ((4, 6), (4, 3), 1), ((5, 3), (5, 3), 0), ((2, 5, 4), (2, 2, 4), 1),
                 ((3, 40), (3, 33), 1)]


def _scatter(b, idt):
    return [b.input(f"x{k}", xs, "float32").scatter(ax, b.input(f"i{k}", us, idt), b.input(f"u{k}", us, "float32"))
            for k, (xs, us, ax) in enumerate(SCATTER_FORMS)]


def _scatter_dtypes(b):
    """Scatter moves values of every dtype unchanged: half types, ints and bools."""
    outs = []
    for k, dt in enumerate(("float16", "bfloat16", "int32", "int64", "bool")):
        x, u = b.input(f"x{k}", (3, 6), dt), b.input(f"u{k}", (3, 4), dt)
        outs.append(x.scatter(1, b.input(f"i{k}", (3, 4), "int64"), u))
    return outs


def _kv_cache(b, idt):
    """The KV-cache write: cache [B, H, S, D], positions [T] broadcast through a View to [B, H, T, D], axis 2;
    the new cache, an attention-style read of it, and the written rows read back by a Gather."""
    cache = b.input("cache", (2, 3, 8, 4), "float32")
    pos = b.input("pos", (3,), idt)
    new = b.input("new", (2, 3, 3, 4), "float32")
    idx = pos.reshape((1, 1, 3, 1)).expand((2, 3, 3, 4))
    out = cache.scatter(2, idx, new)
    return [out, (out * 0.5).sum(2), out.gather(2, idx) - new * 2.0]


def _scatter_computed(b):
    """Computed target, index and update inlined into the Scatter's kernel, its result consumed by others."""
    x = b.input("x", (4, 9), "float32")
    p = b.input("p", (4, 5), "int32")
    u = b.input("u", (4, 5), "float32")
    s = (x * 2.0 + 1.0).scatter(1, p.cast("int64"), u.sin() * 3.0)
    s2 = s.scatter(1, p, -u)  # a Scatter of a Scatter (write after write to the same indices)
    return [s.exp2() + x, s.sum(1), s2, s2.gather(1, p) + u]


def _pad_and_cat(b):
    x = b.input("x", (3, 5), "float32")
    y = b.input("y", (3, 2), "float32")
    return [x.pad(1, 2, 1, value=-1.0), cat([x, y * 2.0, x], axis=1), cat([x, x], axis=0)]


# --- views --------------------------------------------------------------------------------------
def _views_of_inputs(b):
    x = b.input("x", (4, 6, 5), "float32")
    return [
        x.permute((2, 0, 1)),
        x.flip(1),  # negative stride, positive offset
        x.slice(2, 1, 5, 2).slice(0, 3, 0, -1),  # step slices, negative step
        x.select(1, 3),
        x.reshape((24, 5)).T,
        x.slice(1, 2, 3).expand((4, 3, 5)),  # broadcast: stride 0
    ]


def _views_of_computed(b):
    x = b.input("x", (4, 6), "float32")
    y = (x * 2.0).exp2()  # computed: views of it are index arithmetic inside the consumer
    return [
        y.T + 1.0,
        y.flip(0).flip(1) * x,
        y.reshape((2, 2, 6)).permute((2, 1, 0)).reshape((6, 4)) + 0.0,  # merging reshape: divmod path
        y.reshape((24,)).slice(0, 3, 20, 4) * 1.0,
        b.view(y, (3, 2), (-6, 2), 19) + 0.0,  # hand-written negative-stride view with offset
    ]


# --- reductions ---------------------------------------------------------------------------------
REDUCE_SHAPES = [(7,), (3, 5), (3, 5, 7)]


def _reduce_cases():
    for op in sorted(Group.REDUCE):
        for dt in NUMERIC:
            def fn(b, op=op, dt=dt):
                outs = []
                for k, s in enumerate(REDUCE_SHAPES):
                    x = b.input(f"x{k}", s, dt)
                    outs += [b.add(op, (x,), axis=ax) for ax in range(len(s))]
                return outs
            # a float sum's rounding error is bounded relative to sum(|x|) while the check divides by |sum(x)|:
            # inputs of one sign keep the two equal (no cancellation), so the graph's derived budget applies
            one_sign = {f"x{k}": "positive" for k in range(len(REDUCE_SHAPES))} \
                if op == "SumReduce" and dtypes.is_float(dt) else {}
            yield Case(f"reduce_{op}_{dt}", graph_of(fn), one_sign)
        probe = GraphBuilder()
        if builds(op, (probe.input("p", (2,), "bool"),), axis=0):
            yield Case(f"reduce_{op}_bool", graph_of(
                lambda b, op=op: [b.add(op, (x,), axis=ax) for x in [b.input("p", (5, 4), "bool")] for ax in (1, 0)]))


def _reduce_computed(b):
    x = b.input("x", (3, 5, 7), "float32")
    return [(x * x).sum(ax) * 0.5 for ax in range(3)] + [x.sum(ax) + x.max(ax) for ax in range(3)]


def _reduce_long_and_mixed(b):
    x = b.input("x", (3, 300), "float32")
    i = b.input("i", (4, 9), "int32")
    p = b.input("p", (4, 9), "bool")
    return [x.sum(1), x.max(1), i.sum(0), i.max(1), p.any(1), b.add("MaxReduce", (p,), axis=0)]


def _reduce_all_and_keepdim(b):
    x = b.input("x", (6, 10), "float32")
    return [x.sum(), x.mean(1, keepdim=True) - 1.0, x.var(1), x.argmax(1), x.logsumexp(1)]


def primitive_cases() -> list[Case]:
    cases = [*_unary_cases(), *_binary_cases()]
    cases += [Case(f"binary_broadcast_mix_{dt}", graph_of(lambda b, dt=dt: _binary_broadcast(b, dt)))
              for dt in ("float32", "int64", "int32")]
    cases.append(Case("mod_mixed", graph_of(_mod_mixed), {"a": "wide", "d": "divisor", "f": "wide"}))
    cases.append(Case("bool_logic", graph_of(_bool_logic)))
    cases += [Case(f"where_{dt}", graph_of(lambda b, dt=dt: _where(b, dt))) for dt in ("float32", "int64", "float16")]
    cases += [Case(f"cast_{s}_{d}", graph_of(lambda b, s=s, d=d: _cast(b, s, d)), {"x": "wide"}) for s, d in CAST_PAIRS]
    cases += [Case(f"iota_{dt}", graph_of(lambda b, dt=dt: _iota(b, dt))) for dt in ("int32", "int64", "float32")]
    cases.append(Case("iota_and_scalar_constants", graph_of(_iota_and_scalar_constants)))
    cases.append(Case("tensor_constants", graph_of(_tensor_constants)))
    cases += [Case(f"gather_{idt}", graph_of(lambda b, idt=idt: _gather(b, idt)),
                   {f"i{k}": xs[ax] for k, (xs, _, ax) in enumerate(GATHER_FORMS)}) for idt in ("int32", "int64")]
    cases.append(Case("gather_computed_and_index_select", graph_of(_gather_computed_and_index_select),
                      {"idx": 7, "e": 10, "ids": 11}))
    cases += [Case(f"scatter_{idt}", graph_of(lambda b, idt=idt: _scatter(b, idt)),
                   {f"i{k}": Distinct(xs[ax], ax) for k, (xs, _, ax) in enumerate(SCATTER_FORMS)})
              for idt in ("int32", "int64")]
    cases.append(Case("scatter_dtypes", graph_of(_scatter_dtypes), {f"i{k}": Distinct(6, 1) for k in range(5)}))
    cases += [Case(f"scatter_kv_cache_{idt}", graph_of(lambda b, idt=idt: _kv_cache(b, idt)), {"pos": Distinct(8, 0)})
              for idt in ("int32", "int64")]
    cases.append(Case("scatter_computed", graph_of(_scatter_computed), {"p": Distinct(9, 1)}))
    cases.append(Case("pad_and_cat", graph_of(_pad_and_cat)))
    cases.append(Case("views_of_inputs", graph_of(_views_of_inputs)))
    cases.append(Case("views_of_computed", graph_of(_views_of_computed)))
    cases += list(_reduce_cases())
    cases.append(Case("reduce_computed", graph_of(_reduce_computed)))
    # the float sums of these two draw one-sign inputs, as the reduce cases do (see _reduce_cases)
    cases.append(Case("reduce_long_and_mixed", graph_of(_reduce_long_and_mixed), {"x": "positive"}))
    cases.append(Case("reduce_all_and_keepdim", graph_of(_reduce_all_and_keepdim), {"x": "positive"}))
    return cases


def all_cases() -> list[Case]:
    from conformance_idioms import idiom_cases

    cases = primitive_cases() + idiom_cases()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), "conformance case names must be unique"
    return cases


def case(name: str) -> Case:
    """One case by name (backend-specific tests reuse the conformance graphs)."""
    for c in all_cases():
        if c.name == name:
            return c
    raise KeyError(name)
