"""Neural-network ATen ops: softmax family, norms, attention, convolution, pooling.

These are the ops the decomposition table keeps whole (``frontend.tracer``) so that
their lowering is the *primitive form the e-graph's idiom rules recognise*
(``softmax_decomposed``, ``layernorm_decomposed``, ``attention_decomposed``,
a sliding-window View feeding a matmul for convolution) rather than whatever
torch's own decomposition would have produced.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ...ir import dtypes, shapes
from ...ir.builder import Tensor, cat as _cat
from ...ir.decompose import attention_decomposed
from . import helpers as h
from .table import Missing, lowering


# --- softmax family ------------------------------------------------------------------------

@lowering("aten._softmax", "aten.softmax", upcast=True)
def softmax(ctx, x, dim, half_to_float_or_dtype=None):
    x = x.cast(ctx.dtype)
    return x.softmax(dim) if x.ndim else x * 0.0 + 1.0


@lowering("aten._log_softmax", "aten.log_softmax", upcast=True)
def log_softmax(ctx, x, dim, half_to_float_or_dtype=None):
    x = x.cast(ctx.dtype)
    return x.log_softmax(dim) if x.ndim else x * 0.0


@lowering("aten._safe_softmax", upcast=True)
def safe_softmax(ctx, x, dim, dtype=None):
    """softmax, but 0 (not NaN) on rows that are all -inf (fully masked attention rows)."""
    x = x.cast(ctx.dtype)
    dim = shapes.normalize_axis(dim, x.ndim)
    m = x.max(dim, keepdim=True)
    dead = h.eq(m, m.builder.constant(-math.inf, m.dtype, m.shape))  # a row holding nan is nan, not dead
    return Tensor.where(dead, 0.0, x.softmax(dim))


# --- norms ---------------------------------------------------------------------------------------

def _affine(out, weight, bias, shape):
    if weight is not None:
        out = out * weight.cast(out.dtype).reshape(shape)
    if bias is not None:
        out = out + bias.cast(out.dtype).reshape(shape)
    return out


def _flatten_tail(x: Tensor, k: int) -> Tensor:
    lead = x.shape[: x.ndim - k]
    return x.reshape(lead + (math.prod(x.shape[x.ndim - k:]),))


@lowering("aten.native_layer_norm", "aten.layer_norm", upcast=True)
def layer_norm(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, *_):
    x = x.cast(ctx.dtype)
    k = len(normalized_shape)
    xf = _flatten_tail(x, k)
    out = _affine(xf.layer_norm(eps).reshape(x.shape), weight, bias, tuple(normalized_shape))
    if ctx.op.startswith("aten.layer_norm"):
        return out
    stat_shape = x.shape[: x.ndim - k] + (1,) * k
    mu = xf.mean(-1, keepdim=True)
    d = xf - mu
    rstd = ((d * d).mean(-1, keepdim=True) + eps).rsqrt()
    return out, mu.reshape(stat_shape), rstd.reshape(stat_shape)


@lowering("aten.rms_norm", upcast=True)
def rms_norm(ctx, x, normalized_shape, weight=None, eps=None):
    if eps is None:
        eps = torch.finfo(getattr(torch, ctx.out_dtype)).eps
    x = x.cast(ctx.dtype)
    xf = _flatten_tail(x, len(normalized_shape))
    return _affine(xf.rms_norm(eps).reshape(x.shape), weight, None, tuple(normalized_shape))


@lowering("aten.native_group_norm", upcast=True)
def group_norm(ctx, x, weight, bias, n, c, hw, groups, eps):
    x = x.cast(ctx.dtype)
    xg = x.reshape((n, groups, -1))
    out = xg.layer_norm(eps).reshape(x.shape)
    out = _affine(out, weight, bias, (c,) + (1,) * (x.ndim - 2))
    mu = xg.mean(-1)
    d = xg - mu.unsqueeze(-1)
    rstd = ((d * d).mean(-1) + eps).rsqrt()
    return out, mu, rstd


@lowering("aten._native_batch_norm_legit_no_training", upcast=True)
def batch_norm_eval(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    x = x.cast(ctx.dtype)
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    # torch's form: x * alpha + beta, alpha = weight / sqrt(var + eps), beta = bias - mean * alpha
    alpha = (running_var.cast(x.dtype).reshape(shape) + eps).rsqrt()
    if weight is not None:
        alpha = alpha * weight.cast(x.dtype).reshape(shape)
    beta = (0.0 if bias is None else bias.cast(x.dtype).reshape(shape)) - running_mean.cast(x.dtype).reshape(shape) * alpha
    why = "batch norm's saved statistics exist only in training mode"
    return x * alpha + beta, Missing(ctx.op, 1, why), Missing(ctx.op, 2, why)


# --- attention ---------------------------------------------------------------------------------------

@lowering("aten.scaled_dot_product_attention", upcast=True)
def sdpa(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise ctx.unsupported(f"dropout_p={dropout_p}", "attention dropout is random; pass dropout_p=0.0 "
                              "when not training (e.g. dropout_p=self.dropout if self.training else 0.0)")
    dt = ctx.dtype
    q, k, v = q.cast(dt), k.cast(dt), v.cast(dt)
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:  # grouped-query attention: repeat_interleave K/V heads
        rep = q.shape[-3] // k.shape[-3]
        k, v = (_repeat_heads(t, rep) for t in (k, v))
    batch = shapes.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q = q.expand(batch + q.shape[-2:])
    k = k.expand(batch + k.shape[-2:])
    v = v.expand(batch + v.shape[-2:])
    bias = alive = None
    if attn_mask is not None:
        full = batch + (q.shape[-2], k.shape[-2])
        if attn_mask.dtype == "bool":
            bias = Tensor.where(attn_mask, 0.0, -math.inf).cast(dt).expand(full)
        else:
            bias = attn_mask.cast(dt).expand(full)
        # torch returns 0 for a row whose every score is -inf after the mask is added (a nan or +inf score
        # there makes the row nan); the scores are attention_decomposed's own nodes (the builder shares them)
        s = q.matmul(k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale) + bias
        m = s.max(-1, keepdim=True)
        alive = ~h.eq(m, m.builder.constant(-math.inf, m.dtype, m.shape))
    out = attention_decomposed(q, k, v, bias=bias, scale=scale, causal=bool(is_causal))
    return out if alive is None else Tensor.where(alive, out, 0.0)


def _repeat_heads(t: Tensor, rep: int) -> Tensor:
    s = t.shape
    return t.unsqueeze(-3).expand(s[:-2] + (rep,) + s[-2:]).reshape(s[:-3] + (s[-3] * rep,) + s[-2:])


# --- convolution ---------------------------------------------------------------------------------------

def _per_dim(v, nd):
    v = [v] if isinstance(v, int) else list(v)
    return v * nd if len(v) == 1 else v


def _windows(x: Tensor, nd: int, kernel, stride, dilation) -> tuple[Tensor, list[int]]:
    """Sliding windows over the last ``nd`` axes: [..., *out, *kernel] as one strided View."""
    cs = shapes.contiguous_strides(x.shape)
    lead = x.ndim - nd
    out = [(x.shape[lead + i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    shape = list(x.shape[:lead]) + out + list(kernel)
    strides = list(cs[:lead]) + [stride[i] * cs[lead + i] for i in range(nd)] + [dilation[i] * cs[lead + i] for i in range(nd)]
    return x.view_as_strided(shape, strides, 0), out


@lowering("aten.convolution")
def convolution(ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    nd = w.ndim - 2
    stride, padding, dilation = _per_dim(stride, nd), _per_dim(padding, nd), _per_dim(dilation, nd)
    dt = ctx.dtype
    x, w = x.cast(dt), w.cast(dt)
    if transposed:
        x, w, padding = _transposed_as_direct(ctx, x, w, stride, padding, dilation, _per_dim(output_padding, nd), groups)
        stride = [1] * nd
    for i, p in enumerate(padding):
        if p:
            x = x.pad(2 + i, p, p, 0)
    n, c = x.shape[:2]
    cout, cg = w.shape[:2]
    kernel = list(w.shape[2:])
    g = groups
    win, out = _windows(x.reshape((n, g, cg) + x.shape[2:]), nd, kernel, stride, dilation)
    # win: [n, g, cg, *out, *kernel] -> [n, g, P, cg*K]
    perm = [0, 1] + [3 + i for i in range(nd)] + [2] + [3 + nd + i for i in range(nd)]
    p_, k_ = math.prod(out), cg * math.prod(kernel)
    cols = win.permute(perm).reshape((n, g, p_, k_))
    wmat = w.reshape((g, cout // g, k_)).transpose(-2, -1)  # [g, cg*K, cout/g]
    y = (cols @ wmat).transpose(-2, -1).reshape((n, cout) + tuple(out))
    if bias is not None:
        y = y + bias.cast(dt).reshape((cout,) + (1,) * nd)
    return y


def _transposed_as_direct(ctx, x, w, stride, padding, dilation, output_padding, groups):
    """conv_transpose = direct conv of the zero-stuffed input with the flipped, in/out-swapped kernel."""
    nd = w.ndim - 2
    for i, s in enumerate(stride):
        if s > 1:
            n = x.shape[2 + i]
            m = (n - 1) * s + 1
            pos = np.arange(m)
            idx = ctx.builder.tensor_constant((pos // s).astype(np.int64))
            keep = ctx.builder.tensor_constant(pos % s == 0)
            g = x.index_select(2 + i, idx)
            vshape = tuple(m if d == 2 + i else 1 for d in range(x.ndim))
            x = Tensor.where(keep.reshape(vshape), g, ctx.builder.constant(0, x.dtype))
    new_pad = []
    for i in range(nd):
        before = dilation[i] * (w.shape[2 + i] - 1) - padding[i]
        after = before + output_padding[i]
        axis = 2 + i
        if before < 0:
            x, before = x.slice(axis, -before, None), 0
        if after < 0:
            x, after = x.slice(axis, 0, x.shape[axis] + after), 0
        if before or after:
            x = x.pad(axis, before, after, 0)
        new_pad.append(0)
    cin, coutg = w.shape[:2]
    k = w.shape[2:]
    wt = w.reshape((groups, cin // groups, coutg) + k).transpose(1, 2).reshape((groups * coutg, cin // groups) + k)
    for i in range(nd):
        wt = wt.flip(2 + i)
    return x, wt, new_pad


# --- pooling ---------------------------------------------------------------------------------------------

def _pool_geometry(length, k, s, p, d, ceil_mode):
    span = d * (k - 1) + 1
    num = length + 2 * p - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= length + p:
        out -= 1
    return out, max((out - 1) * s + span - length - p, 0)


def _pool_args(x, kernel_size, stride, padding, dilation):
    nd = len(kernel_size)
    kernel = list(kernel_size)
    stride = _per_dim(stride, nd) if stride else kernel
    return nd, kernel, stride, _per_dim(padding, nd), _per_dim(dilation, nd)


@lowering("aten.max_pool2d_with_indices", "aten.max_pool3d_with_indices", "aten.max_pool1d", "aten.max_pool2d")
def max_pool(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    nd, kernel, stride, padding, dilation = _pool_args(x, kernel_size, stride, padding, dilation)
    lowest = -math.inf if dtypes.is_float(x.dtype) else int(np.iinfo(dtypes.to_numpy(x.dtype)).min)
    lead = x.ndim - nd
    for i in range(nd):
        _, extra = _pool_geometry(x.shape[lead + i], kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
        if padding[i] or extra:
            x = x.pad(lead + i, padding[i], extra, lowest)
    win, out = _windows(x, nd, kernel, stride, dilation)
    y = win.max(tuple(range(win.ndim - nd, win.ndim)))
    if ctx.op.startswith("aten.max_pool") and "with_indices" in ctx.op:
        return y, Missing(ctx.op, 1, "max-pool indices are not lowered (only the pooled values)")
    return y


@lowering("aten.avg_pool1d", "aten.avg_pool2d", "aten.avg_pool3d", upcast=True)
def avg_pool(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    nd, kernel, stride, padding, _ = _pool_args(x, kernel_size, stride, padding, 1)
    x = x.cast(ctx.dtype)
    lead = x.ndim - nd
    divisors = []
    for i in range(nd):
        length = x.shape[lead + i]
        n_out, extra = _pool_geometry(length, kernel[i], stride[i], padding[i], 1, ceil_mode)
        if padding[i] or extra:
            x = x.pad(lead + i, padding[i], extra, 0)
        starts = np.arange(n_out) * stride[i] - padding[i]
        ends = np.minimum(starts + kernel[i], length + padding[i])
        counts = ends - starts if count_include_pad else np.minimum(ends, length) - np.maximum(starts, 0)
        divisors.append(counts.astype(np.float64))
    win, out = _windows(x, nd, kernel, stride, [1] * nd)
    y = win.sum(tuple(range(win.ndim - nd, win.ndim)))
    if divisor_override:
        return y * (1.0 / divisor_override)
    div = divisors[0]
    for d in divisors[1:]:
        div = np.multiply.outer(div, d)
    recip = ctx.builder.tensor_constant((1.0 / div).astype(dtypes.to_numpy(y.dtype)))
    return y * recip


@lowering("aten._adaptive_avg_pool2d", "aten._adaptive_avg_pool3d", "aten.adaptive_avg_pool1d", upcast=True)
def adaptive_avg_pool(ctx, x, output_size):
    x = x.cast(ctx.dtype)
    nd = len(output_size)
    lead = x.ndim - nd
    for i, n_out in enumerate(output_size):
        axis, length = lead + i, x.shape[lead + i]
        if length % n_out == 0:  # equal windows: one reshape and mean
            k = length // n_out
            x = x.reshape(x.shape[:axis] + (n_out, k) + x.shape[axis + 1:]).mean(axis + 1)
            continue
        # windows [floor(o*L/n), ceil((o+1)*L/n)); a mean per window, not a matmul with an averaging matrix,
        # whose zero weights would turn an inf outside the window into nan
        bounds = [((o * length) // n_out, -(-((o + 1) * length) // n_out)) for o in range(n_out)]
        x = _cat([x.slice(axis, s, e).mean(axis, keepdim=True) for s, e in bounds], axis)
    return x


@lowering("aten.upsample_nearest1d", "aten.upsample_nearest2d", "aten.upsample_nearest3d")
def upsample_nearest(ctx, x, output_size=None, *scales):
    """Nearest (torch's legacy 'nearest': src = floor(dst * in/out), or * 1/scale when a scale is given)."""
    out_shape = ctx.shape
    nd = len(out_shape) - 2
    flat = []
    for v in scales:  # .vec overload: one list of scale factors; .default: one float per dim
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    for i in range(nd):
        axis = 2 + i
        n_in, n_out = x.shape[axis], out_shape[axis]
        given = flat[i] if len(flat) == nd and flat[i] else None
        scale = 1.0 / given if given else n_in / n_out
        idx = np.minimum(np.floor(np.arange(n_out) * np.float32(scale)).astype(np.int64), n_in - 1)
        x = x.index_select(axis, ctx.builder.tensor_constant(idx))
    return x


def _linear_axis(ctx, x: Tensor, axis: int, n_out: int, align_corners: bool, scale_factor) -> Tensor:
    """Linear interpolation along one axis: two Gathers and constant weights (torch's source-index rule)."""
    n_in = x.shape[axis]
    dst = np.arange(n_out, dtype=np.float64)
    if align_corners:
        src = dst * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
    else:
        scale = 1.0 / scale_factor if scale_factor else n_in / n_out
        src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
    src = src.astype(np.float32)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = (src - i0).astype(np.float32)
    shape = tuple(n_out if d == axis else 1 for d in range(x.ndim))
    dt = dtypes.to_numpy(x.dtype)
    a = x.index_select(axis, ctx.builder.tensor_constant(i0))
    b = x.index_select(axis, ctx.builder.tensor_constant(i1))
    lam1 = ctx.builder.tensor_constant(w1.astype(dt).reshape(shape))
    lam0 = ctx.builder.tensor_constant((1.0 - w1).astype(dt).reshape(shape))
    return a * lam0 + b * lam1


@lowering("aten.upsample_linear1d", "aten.upsample_bilinear2d", "aten.upsample_trilinear3d", upcast=True)
def upsample_linear(ctx, x, output_size, align_corners, *scales):
    x = x.cast(ctx.dtype)
    nd = len(ctx.shape) - 2
    flat = []
    for v in scales:
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    for i in range(nd):
        given = flat[i] if len(flat) == nd else None
        x = _linear_axis(ctx, x, 2 + i, ctx.shape[2 + i], bool(align_corners), given)
    return x
