"""The primitive table: the single source of truth for what each op means.

Each entry says an op's arity, kind, how its output shape and dtype follow
from its inputs and attributes (``infer``), and its numpy semantics
(``compute``).  Backends and rewrites key off this table; a test checks that
every primitive has a rule in every backend.

Conventions that everything else relies on:

* Elementwise binary ops and ``Where`` take operands of *identical* shape:
  broadcasting is explicit, as a stride-0 ``View``.
* Binary ops take operands of one dtype.  On ``bool``, ``Add`` is logical
  or and ``Mul`` logical and.
* ``Mod`` is the truncated remainder (sign of the dividend), as C, Triton and
  ``lax.rem`` compute it; floor-mod is a decomposition.
* ``SumReduce`` / ``MaxReduce`` reduce one axis and drop it.
* ``Iota(n)`` is ``0..n-1`` in a 1-D tensor.
* ``Gather(x, idx, axis)``: ``idx`` has ``x``'s rank and shape except along
  ``axis``; ``out[..i..] = x[.., idx[..i..], ..]`` (``take_along_axis``).
  Indices must lie in ``[0, x.shape[axis])``.
* ``Scatter(x, idx, upd, axis)``: the inverse of ``Gather`` (``put_along_axis``):
  ``idx`` and ``upd`` have one shape, ``x``'s except along ``axis``; the result
  is ``x`` with ``out[.., idx[..i..], ..] = upd[..i..]``.  Indices must lie in
  ``[0, x.shape[axis])`` and be distinct along ``axis`` within each line (two
  writes to one element have no defined order).  It is a pure function: a
  backend may write into ``x``'s buffer in place only when nothing reads the
  old ``x`` afterwards (a ``state`` input updated by the step).
* ``View(x, shape, strides, offset)`` reads the logical row-major flattening
  of ``x`` (see ``shapes.py``).
* ``compute`` receives inputs already in the op's compute dtype (float32 for
  half types, float64 in the interpreter's oracle mode) and returns a result
  in that compute dtype; the interpreter rounds to the node's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import IRError
from . import dtypes, shapes, strided
from .rounding import round_once

Type = tuple[tuple[int, ...], str]  # (shape, dtype)


ATTR_TYPES = ("int", "float", "bool", "dtype", "name", "role", "shape", "value")
"""What an attribute holds: an integer (axis, n, offset), a float (eps, scale), a
bool, a dtype name, an input name, an input role, a shape/stride tuple, or a
Constant's value (a scalar or a :class:`TensorValue`)."""


@dataclass(frozen=True)
class Attr:
    """One typed attribute of an op (the e-graph encoding and the checks key off ``type``)."""

    name: str
    type: str

    def __post_init__(self):
        if self.type not in ATTR_TYPES:
            raise ValueError(f"attribute {self.name!r} has unknown type {self.type!r}; use one of {ATTR_TYPES}")


def attrs_of(spec: str) -> tuple[Attr, ...]:
    """``"axis:int eps:float"`` -> typed attributes, in argument order."""
    return tuple(Attr(*item.split(":")) for item in spec.split())


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str  # leaf | movement | unary | binary | select | type | reduce | index | contraction | row | attention
    arity: tuple[int, ...]  # allowed input counts
    attrs: tuple[Attr, ...]  # required attributes, in the order the e-graph encodes them
    infer: Callable[[list[Type], Mapping[str, Any]], Type]
    # (*inputs, attrs, out_shape, np_dtype) -> array; None only for Input, whose value is bound outside the graph
    compute: Callable[..., np.ndarray] | None
    doc: str = ""

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)


# --- type rules -------------------------------------------------------------

def _need_float(op, t):
    if not dtypes.is_float(t[1]):
        raise IRError(f"{op} needs a floating-point input, got {t[1]}; insert a Cast first")


def _same(op, a, b):
    if a[0] != b[0]:
        raise IRError(f"{op} operands must have identical shapes (broadcast with a View first), got {a[0]} and {b[0]}")
    if a[1] != b[1]:
        raise IRError(f"{op} operands must have one dtype (Cast first), got {a[1]} and {b[1]}")


def _unary_float(op):
    def infer(ts, attrs):
        _need_float(op, ts[0])
        return ts[0]
    return infer


def _binary(op, allow_bool=True, result=None):
    def infer(ts, attrs):
        _same(op, ts[0], ts[1])
        if ts[0][1] == "bool" and not allow_bool:
            raise IRError(f"{op} is not defined on bool; Cast to an integer type first")
        return ts[0][0], result or ts[0][1]
    return infer


def _infer_where(ts, attrs):
    c, a, b = ts
    if c[1] != "bool":
        raise IRError(f"Where needs a bool condition, got {c[1]}")
    _same("Where", a, b)
    if c[0] != a[0]:
        raise IRError(f"Where condition shape {c[0]} differs from value shape {a[0]}")
    return a


