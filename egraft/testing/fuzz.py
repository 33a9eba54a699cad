"""A seeded random program generator over every primitive, views and idioms.

``random_program(seed, max_nodes=...)`` returns a valid ``ir.Graph`` with
float inputs (and an int index path for ``Gather``/``Scatter``/``Mod``/``Nibble``), small
shapes and values kept moderate: every op whose domain or range is dangerous gets a
guarded operand (``Log2``/``Sqrt``/``Recip`` see ``x*x + 1``-style positive
values, ``Exp2`` sees a clamped one), and ``Mod``/float->int ``Cast`` only
touch integers, so that rewrites that reassociate floating-point arithmetic
stay within 1e-9 relative in float64.  Used by the equivalence fuzzer and
available to backend tests.

The op choices are taken from ``ir.Group`` (unary ops, reductions, row idioms
and attention), so over a few hundred seeds every op of ``Group.ALL``
appears -- Attention with and without a bias, causal or not
(``tests/rewrites/test_fuzz.py::test_generator_covers_every_op``).  With
``idioms=False`` each idiom is written in its primitive form
(``ir.idiom_forms``).
"""

from __future__ import annotations

import numpy as np

from ..ir import Group
from ..ir.builder import GraphBuilder, Tensor
from ..ir.graph import Graph
from ..ir.idiom_forms import DECOMPOSITIONS
from ..ir.idioms import IDIOMS


def _pos(t: Tensor) -> Tensor:
    return t * t + 1.0


# The op choices come from the op table's groups, so a new op of a group is generated with no edit here.
UNARY_OPS = sorted(Group.UNARY)  # every unary primitive of the op table, a new one included
REDUCE_OPS = sorted(Group.REDUCE)
# the idiom family: every row idiom (axis [, eps]) and attention (with/without bias, causal or not)
IDIOM_OPS = sorted(Group.ROW_IDIOM | Group.ATTENTION)
# where an op's domain is limited, the argument it gets; the rest take the value as it is
_UNARY_DOMAIN = {"Exp2": lambda t: t.minimum(2.0).maximum(-4.0), "Log2": _pos, "Sqrt": _pos, "Recip": _pos}


