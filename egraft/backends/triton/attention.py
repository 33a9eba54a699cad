"""The Attention idiom as one single-pass kernel (online softmax, flash-attention style).

One program owns ``BLOCK_M`` query rows of one batch element and walks the
keys in ``BLOCK_N`` blocks, keeping the running row max ``m_i``, the running
denominator ``l_i`` and the unnormalised output ``acc``; the ``[Sq, Sk]``
score matrix never exists in memory.  q, k, v and the bias are evaluated
through the kernel writer, so transposes, head splits and GQA expansion
(stride-0 views) are index arithmetic, and elementwise producers (rotary
embeddings, scaling) are fused in as a prologue.

Fully masked rows give NaN (0/0), as the reference softmax of all ``-inf`` does.
"""

from __future__ import annotations

from ...errors import BackendError
from .emitter import Ix, Val
from .matmul import _HALF, _operand


def _arange(w, block, size, extent, axis, prefix, start=None):
    sl = "[None, :]" if axis == 1 else "[:, None]"
    expr = f"tl.arange(0, {size}){sl}" if start is None else f"{start} + tl.arange(0, {size}){sl}"
    ix = w.new_index(expr, block, axes={axis}, prefix=prefix)
    if w.ctx["sizes"][size] > extent or start is not None and extent % w.ctx["sizes"][size]:
        m = w.let(f"{ix.expr} < {extent}", block, f"{prefix}_mask")
        w.ctx["mask_block"][m] = block
        w.ctx["mask_axes"][m] = frozenset({axis})
        return Ix(ix.expr, block, frozenset({m}), ix.axes), m
    return ix, None


def emit_attention(w, nid, node, idx):
    if w.rank != 2 or idx[-2].axes - {0} or idx[-1].axes - {1} or not w.ctx["col"]["whole"]:
        raise BackendError(f"internal: attention %{nid} is not at the output tile of an attention kernel")
    q, k, v = node.inputs[:3]
    bias = node.inputs[3] if len(node.inputs) == 4 else None
    g = w.graph
    D, Sk = g.nodes[q].shape[-1], g.nodes[k].shape[-2]
    dt = node.dtype
    batch, m, dv = tuple(idx[:-2]), idx[-2], idx[-1]
    BM, BN, BD, BDV = "BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV"
    parent = w.deepest(*idx)
    w.comment(nid, parent)
    dq, dq_mask = _arange(w, parent, BD, D, 1, "dq")
    qv = w.value(q, batch + (m, dq))
    qt = w.let(_operand(w, qv, BM, BD, dq_mask, dt, parent), qv.block, "q_tile")
    mi, li, acc = w.fresh("m_i"), w.fresh("l_i"), w.fresh("acc")
    w.line(parent, f'{mi} = tl.full([{BM}, 1], float("-inf"), tl.float32)')
    w.line(parent, f"{li} = tl.zeros([{BM}, 1], tl.float32)")
    w.line(parent, f"{acc} = tl.zeros([{BM}, {BDV}], tl.float32)")
    n0 = w.fresh("n0")
    body = w.open_loop(f"for {n0} in range(0, {Sk}, {BN}):", parent)
    nk, nk_mask = _arange(w, body, BN, Sk, 1, "kcol", start=n0)
    dk, dk_mask = _arange(w, body, BD, D, 0, "dk")
    kv = w.value(k, batch + (nk, dk))
    kmask = " & ".join(x for x in (nk_mask, dk_mask) if x) or None
    kt = _operand(w, kv, BD, BN, kmask, dt, body)
    s = w.fresh("s")
    prec = "" if dt in _HALF else f', input_precision="{w.ctx.get("input_precision", "ieee")}"'
    w.line(body, f"{s} = tl.dot({qt}, {kt}{prec}) * {float(node.attrs['scale'])!r}")
    if bias is not None:
        bv = w.value(bias, batch + (m, nk))
        w.line(body, f"{s} = {s} + {bv.expr}")
    valid = [x for x in (nk_mask,) if x]
    if node.attrs["causal"]:
        valid.append(f"({nk.expr} <= {m.expr})")
    if valid:
        w.line(body, f'{s} = tl.where({" & ".join(valid)}, {s}, float("-inf"))')
    mn, mu, p, alpha = w.fresh("m_new"), w.fresh("m_use"), w.fresh("p"), w.fresh("alpha")
    w.line(body, f"{mn} = tl.maximum({mi}, tl.max({s}, axis=1, keep_dims=True))")
    w.line(body, f'{mu} = tl.where({mn} == float("-inf"), 0.0, {mn})  # rows with nothing visible yet')
    w.line(body, f"{p} = tl.exp({s} - {mu})")
    w.line(body, f"{alpha} = tl.exp({mi} - {mu})")
    w.line(body, f"{li} = {li} * {alpha} + tl.sum({p}, axis=1, keep_dims=True)")
    nv, nv_mask = _arange(w, body, BN, Sk, 0, "vrow", start=n0)
    vv = w.value(v, batch + (nv, dv))
    vmask = " & ".join(sorted(x for x in (nv_mask, *dv.masks) if x)) or None
    vt = _operand(w, vv, BN, BDV, vmask, dt, body)
    pe = f"{p}.to({_HALF[dt]})" if dt in _HALF else p
    w.line(body, f"{acc} = {acc} * {alpha} + tl.dot({pe}, {vt}{prec})")
    w.line(body, f"{mi} = {mn}")
    w.close_loop(body)
    out = w.let(f"{acc} / {li}", parent, f"attn{nid}")
    return Val(out, dt, parent, m.masks | dv.masks, frozenset({0, 1}))
