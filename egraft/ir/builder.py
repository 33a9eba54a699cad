"""A terse way to write IR: ``GraphBuilder`` plus operator-overloaded ``Tensor``.

Decompositions (torch lowering rules, idiom primitive forms, rewrite right
sides) are written against this API: ``(x - x.max(-1, keepdim=True)).exp()``.
The builder broadcasts and promotes dtypes the numpy way by inserting
explicit ``View`` / ``Cast`` nodes, folds chains of views into one view
where the composition is strided, and shares identical nodes (CSE).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import IRError
from . import dtypes, shapes
from .graph import Attrs, Graph, Node, infer_node
from .ops import TensorValue

def in_float32(fn):
    """Run a composite math function on half inputs in float32 and round once at the end.

    torch computes exp/erf/gelu/softmax/norms of float16 and bfloat16 tensors in
    float32 ("opmath") and rounds the result once; rounding every step of a
    decomposition to half instead (a 20-op erf polynomial, an exp whose
    1/ln 2 constant is itself rounded to half) was measured 2% off torch's
    float16 gelu, beyond the float16 tolerance.
    """
    import functools

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if self.dtype in ("float16", "bfloat16"):
            return fn(self.cast("float32"), *args, **kwargs).cast(self.dtype)
        return fn(self, *args, **kwargs)

    return wrapper


_RANK = {"bool": 0, "int32": 1, "int64": 2, "bfloat16": 3, "float16": 3, "float32": 4, "float64": 5}


def promote(a: str, b: str) -> str:
    if a == b:
        return a
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return a if _RANK[a] >= _RANK[b] else b


class GraphBuilder:
    def __init__(self):
        self.nodes: list[Node] = []
        self._cse: dict[tuple, int] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.input_order: list[int] = []

    # -- node creation -----------------------------------------------------------
    def add(self, op: str, inputs: Sequence["Tensor"] = (), **attrs: Any) -> "Tensor":
        ids = tuple(t.id for t in inputs)
        fattrs = Attrs(attrs)
        key = (op, ids, fattrs)
        if key in self._cse and op != "Input":
            return Tensor(self, self._cse[key])
        shape, dt = infer_node(op, [(self.nodes[i].shape, self.nodes[i].dtype) for i in ids], fattrs)
        self.nodes.append(Node(op, ids, fattrs, shape, dt))
        nid = len(self.nodes) - 1
        self._cse[key] = nid
        return Tensor(self, nid)

    def input(self, name: str, shape: Sequence[int], dtype: str, role: str = "input", value=None) -> "Tensor":
        t = self.add("Input", (), name=name, shape=tuple(int(s) for s in shape), dtype=dtypes.check(dtype), role=role)
        if role == "input":
            self.input_order.append(t.id)
        if value is not None:
            self.weights[name] = np.asarray(value)
        return t

    def weight(self, name: str, value: np.ndarray) -> "Tensor":
        value = np.asarray(value)
        return self.input(name, value.shape, dtypes.from_numpy(value.dtype), role="weight", value=value)

    def constant(self, value, dtype: str, shape: Sequence[int] = ()) -> "Tensor":
        """A scalar literal broadcast (as a stride-0 view) to `shape`."""
        dt = dtypes.check(dtype)
        if dt == "bool":
            value = bool(value)
        elif dtypes.is_int(dt):
            value = int(value)
        else:
            value = float(value)
        c = self.add("Constant", (), value=value, shape=(), dtype=dt)
        return c.expand(tuple(shape)) if tuple(shape) else c

    def tensor_constant(self, array) -> "Tensor":
        arr = np.asarray(array)
        return self.add("Constant", (), value=TensorValue(arr), shape=tuple(arr.shape), dtype=dtypes.from_numpy(arr.dtype))

    def iota(self, n: int, dtype: str = "int64") -> "Tensor":
        return self.add("Iota", (), n=int(n), dtype=dtype)

    def view(self, x: "Tensor", shape, strides, offset: int = 0) -> "Tensor":
        shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
        strides = tuple(0 if n == 1 else s for n, s in zip(shape, strides))
        if shapes.is_identity_view(x.shape, shape, strides, offset):
            return x
        node = x.node
        if node.op == "View":
            src = self.nodes[node.inputs[0]]
            inner = (node.attrs["shape"], node.attrs["strides"], node.attrs["offset"])
            composed = shapes.compose_views(src.shape, inner, (shape, strides, offset))
            if composed is not None:
                return self.view(Tensor(self, node.inputs[0]), *composed)
        return self.add("View", (x,), shape=shape, strides=strides, offset=int(offset))

    def build(self, outputs: Sequence["Tensor"]) -> Graph:
        g = Graph(self.nodes, [t.id for t in outputs], self.input_order, self.weights)
        return g.pruned()

    # -- helpers used by Tensor ----------------------------------------------------
    def lift(self, v, like: "Tensor") -> "Tensor":
        if isinstance(v, Tensor):
            return v
        if isinstance(v, (bool, np.bool_)) and like.dtype != "bool" and not dtypes.is_float(like.dtype):
            return self.constant(v, like.dtype)
        dt = like.dtype
        if isinstance(v, float) and not dtypes.is_float(dt):
            dt = "float32"
        elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and dt == "bool":
            dt = "int64"  # as torch: bool_tensor * 2 is an int64 tensor, not a logical and
        return self.constant(v, dt)


def _axes(axis, rank) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(rank))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(sorted({shapes.normalize_axis(a, rank) for a in axis}))


class Tensor:
    """A handle on one builder node; arithmetic on it appends IR nodes."""

    __slots__ = ("b", "id")
    __array_priority__ = 1000

    def __init__(self, b: GraphBuilder, id: int):
        self.b, self.id = b, id

    @property
    def node(self) -> Node:
        return self.b.nodes[self.id]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> str:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"Tensor(%{self.id} {self.node.op} {list(self.shape)} {self.dtype})"

    # -- elementwise ----------------------------------------------------------------
    def _pair(self, other, dtype=None):
        o = self.b.lift(other, self)
        dt = dtype or promote(self.dtype, o.dtype)
        a, c = self.cast(dt), o.cast(dt)
        shape = shapes.broadcast_shapes(a.shape, c.shape)
        return a.expand(shape), c.expand(shape)

    def _binop(self, op, other, dtype=None):
        a, c = self._pair(other, dtype)
        return self.b.add(op, (a, c))

    def __add__(self, o):
        return self._binop("Add", o)

    def __radd__(self, o):
        return self.b.lift(o, self)._binop("Add", self)

    def __mul__(self, o):
        return self._binop("Mul", o)

    def __rmul__(self, o):
        return self.b.lift(o, self)._binop("Mul", self)

    def __neg__(self):
        if self.dtype == "bool":
            raise IRError("cannot negate a bool tensor")
        return self * -1

    def __sub__(self, o):
        return self + (-self.b.lift(o, self))

    def __rsub__(self, o):
        return self.b.lift(o, self) + (-self)

    def __truediv__(self, o):
        a, c = self._pair(o)
        if not dtypes.is_float(a.dtype):
            a, c = a.cast("float32"), c.cast("float32")
        return a * c.recip()

    def __rtruediv__(self, o):
        return self.b.lift(o, self).__truediv__(self)

    def __mod__(self, o):
        """Truncated remainder (C semantics), the IR's Mod."""
        return self._binop("Mod", o)

    def floor_mod(self, o):
        """Python/torch `%`: the result takes the divisor's sign."""
        a, c = self._pair(o)
        r = a % c
        fix = ((r < 0) & (c > 0)) | ((r > 0) & (c < 0))
        return Tensor.where(fix, r + c, r)

    def __lt__(self, o):
        return self._binop("LessThan", o)

    def __gt__(self, o):
        return self.b.lift(o, self)._binop("LessThan", self)

    def __le__(self, o):
        a, c = self._pair(o)
        return c >= a

    def __ge__(self, o):
        # not(a < c) alone would call nan >= x true; comparisons with nan are false
        a, c = self._pair(o)
        ge = ~(a < c)
        return ge & ~(a.isnan() | c.isnan()) if dtypes.is_float(a.dtype) else ge

    def eq(self, o):
        a, c = self._pair(o)
        eq = ~(a < c) & ~(c < a)
        return eq & ~(a.isnan() | c.isnan()) if dtypes.is_float(a.dtype) else eq

    def isnan(self):
        """True where the value is nan: the only value neither below inf nor above -inf."""
        if not dtypes.is_float(self.dtype):
            return self.b.constant(False, "bool", self.shape)
        return ~((self < math.inf) | (self > -math.inf))

    def ne(self, o):
        return ~self.eq(o)

    def __invert__(self):
        if self.dtype != "bool":
            raise IRError("~ is logical not and needs a bool tensor")
        return Tensor.where(self, False, True)

    def __and__(self, o):
        return self._binop("Mul", o, "bool")

    def __or__(self, o):
        return self._binop("Add", o, "bool")

    def __xor__(self, o):
        return self.ne(o)

    __hash__ = object.__hash__

    @staticmethod
    def where(cond, a, b) -> "Tensor":
        ref = next(t for t in (cond, a, b) if isinstance(t, Tensor))
        bld = ref.b
        cond = bld.lift(cond, ref) if isinstance(cond, Tensor) else bld.constant(bool(cond), "bool")
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):
            dt = "bool" if isinstance(a, bool) and isinstance(b, bool) else (
                "float32" if isinstance(a, float) or isinstance(b, float) else "int64")
            a, b = bld.constant(a, dt), bld.constant(b, dt)
        elif not isinstance(a, Tensor):
            a = bld.lift(a, b)
        elif not isinstance(b, Tensor):
            b = bld.lift(b, a)
        if cond.dtype != "bool":
            cond = cond.ne(0)
        dt = promote(a.dtype, b.dtype)
        a, b = a.cast(dt), b.cast(dt)
        shape = shapes.broadcast_shapes(cond.shape, a.shape, b.shape)
        return bld.add("Where", (cond.expand(shape), a.expand(shape), b.expand(shape)))

    def cast(self, dtype: str) -> "Tensor":
        return self if dtype == self.dtype else self.b.add("Cast", (self,), dtype=dtype)

    def float_(self) -> "Tensor":
        return self if dtypes.is_float(self.dtype) else self.cast("float32")

    def _unary(self, op):
        return self.b.add(op, (self.float_(),))

    def exp2(self):
        return self._unary("Exp2")

    def log2(self):
        return self._unary("Log2")

    def sin(self):
        return self._unary("Sin")

    def sqrt(self):
        return self._unary("Sqrt")

    def recip(self):
        return self._unary("Recip")

    @in_float32
    def exp(self):
        return (self.float_() * (1 / math.log(2))).exp2()

    @in_float32
    def log(self):
        return self.log2() * math.log(2)

    @in_float32
    def cos(self):
        return (self.float_() + math.pi / 2).sin()

    def rsqrt(self):
        return self.sqrt().recip()

    def maximum(self, o):
        """Elementwise max; nan in either operand gives nan (torch.maximum, numpy.maximum)."""
        a, c = self._pair(o)
        take_c = (a < c) | c.isnan() if dtypes.is_float(a.dtype) else a < c
        return Tensor.where(take_c, c, a)

    def minimum(self, o):
        a, c = self._pair(o)
        take_c = (c < a) | c.isnan() if dtypes.is_float(a.dtype) else c < a
        return Tensor.where(take_c, c, a)

    def abs(self):
        return Tensor.where(self < 0, -self, self)

    def sign(self):
        return Tensor.where(self > 0, 1, Tensor.where(self < 0, -1, 0)).cast(self.dtype)

    def relu(self):
        # select on `x < 0` so that nan passes through, as torch.relu does
        return Tensor.where(self < 0, self.b.constant(0, self.dtype, self.shape), self)

    @in_float32
    def sigmoid(self):
        return (1 + (-self.float_()).exp()).recip()

    @in_float32
    def silu(self):
        return self * self.sigmoid()

    @in_float32
    def tanh(self):
        # 2*sigmoid(2x) - 1, written to stay finite for large |x|
        x = self.float_()
        return 2 * (1 + (-2 * x).exp()).recip() - 1

    @in_float32
    def erf(self):
        """erf by a rational minimax approximation on [-4, 4] (float32-accurate)."""
        x = self.float_().maximum(-4.0).minimum(4.0)
        x2 = x * x
        alpha = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                 -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
        beta = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                -1.42647390514189e-02)
        p = x2 * alpha[0] + alpha[1]
        for c in alpha[2:]:
            p = p * x2 + c
        q = x2 * beta[0] + beta[1]
        for c in beta[2:]:
            q = q * x2 + c
        return x * p / q

    @in_float32
    def gelu(self, approximate: str = "none"):
        x = self.float_()
        if approximate == "tanh":
            return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
        return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())

    def pow(self, e):
        if isinstance(e, Tensor):
            return (e * self.log2()).exp2()
        e = float(e)
        if e == int(e) and abs(e) <= 8:
            n = abs(int(e))
            out = self.b.lift(1, self).expand(self.shape) if n == 0 else self
            for _ in range(n - 1):
                out = out * self
            return out.recip() if e < 0 else out
        if e == 0.5:
            return self.sqrt()
        if e == -0.5:
            return self.rsqrt()
        return (self.log2() * e).exp2()

    def trunc(self):
        if not dtypes.is_float(self.dtype):
            return self
        frac = self % 1.0  # nan exactly for +-inf and nan, which trunc leaves as they are
        return Tensor.where(frac.isnan(), self, self - frac)

    def floor(self):
        t = self.trunc()
        return Tensor.where(self < t, t - 1, t) if dtypes.is_float(self.dtype) else self

    def ceil(self):
        return -((-self).floor())

    # -- reductions --------------------------------------------------------------------
    def _reduce(self, op, axis, keepdim):
        axes = _axes(axis, self.ndim)
        out = self
        for a in sorted(axes, reverse=True):
            out = self.b.add(op, (out,), axis=a)
        if keepdim:
            out = out.reshape(tuple(1 if i in axes else n for i, n in enumerate(self.shape)))
        return out

    def sum(self, axis=None, keepdim=False):
        x = self.cast("int64") if self.dtype == "bool" else self
        return x._reduce("SumReduce", axis, keepdim)

    def max(self, axis=None, keepdim=False):
        return self._reduce("MaxReduce", axis, keepdim)

    def min(self, axis=None, keepdim=False):
        if self.dtype == "bool":
            return ~((~self).max(axis, keepdim))
        return -((-self).max(axis, keepdim))

    def any(self, axis=None, keepdim=False):
        return self.ne(0)._reduce("MaxReduce", axis, keepdim) if self.dtype != "bool" else self._reduce("MaxReduce", axis, keepdim)

    def all(self, axis=None, keepdim=False):
        b = self if self.dtype == "bool" else self.ne(0)
        return ~((~b).max(axis, keepdim))

    def mean(self, axis=None, keepdim=False):
        n = math.prod(self.shape[a] for a in _axes(axis, self.ndim))
        return self.float_().sum(axis, keepdim) * (1.0 / n)

    def var(self, axis=None, correction=1, keepdim=False):
        axes = _axes(axis, self.ndim)
        n = math.prod(self.shape[a] for a in axes)
        x = self.float_()
        d = x - x.mean(axes, keepdim=True)
        return (d * d).sum(axes, keepdim) * (1.0 / max(n - correction, 0) if n - correction > 0 else float("nan"))

    def argmax(self, axis: int, keepdim=False):
        axis = shapes.normalize_axis(axis, self.ndim)
        m = self.max(axis, keepdim=True)
        n = self.shape[axis]
        idx = self.b.iota(n, "int64").reshape(tuple(n if i == axis else 1 for i in range(self.ndim)))
        cand = Tensor.where(self.eq(m), idx, n)
        return cand.min(axis, keepdim)

    @in_float32
    def logsumexp(self, axis, keepdim=False):
        m = self.max(axis, keepdim=True)
        out = (self - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.squeeze(_axes(axis, self.ndim))

    def cumsum(self, axis: int):
        """Prefix sum along `axis` as a masked reduction (O(n^2), n = that axis)."""
        axis = shapes.normalize_axis(axis, self.ndim)
        n = self.shape[axis]
        x = self.cast("int64") if self.dtype == "bool" else self
        xm = x.movedim(axis, -1).unsqueeze(-2)  # [..., 1, n(j)]
        full = xm.expand(xm.shape[:-2] + (n, n))  # [..., i, j]
        i = self.b.iota(n, "int64")
        keep = i.reshape((1, n)) <= i.reshape((n, 1))  # [i, j]: j <= i
        return Tensor.where(keep, full, self.b.lift(0, x)).sum(-1).movedim(-1, axis)

    # -- movement -----------------------------------------------------------------------
    def view_as_strided(self, shape, strides, offset=0):
        return self.b.view(self, shape, strides, offset)

    def reshape(self, shape):
        shape = list(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = shapes.numel(self.shape) // max(known, 1)
        shape = tuple(int(s) for s in shape)
        if shapes.numel(shape) != shapes.numel(self.shape):
            raise IRError(f"cannot reshape {self.shape} to {shape}")
        return self.b.view(self, shape, shapes.contiguous_strides(shape), 0)

    def permute(self, dims):
        dims = [shapes.normalize_axis(d, self.ndim) for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise IRError(f"permute dims {dims} are not a permutation of {self.ndim} axes")
        cs = shapes.contiguous_strides(self.shape)
        return self.b.view(self, [self.shape[d] for d in dims], [cs[d] for d in dims], 0)

    def transpose(self, a=-2, b=-1):
        dims = list(range(self.ndim))
        a, b = shapes.normalize_axis(a, self.ndim), shapes.normalize_axis(b, self.ndim)
        dims[a], dims[b] = dims[b], dims[a]
        return self.permute(dims)

    @property
    def T(self):
        return self.transpose(-2, -1)

    def movedim(self, src, dst):
        src, dst = shapes.normalize_axis(src, self.ndim), shapes.normalize_axis(dst, self.ndim)
        dims = [d for d in range(self.ndim) if d != src]
        dims.insert(dst, src)
        return self.permute(dims)

    def expand(self, shape):
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return self
        if len(shape) < self.ndim:
            raise IRError(f"cannot expand {self.shape} to the lower-rank shape {shape}")
        lead = len(shape) - self.ndim
        cs = shapes.contiguous_strides(self.shape)
        strides = [0] * lead
        out_shape = list(shape[:lead])
        for n, s, t in zip(self.shape, cs, shape[lead:]):
            if t == -1:
                t = n
            if n == t:
                strides.append(s)
            elif n == 1:
                strides.append(0)
            else:
                raise IRError(f"cannot expand dimension of size {n} to {t} (shape {self.shape} -> {shape})")
            out_shape.append(t)
        return self.b.view(self, out_shape, strides, 0)

    def unsqueeze(self, axis):
        axis = axis % (self.ndim + 1)
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def squeeze(self, axis=None):
        axes = _axes(axis, self.ndim) if axis is not None else tuple(i for i, n in enumerate(self.shape) if n == 1)
        return self.reshape(tuple(n for i, n in enumerate(self.shape) if not (i in axes and n == 1)))

    def slice(self, axis, start=None, stop=None, step=1):
        axis = shapes.normalize_axis(axis, self.ndim)
        n = self.shape[axis]
        start, stop, step = slice(start, stop, step).indices(n)
        length = len(range(start, stop, step))
        cs = shapes.contiguous_strides(self.shape)
        shape = list(self.shape)
        shape[axis] = length
        strides = list(cs)
        strides[axis] = cs[axis] * step
        return self.b.view(self, shape, strides, start * cs[axis] if length else 0)

    def select(self, axis, index):
        axis = shapes.normalize_axis(axis, self.ndim)
        n = self.shape[axis]
        if not -n <= index < n:
            raise IRError(f"index {index} out of range for axis {axis} of size {n}")
        cs = shapes.contiguous_strides(self.shape)
        keep = [d for d in range(self.ndim) if d != axis]
        return self.b.view(self, [self.shape[d] for d in keep], [cs[d] for d in keep], (index % n) * cs[axis])

    def flip(self, axis):
        axis = shapes.normalize_axis(axis, self.ndim)
        cs = list(shapes.contiguous_strides(self.shape))
        off = (self.shape[axis] - 1) * cs[axis]
        cs[axis] = -cs[axis]
        return self.b.view(self, self.shape, cs, off)

    def gather(self, axis, idx: "Tensor"):
        axis = shapes.normalize_axis(axis, self.ndim)
        if idx.ndim != self.ndim:
            raise IRError("gather index must have the source's rank")
        if any(i != axis and idx.shape[i] > self.shape[i] for i in range(self.ndim)):
            raise IRError(f"gather index shape {idx.shape} exceeds source {self.shape} off axis {axis}")
        src = self
        if any(i != axis and idx.shape[i] != self.shape[i] for i in range(self.ndim)):
            src = self
            for d in range(self.ndim):
                if d != axis and idx.shape[d] != self.shape[d]:
                    src = src.slice(d, 0, idx.shape[d])
        return self.b.add("Gather", (src, idx), axis=axis)

    def index_select(self, axis, idx: "Tensor"):
        """out = self taken at `idx` (any shape, int) along `axis`; idx dims replace that axis."""
        axis = shapes.normalize_axis(axis, self.ndim)
        flat = idx.reshape((-1,))
        k = flat.shape[0]
        shape = list(self.shape)
        shape[axis] = k
        full_idx = flat.reshape(tuple(k if d == axis else 1 for d in range(self.ndim))).expand(shape)
        out = self.b.add("Gather", (self, full_idx), axis=axis)
        return out.reshape(self.shape[:axis] + idx.shape + self.shape[axis + 1:])

    def pad(self, axis, before, after, value=0):
        """Pad one axis with a constant, as Iota + Gather + Where."""
        axis = shapes.normalize_axis(axis, self.ndim)
        n = self.shape[axis]
        total = n + before + after
        i = self.b.iota(total, "int64") - before
        valid = (i >= 0) & (i < n)
        idx = i.maximum(0).minimum(n - 1)
        g = self.index_select(axis, idx)
        vshape = tuple(total if d == axis else 1 for d in range(self.ndim))
        fill = self.b.lift(value, self) if isinstance(value, Tensor) or (
            isinstance(value, float) and not dtypes.is_float(self.dtype)) else self.b.constant(value, self.dtype)
        return Tensor.where(valid.reshape(vshape), g, fill)

    def clamp(self, lo=None, hi=None):
        out = self
        if lo is not None:
            out = out.maximum(lo)
        if hi is not None:
            out = out.minimum(hi)
        return out

    # -- idioms in primitive form -------------------------------------------------------
    def matmul(self, other: "Tensor") -> "Tensor":
        from .idioms import matmul_decomposed

        return matmul_decomposed(self, other)

    __matmul__ = matmul

    def softmax(self, axis=-1):
        from .idioms import softmax_decomposed

        return softmax_decomposed(self, shapes.normalize_axis(axis, self.ndim))

    @in_float32
    def log_softmax(self, axis=-1):
        axis = shapes.normalize_axis(axis, self.ndim)
        x = self.float_()
        s = x - x.max(axis, keepdim=True)
        return s - s.exp().sum(axis, keepdim=True).log()

    def layer_norm(self, eps: float):
        from .idioms import layernorm_decomposed

        return layernorm_decomposed(self, self.ndim - 1, eps)

    def rms_norm(self, eps: float):
        from .idioms import rmsnorm_decomposed

        return rmsnorm_decomposed(self, self.ndim - 1, eps)


def cat(tensors: Sequence[Tensor], axis: int) -> Tensor:
    """Concatenate along `axis` as Iota + Gather + Where (the IR has no concat)."""
    tensors = [t for t in tensors if t.shape[shapes.normalize_axis(axis, t.ndim)] > 0] or list(tensors[:1])
    if len(tensors) == 1:
        return tensors[0]
    t0 = tensors[0]
    axis = shapes.normalize_axis(axis, t0.ndim)
    for t in tensors[1:]:
        if t.ndim != t0.ndim or any(d != axis and t.shape[d] != t0.shape[d] for d in range(t0.ndim)):
            raise IRError(
                f"cat along axis {axis} needs equal shapes off that axis, got {[x.shape for x in tensors]}; "
                "expand or reshape the operands first"
            )
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = promote(dt, t.dtype)
    total = sum(t.shape[axis] for t in tensors)
    b = t0.b
    i = b.iota(total, "int64")
    vshape = tuple(total if d == axis else 1 for d in range(t0.ndim))
    out = None
    start = total
    for t in reversed(tensors):
        n = t.shape[axis]
        start -= n
        g = t.cast(dt).index_select(axis, (i - start).maximum(0).minimum(n - 1))
        out = g if out is None else Tensor.where((i < start + n).reshape(vshape), g, out)
    return out


def stack(tensors: Sequence[Tensor], axis: int) -> Tensor:
    axis = axis % (tensors[0].ndim + 1)
    return cat([t.unsqueeze(axis) for t in tensors], axis)
