"""The lowering table: one rule per ATen op, and the context a rule runs in.

A rule turns one exported ATen node into IR, written with the builder's
``Tensor`` API.  It receives the node's arguments with every fx node replaced
by its lowered value (a ``Tensor``, a tuple of them for multi-output ops, or a
python scalar), plus a :class:`Ctx` that knows the node's expected output
type (``meta['val']``) and torch's type promotion.  The driver
(``egraft.frontend.tracer``) checks every result against ``meta['val']``, so a
rule only has to get the *values* right; it may leave the final dtype to the
driver's cast.

Keys are ATen names without the ``torch.ops.`` prefix: an overload
(``"aten.max.dim"``) wins over its packet (``"aten.max"``), so a packet rule
covers every overload whose arguments it understands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...errors import UnsupportedOpError
from ...ir import dtypes
from ...ir.builder import GraphBuilder, Tensor
from ...ir.tensors import torch_dtype


@dataclass(frozen=True)
class Rule:
    name: str
    fn: Callable[..., Any]
    upcast: bool = False  # run on float32 copies of half-precision args (as torch's CPU kernels do)


LOWERINGS: dict[str, Rule] = {}

# What to tell a user whose model reaches an op with no rule, where there is something better to say
# than "rewrite the model".
UNSUPPORTED_HINTS: dict[str, str] = {
    "aten._native_batch_norm_legit": "batch norm in training mode updates running statistics; call model.eval() first",
    "aten._native_batch_norm_legit_functional": "batch norm in training mode; call model.eval() first",
    "aten.native_dropout": "dropout in training mode is random; call model.eval() first",
    "aten.bernoulli": "random sampling (dropout in training mode?) cannot be compiled; call model.eval() first",
    "aten.rand": "random numbers cannot be compiled; pass them in as an input instead",
    "aten.randn": "random numbers cannot be compiled; pass them in as an input instead",
    "aten._local_scalar_dense": ".item() reads a tensor value into python (a data-dependent value); keep it a tensor",
    "aten.nonzero": "nonzero / boolean-mask indexing has a data-dependent shape; use torch.where(mask, x, fill)",
    "aten.index_put": "in-place indexed assignment (x[idx] = v) is not supported; build the result with "
                      "torch.where or torch.cat",
}


def lowering(*names: str, upcast: bool = False):
    """Register ``fn`` as the rule for each ATen op name in ``names``."""

    def register(fn):
        for name in names:
            if name in LOWERINGS:
                raise ValueError(f"two lowering rules for {name}")
            LOWERINGS[name] = Rule(name, fn, upcast)
        return fn

    return register


def lookup(target) -> Rule | None:
    """The rule for an fx call target (an OpOverload, or a python builtin)."""
    name = op_name(target)
    rule = LOWERINGS.get(name)
    if rule is None and name.count(".") == 2:
        rule = LOWERINGS.get(name.rsplit(".", 1)[0])
    return rule


def op_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        return f"{ns}.{target._schema.name.split('::')[1]}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target)
    mod = getattr(target, "__module__", None) or ""
    return f"{mod.replace('_operator', 'operator')}.{getattr(target, '__name__', str(target))}"


_STAND_INS: dict = {}


def _stand_in(dimensioned: bool, dt: str) -> torch.Tensor:
    key = (dimensioned, dt)
    if key not in _STAND_INS:
        _STAND_INS[key] = torch.empty((1,) if dimensioned else (), dtype=torch_dtype(dt), device="meta")
    return _STAND_INS[key]


class Ctx:
    """What a rule may know besides its arguments: the builder and the expected output."""

    __slots__ = ("builder", "op", "meta", "source", "upcast", "arg_metas")

    def __init__(self, builder: GraphBuilder, op: str, meta, source: str | None, upcast: bool = False, arg_metas=()):
        self.builder, self.op, self.meta, self.source, self.upcast = builder, op, meta, source, upcast
        self.arg_metas = arg_metas  # meta['val'] of each positional fx-node argument (None for non-nodes)

    # -- the expected output (from the exported node's meta['val']) ---------------------
    @property
    def out_dtype(self) -> str:
        """egraft dtype of the (first) output, as torch declares it."""
        v = self.meta[0] if isinstance(self.meta, (tuple, list)) else self.meta
        return dtypes.from_torch(v.dtype)

    @property
    def dtype(self) -> str:
        """The dtype a rule computes in: the output dtype, or float32 for a half output of an upcast rule."""
        dt = self.out_dtype
        return dtypes.compute_name(dt) if self.upcast else dt

    @property
    def shape(self) -> tuple[int, ...]:
        v = self.meta[0] if isinstance(self.meta, (tuple, list)) else self.meta
        return tuple(int(s) for s in v.shape)

    # -- torch type promotion --------------------------------------------------------------
    def promote(self, *values, kind: str = "DEFAULT") -> str:
        """torch's result dtype for Tensors and python scalars (0-dim tensors rank below
        dimensioned ones, as in torch); ``kind`` is a torch ELEMENTWISE_TYPE_PROMOTION_KIND name."""
        from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

        # promotion depends only on dtype and on whether a tensor is 0-dim, so tiny stand-ins will do
        args = [_stand_in(v.ndim > 0, v.dtype) if isinstance(v, Tensor) else v for v in values if v is not None]
        _, result = elementwise_dtypes(*args, type_promotion_kind=getattr(ELEMENTWISE_TYPE_PROMOTION_KIND, kind))
        return dtypes.from_torch(result)

    def tensor(self, v, dtype: str) -> Tensor:
        """``v`` (a Tensor or python scalar) as a Tensor of ``dtype``."""
        if isinstance(v, Tensor):
            return v.cast(dtype)
        return self.builder.constant(v, dtype)

    def unsupported(self, what: str, hint: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.op} ({what})", self.source, hint)


class Missing:
    """An output of a multi-output op that egraft does not compute (e.g. max-pool indices).

    Rules return it in place of a Tensor; the driver raises UnsupportedOpError
    only if the model actually uses that output.
    """

    __slots__ = ("op", "index", "why")

    def __init__(self, op: str, index: int, why: str):
        self.op, self.index, self.why = op, index, why