def _infer_reduce(op, allow_bool, needs_elements=False):
    def infer(ts, attrs):
        shape, dt = ts[0]
        if dt == "bool" and not allow_bool:
            raise IRError(f"{op} is not defined on bool; Cast first")
        if not shape:
            raise IRError(f"{op} needs an input of rank >= 1")
        ax = attrs["axis"]
        if not isinstance(ax, int) or not 0 <= ax < len(shape):
            raise IRError(f"{op} axis must be a non-negative int below rank {len(shape)}, got {ax!r}")
        if shape[ax] == 0 and needs_elements:
            raise IRError(f"{op} over an empty axis has no value")
        return shape[:ax] + shape[ax + 1:], dt
    return infer


def _infer_iota(ts, attrs):
    n = attrs["n"]
    if not isinstance(n, int) or n < 0:
        raise IRError(f"Iota length must be a non-negative int, got {n!r}")
    dt = dtypes.check(attrs["dtype"], "Iota")
    if dt == "bool":
        raise IRError("Iota cannot produce bool")
    return (n,), dt


def _infer_gather(ts, attrs):
    (xs, xd), (ish, idt) = ts
    ax = attrs["axis"]
    if not dtypes.is_int(idt):
        raise IRError(f"Gather indices must be int32 or int64, got {idt}")
    if len(ish) != len(xs):
        raise IRError(f"Gather indices must have the source's rank {len(xs)}, got shape {ish}")
    if not isinstance(ax, int) or not 0 <= ax < len(xs):
        raise IRError(f"Gather axis {ax!r} out of range for rank {len(xs)}")
    for d, (a, b) in enumerate(zip(xs, ish)):
        if d != ax and a != b:
            raise IRError(f"Gather index shape {ish} must equal source shape {xs} except on axis {ax}")
    return tuple(ish), xd


def _infer_scatter(ts, attrs):
    (xs, xd), (ish, idt), (us, ud) = ts
    ax = attrs["axis"]
    if not dtypes.is_int(idt):
        raise IRError(f"Scatter indices must be int32 or int64, got {idt}")
    if ud != xd:
        raise IRError(f"Scatter updates must have the target's dtype {xd}, got {ud}; Cast first")
    if tuple(ish) != tuple(us):
        raise IRError(f"Scatter indices {ish} and updates {us} must have one shape")
    if len(us) != len(xs):
        raise IRError(f"Scatter updates must have the target's rank {len(xs)}, got shape {us}")
    if not isinstance(ax, int) or not 0 <= ax < len(xs):
        raise IRError(f"Scatter axis {ax!r} out of range for rank {len(xs)}")
    for d, (a, b) in enumerate(zip(xs, us)):
        if d != ax and a != b:
            raise IRError(f"Scatter update shape {us} must equal target shape {xs} except on axis {ax}")
    return tuple(xs), xd


def _infer_cast(ts, attrs):
    return ts[0][0], dtypes.check(attrs["dtype"], "Cast")


def _infer_view(ts, attrs):
    shape, strides, off = tuple(attrs["shape"]), tuple(attrs["strides"]), attrs["offset"]
    shapes.check_view(ts[0][0], shape, strides, off)
    return shape, ts[0][1]


def _infer_leaf(op, attrs):
    shape = tuple(attrs["shape"])
    if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise IRError(f"{op} shape {shape} must be non-negative ints")
    return shape, dtypes.check(attrs["dtype"], op)


def _check_scalar_fits(v, dt):
    """A scalar Constant's value must survive conversion to its dtype (1.5 is no int32, 2**40 no int32)."""
    if dtypes.is_int(dt):
        info = np.iinfo(dtypes.to_numpy(dt))
        if isinstance(v, float) and not (np.isfinite(v) and v == int(v)):
            raise IRError(f"Constant value {v!r} is not an integer; a {dt} Constant needs an int value")
        if not info.min <= int(v) <= info.max:
            raise IRError(f"Constant value {v!r} does not fit in {dt}")
    elif dt == "bool" and v not in (0, 1):
        raise IRError(f"Constant value {v!r} is not a bool; a bool Constant needs True or False")


# --- numpy semantics ----------------------------------------------------------

def _gather(x, idx, attrs, *_):
    idx = np.asarray(idx)
    n = x.shape[attrs["axis"]]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IRError(f"Gather index out of range [0, {n}): saw {idx.min()}..{idx.max()}")
    return np.take_along_axis(x, idx.astype(np.int64), axis=attrs["axis"])


