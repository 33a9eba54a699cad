"""The FX graph under construction, and the conversions that need care.

:class:`Emitter` wraps a ``torch.fx.Graph``: every value it creates is a
``call_function`` of one ATen overload (``torch.ops.aten.*``), a
placeholder, or a ``get_attr`` of a tensor held by the module (weights,
tensor constants), and carries its IR dtype in ``node.meta`` so rules can
ask what they hold (a rule computes half types in float32, as the
reference interpreter does).

:func:`convert` is the one dtype conversion every rule and the program use.
ATen's own conversions agree with numpy's except where torch rounds twice
(measured, torch 2.13 CPU): float64 -> float16/bfloat16 go through float32,
and int32/int64 -> bfloat16 through float32.  numpy (and ml_dtypes for
bfloat16) round once.  Those conversions are written here as a
*round-to-odd* step to float32 followed by the ordinary rounding: rounding
to odd at 24 bits and then to nearest at 11 or 8 bits equals rounding
to nearest once (24 >= 11 + 2), so the result is the correctly rounded one
numpy gives.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from ...ir import dtypes
from ...ir.tensors import torch_dtype, view_numpy as to_numpy, view_torch as from_numpy  # noqa: F401 (re-exported)

aten = torch.ops.aten
TORCH_DTYPES = {d: torch_dtype(d) for d in dtypes.DTYPES}


class Emitter:
    """An FX graph of ATen calls being built, with the module that holds its tensors."""

    def __init__(self, device: torch.device, knobs: dict):
        self.fx = torch.fx.Graph()
        self.root = torch.nn.Module()
        self.device = device
        self.knobs = knobs
        self._attrs = 0
        self.graph = None  # the IR graph being lowered: rules read their operands' shapes from it

    def call(self, op, args, dt: str, **kwargs) -> torch.fx.Node:
        """``op(*args, **kwargs)`` whose result has IR dtype `dt`."""
        node = self.fx.call_function(op, tuple(args), kwargs)
        node.meta["egraft_dtype"] = dt
        return node

    def item(self, tup: torch.fx.Node, k: int, dt: str) -> torch.fx.Node:
        """Element `k` of an op returning several tensors (``native_layer_norm``)."""
        node = self.fx.call_function(operator.getitem, (tup, k))
        node.meta["egraft_dtype"] = dt
        return node

    def placeholder(self, name: str, dt: str) -> torch.fx.Node:
        node = self.fx.placeholder(name)
        node.meta["egraft_dtype"] = dt
        return node

    def tensor(self, value: torch.Tensor, dt: str, prefix: str) -> torch.fx.Node:
        """A tensor the module holds (on the device; never copied per call), read by ``get_attr``."""
        name = f"{prefix}{self._attrs}"
        self._attrs += 1
        self.root.register_buffer(name, value, persistent=False)
        node = self.fx.get_attr(name)
        node.meta["egraft_dtype"] = dt
        return node

    def in_shapes(self, node) -> tuple[tuple[int, ...], ...]:
        """The shapes of IR node `node`'s operands."""
        return tuple(self.graph.nodes[j].shape for j in node.inputs)

    def dt(self, x: torch.fx.Node) -> str:
        return x.meta["egraft_dtype"]

    def full(self, shape, value, dt: str) -> torch.fx.Node:
        return self.call(aten.full.default, (list(shape), value), dt, dtype=TORCH_DTYPES[dt], device=self.device)

    def f32(self, x: torch.fx.Node) -> torch.fx.Node:
        """Half types are computed in float32 (the program rounds each result back to its node's dtype)."""
        return convert(self, x, dtypes.compute_name(self.dt(x))) if dtypes.is_half(self.dt(x)) else x


def _to(ctx: Emitter, x, dt: str):
    return ctx.call(aten._to_copy.default, (x,), dt, dtype=TORCH_DTYPES[dt])


def _round_to_odd(ctx: Emitter, x, to: str):
    """`x` (float64, int32 or int64) in float type `to` (narrower), rounded to odd: ties and inexact values
    land on the neighbour whose last mantissa bit is 1, so a later rounding to nearest is a single rounding."""
    src = ctx.dt(x)
    bits_dt = {"float32": "int32", "float64": "int64"}[to]
    f = _to(ctx, x, to)  # rounded to nearest
    if src == "int64" and to == "float64":
        # 2**63 (from x near INT64_MAX) has no int64: it is inexact and above x
        big = ctx.call(aten.ge.Scalar, (f, 2.0**63), "bool")
        back = _to(ctx, ctx.call(aten.where.ScalarSelf, (big, 0.0, f), "float64"), "int64")
        inexact = ctx.call(aten.logical_or.default, (big, ctx.call(aten.ne.Tensor, (back, x), "bool")), "bool")
        pos = ctx.call(aten.gt.Scalar, (x, 0), "bool")
        up = ctx.call(aten.where.self, (pos, ctx.call(aten.gt.Tensor, (back, x), "bool"),
                                        ctx.call(aten.lt.Tensor, (back, x), "bool")), "bool")
        away = ctx.call(aten.logical_or.default, (big, up), "bool")  # |f| > |x|
    else:
        back = _to(ctx, f, src)  # exact: f has fewer bits than the source
        inexact = ctx.call(aten.ne.Tensor, (back, x), "bool")
        away = ctx.call(aten.gt.Tensor, (ctx.call(aten.abs.default, (back,), src),
                                         ctx.call(aten.abs.default, (x,), src)), "bool")
    bits = ctx.call(aten.view.dtype, (f, TORCH_DTYPES[bits_dt]), bits_dt)
    even = ctx.call(aten.eq.Scalar, (ctx.call(aten.bitwise_and.Scalar, (bits, 1), bits_dt), 0), "bool")
    fix = ctx.call(aten.logical_and.default, (inexact, even), "bool")
    # the other neighbour: one ulp toward zero when f overshot |x|, else away from zero (sign-magnitude bits)
    other = ctx.call(aten.where.self, (away, ctx.call(aten.sub.Scalar, (bits, 1), bits_dt),
                                       ctx.call(aten.add.Scalar, (bits, 1), bits_dt)), bits_dt)
    bits = ctx.call(aten.where.self, (fix, other, bits), bits_dt)
    return ctx.call(aten.view.dtype, (bits, TORCH_DTYPES[to]), to)


def convert(ctx: Emitter, x, dst: str):
    """`x` converted to IR dtype `dst` exactly as ``ir.evaluate`` converts (see the module docstring).

    To bool: nonzero is True (NaN included).  Float to int truncates toward
    zero, as ATen's conversion does.
    """
    src = ctx.dt(x)
    if src == dst:
        return x
    if dst == "bool":
        return ctx.call(aten.ne.Scalar, (x, 0), "bool")
    if dtypes.is_half(dst) and (src == "float64" or (dst == "bfloat16" and dtypes.is_int(src))):
        if src == "int32":
            x = _to(ctx, x, "float64")  # exact
        elif src == "int64":
            x = _round_to_odd(ctx, x, "float64")
        x = _round_to_odd(ctx, x, "float32")
    return _to(ctx, x, dst)


def constant_value(arr: np.ndarray, dt: str):
    """The Python scalar of a one-element array of IR dtype `dt` (exact: it is already rounded to `dt`)."""
    v = arr.reshape(-1)[0]
    if dt == "bool":
        return bool(v)
    if dtypes.is_int(dt):
        return int(v)
    return float(np.float64(v))
