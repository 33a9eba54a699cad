"""Matrix products: mm, bmm, matmul, addmm, baddbmm, linear, mv, dot.

All lower to the builder's ``@`` (``SumReduce(Mul(expand a, expand b))``);
the e-graph recognises the MatMul idiom.  The bias of ``addmm``/``linear`` is
added after the product, as torch does.
"""

from __future__ import annotations

from .table import lowering


def _scaled(t, s):
    return t if s == 1 else t * s


@lowering("aten.mm", "aten.bmm", "aten.matmul", "aten.mv", "aten.dot", "aten.vdot")
def mm(ctx, a, b):
    dt = ctx.dtype
    return a.cast(dt) @ b.cast(dt)


@lowering("aten.addmm", "aten.baddbmm", "aten.addmv", "aten.addbmm")
def addmm(ctx, bias, a, b, beta=1, alpha=1):
    dt = ctx.dtype
    prod = a.cast(dt) @ b.cast(dt)
    if ctx.op.startswith("aten.addbmm"):
        prod = prod.sum(0)
    if beta == 0:  # torch ignores bias (even nan/inf) when beta == 0
        return _scaled(prod, alpha)
    return _scaled(bias.cast(dt), beta) + _scaled(prod, alpha)


@lowering("aten.linear")
def linear(ctx, x, w, bias=None):
    dt = ctx.dtype
    out = x.cast(dt) @ w.cast(dt).T if w.ndim == 2 else x.cast(dt) @ w.cast(dt)
    return out if bias is None else out + bias.cast(dt)