def _scatter(x, idx, upd, attrs, *_):
    ax = attrs["axis"]
    idx = np.asarray(idx).astype(np.int64)
    n = x.shape[ax]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IRError(f"Scatter index out of range [0, {n}): saw {idx.min()}..{idx.max()}")
    if idx.size and idx.shape[ax] > 1:
        lines = np.sort(np.moveaxis(idx, ax, -1), axis=-1)
        if np.any(lines[..., 1:] == lines[..., :-1]):
            raise IRError("Scatter indices repeat along the axis within a line; two writes to one element have no order")
    out = np.array(x, copy=True)
    np.put_along_axis(out, idx, np.asarray(upd, dtype=out.dtype), axis=ax)
    return out


def _view(x, attrs, *_):
    shape = tuple(attrs["shape"])
    if shapes.numel(shape) == 0:
        return np.zeros(shape, x.dtype)
    strides, offset = tuple(attrs["strides"]), attrs["offset"]
    if not x.flags.c_contiguous and _broadcasts(x.shape, shape, strides, offset):
        # `x` with broadcast axes added, read where it lies (the oracle's transposed weight in a product)
        mem = iter(st for n, st in zip(x.shape, x.strides) if n > 1)
        return np.lib.stride_tricks.as_strided(
            x, shape, [next(mem) if n > 1 and st else 0 for n, st in zip(shape, strides)], writeable=False)
    flat = np.ascontiguousarray(x).reshape(-1)
    lo = offset + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    hi = offset + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides))
    if 0 <= lo and hi < flat.size:
        # the same elements as the gather below, read in place: a broadcast (stride 0) view of a
        # large operand costs no index array (the float64 oracle of a traced matmul is such a view)
        return np.lib.stride_tricks.as_strided(flat[offset:], shape, [s * flat.itemsize for s in strides],
                                               writeable=False)
    return flat[strided.gather_index(shape, strides, offset)]


def _broadcasts(src: tuple, shape: tuple, strides: tuple, offset: int) -> bool:
    """The view is `src` (in order, whole) with broadcast (stride-0) and size-1 axes inserted."""
    kept = [(n, st) for n, st in zip(shape, strides) if n > 1 and st]
    whole = [(n, st) for n, st in zip(src, shapes.contiguous_strides(src)) if n > 1]
    return offset == 0 and kept == whole


def _max_reduce(x, attrs, *_):
    return np.max(x, axis=attrs["axis"]) if x.dtype != np.bool_ else np.any(x, axis=attrs["axis"])


def _sum_reduce(x, attrs, *_):
    return np.sum(x, axis=attrs["axis"], dtype=x.dtype)


def _add(a, b, *_):
    return np.logical_or(a, b) if a.dtype == np.bool_ else a + b


def _mul(a, b, *_):
    return np.logical_and(a, b) if a.dtype == np.bool_ else a * b


def _mod(a, b, *_):
    if np.issubdtype(a.dtype, np.integer) and np.any(b == 0):
        raise IRError("Mod by zero in an integer tensor")
    return np.fmod(a, b)


def _nibble(a, pos, *_):
    """The signed 4-bit field of each int8 in `a`: bits 0-3 where `pos` is even, bits 4-7 where odd (-8..7)."""
    shift = 28 - 4 * (pos.astype(np.int32) & 1)
    return ((a.astype(np.int32) << shift) >> 28).astype(np.int8)


def _infer_nibble(ts, attrs):
    _same("Nibble", ts[0], ts[1])
    if ts[0][1] != "int8":
        raise IRError(f"Nibble reads packed 4-bit values from int8 bytes, got {ts[0][1]}; Cast to int8 first")
    return ts[0]


def _rounded(x, dtype: str, dt) -> np.ndarray:
    """``x`` converted to ``dtype`` with one rounding, held in the compute dtype ``dt``.

    A half type computes in float32: going value -> float32 -> half would round
    twice, so round to the half type first (exact when widened back).
    """
    if np.dtype(dt) == np.float32 and dtypes.is_half(dtype):
        return round_once(x, dtypes.to_numpy(dtype)).astype(dt)
    return np.asarray(x).astype(dt)


def _constant(attrs, shape, dt):
    v = attrs["value"]
    arr = v.array if isinstance(v, TensorValue) else np.asarray(v)
    return np.broadcast_to(_rounded(arr, attrs["dtype"], dt), shape).copy()


def _iota(attrs, shape, dt):
    return np.arange(attrs["n"]).astype(dt)


def _cast(x, attrs, shape, dt):
    """Nonzero is True; float to int truncates toward zero (C, torch and XLA agree)."""
    if attrs["dtype"] == "bool":
        return x != 0
    if dtypes.is_int(attrs["dtype"]) and np.issubdtype(x.dtype, np.floating):
        x = np.trunc(x)
    return _rounded(x, attrs["dtype"], dt)