class _Gen:
    def __init__(self, seed: int, max_nodes: int, idioms: bool):
        self.rng = np.random.default_rng(seed)
        self.builder = GraphBuilder()
        self.max_nodes = max_nodes
        self.idioms = idioms
        self.pool: list[Tensor] = []

    # -- helpers --------------------------------------------------------------------
    def dim(self) -> int:
        return int(self.rng.integers(1, 5))

    def shape(self, rank=None) -> tuple[int, ...]:
        rank = int(self.rng.integers(1, 4)) if rank is None else rank
        return tuple(self.dim() for _ in range(rank))

    def pick(self, pred=None) -> Tensor | None:
        cands = [t for t in self.pool if pred is None or pred(t)]
        if not cands:
            return None
        # prefer recent values so programs are deep rather than wide
        w = np.arange(1, len(cands) + 1, dtype=float) ** 2
        return cands[int(self.rng.choice(len(cands), p=w / w.sum()))]

    def like(self, t: Tensor) -> Tensor:
        """A second operand broadcastable to t: another pool value (viewed to fit), or a new leaf."""
        r = self.rng.random()
        same = [u for u in self.pool if u.shape == t.shape and u is not t]
        if same and r < 0.5:
            return same[int(self.rng.integers(len(same)))]
        if r < 0.7:
            return float(np.round(self.rng.uniform(-2, 2), 3)) or 0.5
        if r < 0.85:
            # a lower-rank leaf that broadcasts (bias-like)
            k = int(self.rng.integers(0, t.ndim + 1))
            return self.new_leaf(t.shape[t.ndim - k:], weight=self.rng.random() < 0.5)
        return self.new_leaf(t.shape, weight=False)

    def new_leaf(self, shape, weight=False) -> Tensor:
        n = len(self.builder.nodes)
        if weight:
            return self.builder.weight(f"w{n}", (self.rng.standard_normal(shape) * 0.5).astype(np.float32))
        return self.builder.input(f"x{n}", shape, "float32")

    # -- op families --------------------------------------------------------------------
    def unary(self, t):
        op = UNARY_OPS[self.rng.integers(len(UNARY_OPS))]
        arg = _UNARY_DOMAIN.get(op, lambda x: x)(t)
        return arg.builder.add(op, (arg,))

    def binary(self, t):
        o = self.like(t)
        k = self.rng.integers(4)
        if k == 0:
            return t + o
        if k == 1:
            return t * o
        if k == 2:
            return t - o
        return Tensor.where(t < o, t, o if isinstance(o, Tensor) else t * o)

    def reduce(self, t):
        if t.ndim == 0:
            return t * 2.0
        ax = int(self.rng.integers(t.ndim))
        op = REDUCE_OPS[self.rng.integers(len(REDUCE_OPS))]
        out = self.builder.add(op, (t,), axis=ax)
        if self.rng.random() < 0.3:  # keepdim
            out = out.reshape(t.shape[:ax] + (1,) + t.shape[ax + 1:])
        return out

    def view(self, t):
        k = self.rng.integers(6)
        if t.ndim == 0:
            return t.reshape((1, 1)).expand((2, 1 + self.dim()))
        if k == 0 and t.ndim >= 2:
            return t.permute(list(self.rng.permutation(t.ndim)))
        if k == 1:
            n = int(np.prod(t.shape))
            divs = [d for d in range(1, n + 1) if n % d == 0]
            d = int(self.rng.choice(divs))
            return t.reshape((d, n // d))
        if k == 2:
            return t.unsqueeze(0).expand((self.dim(),) + t.shape)
        ax = int(self.rng.integers(t.ndim))
        n = t.shape[ax]
        if k == 3 and n > 1:
            start = int(self.rng.integers(n - 1))
            step = int(self.rng.integers(1, 3))
            return t.slice(ax, start, n, step)
        if k == 4:
            return t.flip(ax)
        return t.transpose(0, -1) if t.ndim >= 2 else t.flip(0)

    def gather(self, t):
        if t.ndim == 0:
            return t
        ax = int(self.rng.integers(t.ndim))
        n = t.shape[ax]
        k = self.dim()
        i = self.builder.iota(k, "int64")
        idx = (i * int(self.rng.integers(1, 4)) + int(self.rng.integers(0, 3))) % n
        shape = list(t.shape)
        shape[ax] = k
        idx = idx.reshape(tuple(k if d == ax else 1 for d in range(t.ndim))).expand(tuple(shape))
        return t.gather(ax, idx)

    def scatter(self, t):
        """``t`` with k <= n slots along an axis overwritten at ``(i*s + j*c2 + c) % n``, ``i`` the update
        number and ``s`` coprime to ``n`` (distinct within each line, as Scatter requires): half the time
        ``j`` is the index of another axis (each line its own shift), else 0 (one position vector
        broadcast along the other axes, a KV-cache write).  The update is a new leaf or computed from ``t``."""
        if t.ndim == 0:
            return t
        ax = int(self.rng.integers(t.ndim))
        n = t.shape[ax]
        k = int(self.rng.integers(1, n + 1))
        step = int(self.rng.choice([s for s in (1, 2, 3, 5) if np.gcd(s, n) == 1]))
        dt = "int64" if self.rng.random() < 0.5 else "int32"
        shape = list(t.shape)
        shape[ax] = k
        shape = tuple(shape)

        def along(v, d):  # a 1-D int value laid along axis d, broadcast to the index's shape
            return v.reshape(tuple(v.shape[0] if e == d else 1 for e in range(t.ndim))).expand(shape)
        idx = along(self.builder.iota(k, dt) * step, ax)
        others = [d for d in range(t.ndim) if d != ax and shape[d] > 1]
        if others and self.rng.random() < 0.5:
            d = others[int(self.rng.integers(len(others)))]
            idx = idx + along(self.builder.iota(shape[d], dt) * int(self.rng.integers(1, 4)), d)
        idx = (idx + int(self.rng.integers(0, n))) % n
        if self.rng.random() < 0.5:
            upd = self.new_leaf(tuple(shape), weight=self.rng.random() < 0.3)
        else:
            upd = t.gather(ax, idx).sin() * 2.0
        return t.scatter(ax, idx, upd)

    def int_path(self, t):
        """Float path mixed with integers: Iota, Mod, Nibble (a packed int4 field), Cast int->float."""
        n = t.shape[-1] if t.ndim else 1
        i = self.builder.iota(n, "int64")
        m = (i * 3 + 1) % int(self.rng.integers(1, 4))
        if self.rng.random() < 0.5:  # bytes -60..88 (n <= 4), the low or high field by position
            m = m + self.builder.add("Nibble", ((i * 37 - 60).cast("int8"), i.cast("int8"))).cast("int64")
        f = m.cast("float32")
        if t.ndim:
            f = f.reshape((1,) * (t.ndim - 1) + (n,)).expand(t.shape)
        return t + f if t.ndim else t + f.sum()

    def matmul(self, t):
        if t.ndim == 0:
            return t
        n = self.dim()
        w = self.new_leaf((t.shape[-1], n), weight=True)
        if self.idioms and t.ndim >= 2 and self.rng.random() < 0.5:
            a = t
            bw = w.expand(a.shape[:-2] + w.shape)
            return self.builder.add("MatMul", (a, bw))
        return t @ w

    def idiom(self, t):
        if t.ndim == 0:
            return t
        op = IDIOM_OPS[self.rng.integers(len(IDIOM_OPS))]
        if op in Group.ATTENTION:
            return self.attention(t)
        attrs = {"axis": t.ndim - 1}
        if any(a.name == "eps" for a in IDIOMS[op].attrs):
            attrs["eps"] = 1e-5 if self.rng.random() < 0.5 else 1e-6
        return self._idiom(op, (t,), attrs)

    def attention(self, q):
        """Attention over q = t (viewed to [..., Sq, D]): self-attention (k, v projected from q) or
        cross-attention (new k, v leaves); an additive bias and the causal mask each half the time."""
        if q.ndim == 1:
            q = q.unsqueeze(0)
        batch, sq, d = q.shape[:-2], q.shape[-2], q.shape[-1]
        dv = self.dim()
        if self.rng.random() < 0.5:
            k = q @ self.new_leaf((d, d), weight=True)
            v = q @ self.new_leaf((d, dv), weight=True)
        else:
            sk = self.dim()
            k = self.new_leaf(batch + (sk, d), weight=self.rng.random() < 0.5)
            v = self.new_leaf(batch + (sk, dv), weight=self.rng.random() < 0.5)
        inputs = (q, k, v)
        if self.rng.random() < 0.5:
            inputs += (self.new_leaf(batch + (sq, k.shape[-2]), weight=self.rng.random() < 0.5),)
        attrs = {"scale": float(d) ** -0.5, "causal": bool(self.rng.random() < 0.5)}
        return self._idiom("Attention", inputs, attrs)

    def _idiom(self, op, inputs, attrs):
        """The idiom node, or its primitive form (``ir.idiom_forms``) when idioms are off."""
        if self.idioms:
            return self.builder.add(op, inputs, **attrs)
        return DECOMPOSITIONS[op](*inputs, **attrs)

    def cast(self, t):
        return t.cast("float64").sin().cast("float32")

    def build(self) -> Graph:
        self.pool.append(self.new_leaf(self.shape()))
        if self.rng.random() < 0.5:
            self.pool.append(self.new_leaf(self.shape()))
        families = [self.unary, self.binary, self.binary, self.reduce, self.view, self.view,
                    self.gather, self.scatter, self.int_path, self.matmul, self.idiom, self.cast]
        while len(self.builder.nodes) < self.max_nodes:
            t = self.pick()
            f = families[int(self.rng.integers(len(families)))]
            out = f(t)
            if out.ndim > 4 or int(np.prod(out.shape)) > 256:
                out = out.sum(0)
            self.pool.append(out)
        outs = [self.pool[-1]]
        if len(self.pool) > 3 and self.rng.random() < 0.5:
            outs.append(self.pool[int(self.rng.integers(1, len(self.pool) - 1))])
        return self.builder.build(outs)


def random_program(seed: int, max_nodes: int = 24, idioms: bool = True) -> Graph:
    """A random valid program (deterministic in `seed`) of about `max_nodes` nodes."""
    return _Gen(int(seed), int(max_nodes), idioms).build()
