"""The primitive form of each idiom, written with the builder's ``Tensor``.

An idiom (``egraft.ir.idioms``) is a named composition of primitives; this
module holds that composition.  The torch lowering writes it (through the
``Tensor`` methods below), the e-graph's idiom rules put the idiom node in
the same e-class, :func:`egraft.ir.decompose.decompose` rewrites an idiom
node of a graph back into it, and tests/ir checks it against the idiom's
numpy semantics.  It sits below the builder (it needs only ``Tensor``'s
methods, reached through its arguments) so that ``Tensor`` can offer
``x @ y`` and ``x.softmax()`` without an import circle.
"""

from __future__ import annotations

from ..errors import IRError
from . import dtypes, shapes
from .tensor_base import TensorBase, in_float32, promote


def matmul_decomposed(a, b):
    """``a @ b`` with numpy broadcasting of batch dims, as SumReduce(Mul(expand a, expand b)).

    Half-precision operands are multiplied and accumulated in float32 and the
    result rounded once, as the MatMul idiom (and every GPU matmul) does;
    rounding each product to half first would drift from it.
    """
    dt = promote(a.dtype, b.dtype)
    a, b = a.cast(dt), b.cast(dt)
    if dtypes.is_half(dt):
        return matmul_decomposed(a.cast(dtypes.compute_name(dt)), b.cast(dtypes.compute_name(dt))).cast(dt)
    squeeze_m = squeeze_n = False
    if a.ndim == 1:
        a, squeeze_m = a.unsqueeze(0), True
    if b.ndim == 1:
        b, squeeze_n = b.unsqueeze(-1), True
    if a.shape[-1] != b.shape[-2]:
        raise IRError(f"matmul shapes {a.shape} and {b.shape} do not line up")
    batch = shapes.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a3 = a.expand(batch + (m, k)).unsqueeze(-1).expand(batch + (m, k, n))
    b3 = b.expand(batch + (k, n)).unsqueeze(-3).expand(batch + (m, k, n))
    out = (a3 * b3).sum(-2)
    if squeeze_m:
        out = out.squeeze(-2)
    if squeeze_n:
        out = out.squeeze(-1)
    return out


@in_float32
def softmax_decomposed(x, axis):
    x = x.float_()
    e = (x - x.max(axis, keepdim=True)).exp()
    return e * e.sum(axis, keepdim=True).recip()


@in_float32
def layernorm_decomposed(x, axis, eps):
    x = x.float_()
    d = x - x.mean(axis, keepdim=True)
    return d * ((d * d).mean(axis, keepdim=True) + eps).rsqrt()


@in_float32
def rmsnorm_decomposed(x, axis, eps):
    x = x.float_()
    return x * ((x * x).mean(axis, keepdim=True) + eps).rsqrt()


def attention_decomposed(q, k, v, bias=None, scale=None, causal=False):
    """softmax(q k^T * scale + bias [+ causal mask]) v, in primitives."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q.matmul(k.transpose(-2, -1)) * scale
    if bias is not None:
        s = s + bias
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        i = q.builder.iota(sq, "int64").reshape((sq, 1))
        j = q.builder.iota(sk, "int64").reshape((1, sk))
        s = TensorBase.where(j <= i, s, float("-inf"))
    return s.softmax(-1).matmul(v)


# idiom name -> primitive form, called as form(*inputs, **attrs) with the idiom node's inputs and attributes
DECOMPOSITIONS = {
    "MatMul": matmul_decomposed,
    "Softmax": softmax_decomposed,
    "LayerNorm": layernorm_decomposed,
    "RMSNorm": rmsnorm_decomposed,
    "Attention": attention_decomposed,
}


class IdiomMethods:
    """Mixin of :class:`~egraft.ir.builder.Tensor`: the idioms (and log_softmax) in primitive form."""

    __slots__ = ()

    def matmul(self, other):
        return matmul_decomposed(self, other)

    __matmul__ = matmul

    def softmax(self, axis=-1):
        return softmax_decomposed(self, shapes.normalize_axis(axis, self.ndim))

    @in_float32
    def log_softmax(self, axis=-1):
        axis = shapes.normalize_axis(axis, self.ndim)
        x = self.float_()
        s = x - x.max(axis, keepdim=True)
        return s - s.exp().sum(axis, keepdim=True).log()

    def layer_norm(self, eps: float):
        return layernorm_decomposed(self, self.ndim - 1, eps)

    def rms_norm(self, eps: float):
        return rmsnorm_decomposed(self, self.ndim - 1, eps)