class TensorValue:
    """An immutable array held by a ``Constant`` node, hashed by content."""

    __slots__ = ("array", "_key")

    def __init__(self, array):
        a = np.array(array, copy=True)
        a.setflags(write=False)
        self.array = a
        import hashlib
        self._key = (a.dtype.str, a.shape, hashlib.sha256(a.tobytes()).hexdigest())

    def __eq__(self, other):
        return isinstance(other, TensorValue) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        if self.array.size <= 8:
            return f"tensor({self.array.tolist()})"
        return f"tensor<{self.array.shape} sha={self._key[2][:10]}>"


def _leaf_check(op, has_value=False):
    def infer(ts, attrs):
        if has_value:
            v = attrs["value"]
            if isinstance(v, TensorValue):
                if tuple(v.array.shape) != tuple(attrs["shape"]):
                    raise IRError("Constant tensor value shape differs from its declared shape")
            elif not isinstance(v, (bool, int, float)) or tuple(attrs["shape"]) != ():
                raise IRError("a scalar Constant has shape () and a bool/int/float value; broadcast it with a View")
            else:
                _check_scalar_fits(v, dtypes.check(attrs["dtype"], op))
        return _infer_leaf(op, attrs)
    return infer


def _unary(fn):
    return lambda x, *_: fn(x)


PRIMITIVES: dict[str, OpDef] = {}
LEAVES: dict[str, OpDef] = {}


def _def(table, name, kind, arity, attrs, infer, compute, doc=""):
    table[name] = OpDef(name, kind, arity, attrs_of(attrs), infer, compute, doc)


_def(PRIMITIVES, "Exp2", "unary", (1,), "", _unary_float("Exp2"), _unary(np.exp2), "2**x")
_def(PRIMITIVES, "Log2", "unary", (1,), "", _unary_float("Log2"), _unary(np.log2), "log base 2")
_def(PRIMITIVES, "Sin", "unary", (1,), "", _unary_float("Sin"), _unary(np.sin), "sine")
_def(PRIMITIVES, "Sqrt", "unary", (1,), "", _unary_float("Sqrt"), _unary(np.sqrt), "square root")
_def(PRIMITIVES, "Recip", "unary", (1,), "", _unary_float("Recip"), _unary(np.reciprocal), "1/x")
_def(PRIMITIVES, "Add", "binary", (2,), "", _binary("Add"), _add, "a+b (bool: or)")
_def(PRIMITIVES, "Mul", "binary", (2,), "", _binary("Mul"), _mul, "a*b (bool: and)")
_def(PRIMITIVES, "Mod", "binary", (2,), "", _binary("Mod", allow_bool=False), _mod, "truncated remainder")
_def(PRIMITIVES, "Nibble", "binary", (2,), "", _infer_nibble, _nibble,
     "signed 4-bit field of int8 a: low where b is even, high where odd (packed int4 weights)")
_def(PRIMITIVES, "LessThan", "binary", (2,), "", _binary("LessThan", result="bool"), lambda a, b, *_: a < b, "a<b")
_def(PRIMITIVES, "Where", "select", (3,), "", _infer_where, lambda c, a, b, *_: np.where(c, a, b), "IEEE-safe select")
_def(PRIMITIVES, "SumReduce", "reduce", (1,), "axis:int", _infer_reduce("SumReduce", False), _sum_reduce, "sum over one axis")
_def(PRIMITIVES, "MaxReduce", "reduce", (1,), "axis:int", _infer_reduce("MaxReduce", True, needs_elements=True), _max_reduce, "max over one axis")
_def(PRIMITIVES, "Iota", "index", (0,), "n:int dtype:dtype", _infer_iota, _iota, "0..n-1")
_def(PRIMITIVES, "Gather", "index", (2,), "axis:int", _infer_gather, _gather, "take_along_axis")
_def(PRIMITIVES, "Scatter", "index", (3,), "axis:int", _infer_scatter, _scatter, "put_along_axis (the inverse of Gather)")
_def(PRIMITIVES, "Cast", "type", (1,), "dtype:dtype", _infer_cast, _cast, "dtype conversion")

_def(LEAVES, "Input", "leaf", (0,), "name:name shape:shape dtype:dtype role:role", _leaf_check("Input"), None,
     "a model input or weight")
_def(LEAVES, "Constant", "leaf", (0,), "value:value shape:shape dtype:dtype", _leaf_check("Constant", has_value=True), _constant,
     "a literal")
_def(LEAVES, "View", "movement", (1,), "shape:shape strides:shape offset:int", _infer_view, _view, "as_strided view")

BASE_OPS: dict[str, OpDef] = {**PRIMITIVES, **LEAVES}


def constant_array(attrs, shape, np_dtype):
    return _constant(attrs, shape, np_dtype)
