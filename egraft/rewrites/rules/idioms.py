"""Idiom rules: put MatMul / Softmax / LayerNorm / RMSNorm / Attention e-nodes in the
e-class of their primitive form, and the online-softmax (flash) form of softmax·V.

All rules are procedural (``apply(snapshot)``): the primitive forms are
spelt with views whose exact strides depend on how the builder composed
them, so the matchers in :mod:`egraft.rewrites.rules.match` check what a view
*means* (a broadcast along an axis, a keepdim reshape) rather than its text.
Each idiom's primitive form is the one ``egraft.ir.idioms.*_decomposed``
writes; a rule fires only when shapes and dtypes make the idiom well typed.

The online-softmax form
-----------------------
``softmax(s) @ v`` over a key axis of length ``Sk = T * t`` equals, per query
row, the combination of per-tile triples (``m_j`` tile max, ``l_j`` tile sum
of ``exp(s - m_j)``, ``o_j`` tile ``exp(s - m_j) @ v_j``)::

    m = max_j m_j,  a_j = exp(m_j - m),  out = (sum_j a_j o_j) / (sum_j a_j l_j)

This is the identity flash attention streams over (a running max and a
rescaled running sum); written with the tile axis ``T`` explicit, the tiles
are independent, so a backend can run them as one single-pass kernel (or a
split-K/flash-decoding kernel) and the program stays plain primitives plus
``MatMul`` that ``ir.evaluate`` runs.  A fully masked tile (``m_j = -inf``)
uses 0 as its shift, so it contributes ``a_j = 0`` instead of NaN; a fully
masked row gives NaN exactly like the original softmax.  One tile size per
match (the largest of :data:`TILES` that splits ``Sk`` into >= 2 tiles)
keeps the rule from multiplying alternatives.
"""

from __future__ import annotations

import math

from ...ir import Op
from ..rule import RuleSpec, contig, scalar, term, view
from .idiom_witnesses import witnesses
from .match import Index, close, is_causal_mask

LOG2E = 1.0 / math.log(2.0)
TILES = (128, 64, 32, 16, 8, 4, 2)


# --- MatMul -----------------------------------------------------------------------------------

def _apply_matmul(snap):
    """SumReduce(Mul(View(a) expanded over N, View(b) expanded over M), axis=-2) -> MatMul."""
    ix = Index.of(snap)
    for n in ix.by_op[Op.SumReduce]:
        (p,) = n.children
        sh = ix.shape(p)
        r = len(sh)
        if r < 3 or n.attrs["axis"] != r - 2 or not ix.is_float(p):
            continue
        for m in ix.nodes(p, Op.Mul):
            for x, y in (m.children, m.children[::-1]):
                for va in ix.nodes(x, Op.View):
                    sa = va.attrs["strides"]
                    if sh[-1] != 1 and sa[r - 1] != 0:
                        continue
                    for vb in ix.nodes(y, Op.View):
                        sb = vb.attrs["strides"]
                        if sh[-3] != 1 and sb[r - 3] != 0:
                            continue
                        a, b = va.children[0], vb.children[0]
                        ash = sh[:-1]
                        bsh = sh[:-3] + sh[-2:]
                        at = view(a, ix.shape(a), ash, sa[:-1], va.attrs["offset"])
                        bt = view(b, ix.shape(b), bsh, sb[:r - 3] + sb[r - 2:], vb.attrs["offset"])
                        yield n.cls, term("MatMul", at, bt)


# --- Softmax, LayerNorm, RMSNorm --------------------------------------------------------------

def _apply_softmax(snap):
    """e * bcast(recip(sum(e))) with e = exp2((x - bcast(max x)) * log2 e) -> Softmax(x)."""
    ix = Index.of(snap)
    for n in ix.by_op[Op.Mul]:
        for e, bsrc in (n.children, n.children[::-1]):
            for ex in ix.nodes(e, Op.Exp2):
                for d, l2e in ix.scaled(ex.children[0]):
                    if not close(l2e, LOG2E):
                        continue
                    for ad in ix.nodes(d, Op.Add):
                        for x, nm in (ad.children, ad.children[::-1]):
                            for ax in ix.bcast_axes(bsrc):
                                if _is_neg_max(ix, nm, x, ax) and _is_recip_sum(ix, bsrc, e, ax):
                                    yield n.cls, term("Softmax", x, axis=ax)


def _is_neg_max(ix, nm, x, ax):
    for k in ix.bcast_sources(nm, ax):
        for a in ix.level_alts(k, ax):
            for mx, v in ix.scaled(a):
                if v == -1.0 and any(True for _ in ix.reduced_of(mx, ax, "MaxReduce", x)):
                    return True
    return False


def _is_recip_sum(ix, bsrc, e, ax):
    for k in ix.bcast_sources(bsrc, ax):
        for rc in ix.find(k, ax, "Recip"):
            if any(True for _ in ix.reduced_of(rc.children[0], ax, "SumReduce", e)):
                return True
    return False


def _rsqrt_of_mean_eps(ix, bsrc, ax, sq_of):
    """eps such that bsrc = bcast(recip(sqrt(mean(sq) + eps))) with ``sq_of(sq)`` true."""
    for k in ix.bcast_sources(bsrc, ax):
        for rc in ix.find(k, ax, "Recip"):
            for sq in ix.find(rc.children[0], ax, "Sqrt"):
                for ad in ix.find(sq.children[0], ax, "Add"):
                    for mean, epsc in (ad.children, ad.children[::-1]):
                        eps = ix.scalar(epsc)
                        if eps is None or not isinstance(eps, float):
                            continue
                        for y in ix.mean_of(mean, ax):
                            if sq_of(y):
                                yield eps


def _is_square(ix, y, x):
    return any(m.children == (x, x) for m in ix.nodes(y, Op.Mul))


def _apply_rmsnorm(snap):
    """x * bcast(rsqrt(mean(x*x) + eps)) -> RMSNorm(x, eps)."""
    ix = Index.of(snap)
    for n in ix.by_op[Op.Mul]:
        for x, bsrc in (n.children, n.children[::-1]):
            if not ix.is_float(x):
                continue
            for ax in ix.bcast_axes(bsrc):
                for eps in _rsqrt_of_mean_eps(ix, bsrc, ax, lambda y: _is_square(ix, y, x)):
                    yield n.cls, term("RMSNorm", x, axis=ax, eps=eps)


def _apply_layernorm(snap):
    """d * bcast(rsqrt(mean(d*d) + eps)), d = x - bcast(mean x) -> LayerNorm(x, eps)."""
    ix = Index.of(snap)
    for n in ix.by_op[Op.Mul]:
        for d, bsrc in (n.children, n.children[::-1]):
            for ad in ix.nodes(d, Op.Add):
                for x, nmu in (ad.children, ad.children[::-1]):
                    if not ix.is_float(x):
                        continue
                    for ax in ix.bcast_axes(bsrc):
                        if not _is_neg_mean(ix, nmu, x, ax):
                            continue
                        for eps in _rsqrt_of_mean_eps(ix, bsrc, ax, lambda y: _is_square(ix, y, d)):
                            yield n.cls, term("LayerNorm", x, axis=ax, eps=eps)


def _is_neg_mean(ix, nmu, x, ax):
    for k in ix.bcast_sources(nmu, ax):
        for a in ix.level_alts(k, ax):
            for mu, v in ix.scaled(a):
                if v == -1.0 and any(y == x for y in ix.mean_of(mu, ax)):
                    return True
    return False


# --- Attention ------------------------------------------------------------------------------------

def _scores(ix, s):
    """(q, kT, scale) for each way class s is ``q @ kT * scale`` (or unscaled)."""
    for mm in ix.nodes(s, Op.MatMul):
        yield mm.children[0], mm.children[1], 1.0
    for a, v in ix.scaled(s):
        for mm in ix.nodes(a, Op.MatMul):
            yield mm.children[0], mm.children[1], float(v)


def _untranspose(ix, kt):
    """Terms k ``[..., Sk, D]`` whose last-two-axes transpose is class kt ``[..., D, Sk]``."""
    sh = ix.shape(kt)
    ksh = sh[:-2] + (sh[-1], sh[-2])
    for v in ix.nodes(kt, Op.View):
        st = list(v.attrs["strides"])
        st[-1], st[-2] = st[-2], st[-1]
        src = v.children[0]
        yield view(src, ix.shape(src), ksh, st, v.attrs["offset"])


def _softmax_matmuls(ix):
    """(matmul node, softmax input, v) for every ``Softmax(s, last axis) @ v`` in the snapshot."""
    for n in ix.by_op[Op.MatMul]:
        p, v = n.children
        r = len(ix.shape(p))
        for sm in ix.nodes(p, Op.Softmax):
            if sm.attrs["axis"] == r - 1:
                yield n, sm.children[0], v


def _apply_attention(snap):
    """softmax(q kT * scale [+ bias] [causal mask]) @ v -> Attention(q, k, v[, bias])."""
    ix = Index.of(snap)
    for n, sx, v in _softmax_matmuls(ix):
        cands = [(sx, False)]
        for w in ix.nodes(sx, Op.Where):
            c, s1, fill = w.children
            f = ix.scalar(fill)
            if f is None and ix.nodes(fill, Op.View):
                f = _opaque_scalar(ix, fill)
            if f == float("-inf") and ix.is_float(s1) and is_causal_mask(ix, c):
                cands.append((s1, True))
        for s, causal in cands:
            forms = [(q, kt, sc, None) for q, kt, sc in _scores(ix, s)]
            for ad in ix.nodes(s, Op.Add):
                for s2, bias in (ad.children, ad.children[::-1]):
                    forms += [(q, kt, sc, bias) for q, kt, sc in _scores(ix, s2)]
            for q, kt, sc, bias in forms:
                for k in _untranspose(ix, kt):
                    kids = (q, k, v) if bias is None else (q, k, v, bias)
                    yield n.cls, term("Attention", *kids, scale=sc, causal=causal)


def _opaque_scalar(ix, c):
    for vw in ix.nodes(c, Op.View):
        if not any(vw.attrs["strides"]):
            for k in ix.nodes(vw.children[0], Op.Constant):
                if tuple(k.attrs["shape"]) == ():
                    return k.attrs["value"]
    return None


# --- online softmax (flash) form --------------------------------------------------------------------

def online_softmax_terms(ix: Index, s: int, v: int, t: int):
    """The tiled online-softmax term for ``softmax(s, -1) @ v`` with tile length t (see module doc)."""
    ssh, vsh, dt = ix.shape(s), ix.shape(v), ix.dtype(s)
    *batch, sq, sk = ssh
    batch = tuple(batch)
    dv = vsh[-1]
    nt = sk // t
    nb = len(batch)
    s4sh = batch + (sq, nt, t)
    s4 = view(s, ssh, s4sh, contig(s4sh))
    mtsh = batch + (sq, nt)
    mt = term("MaxReduce", s4, axis=nb + 2)
    ninf = term("Constant", value=float("-inf"), shape=(), dtype=dt)
    live = term("LessThan", term("View", ninf, shape=mtsh, strides=(0,) * len(mtsh), offset=0), mt)
    shift = term("Where", live, mt, scalar(0.0, dt, mtsh))
    shift4 = term("View", shift, shape=s4sh, strides=contig(mtsh) + (0,), offset=0)
    p = term("Exp2", term("Mul", term("Add", s4, term("Mul", shift4, scalar(-1.0, dt, s4sh))), scalar(LOG2E, dt, s4sh)))
    lt = term("SumReduce", p, axis=nb + 2)
    cs = contig(s4sh)
    ptsh = batch + (nt, sq, t)
    pt = term("View", p, shape=ptsh, strides=cs[:nb] + (cs[nb + 1], cs[nb], cs[nb + 2]), offset=0)
    vtsh = batch + (nt, t, dv)
    vt = view(v, vsh, vtsh, contig(vtsh))
    ot = term("MatMul", pt, vt)  # [*batch, T, Sq, Dv]
    m = term("MaxReduce", mt, axis=nb + 1)
    mb = term("View", m, shape=mtsh, strides=contig(batch + (sq,)) + (0,), offset=0)
    alpha = term("Exp2", term("Mul", term("Add", mt, term("Mul", mb, scalar(-1.0, dt, mtsh))), scalar(LOG2E, dt, mtsh)))
    l_tot = term("SumReduce", term("Mul", alpha, lt), axis=nb + 1)
    ca = contig(mtsh)
    osh = batch + (nt, sq, dv)
    alpha_o = term("View", alpha, shape=osh, strides=ca[:nb] + (ca[nb + 1], ca[nb], 0), offset=0)
    o_tot = term("SumReduce", term("Mul", alpha_o, ot), axis=nb)  # [*batch, Sq, Dv]
    out_sh = batch + (sq, dv)
    inv = term("View", term("Recip", l_tot), shape=out_sh, strides=contig(batch + (sq,)) + (0,), offset=0)
    return term("Mul", o_tot, inv)


def tile_for(sk: int) -> int | None:
    return next((t for t in TILES if sk % t == 0 and sk // t >= 2), None)


def _apply_online_softmax(snap):
    ix = Index.of(snap)
    for n, s, v in _softmax_matmuls(ix):
        t = tile_for(ix.shape(s)[-1]) if ix.is_float(s) else None
        if t is not None:
            yield n.cls, online_softmax_terms(ix, s, v, t)


def _spec(name, fn, doc):
    return RuleSpec(name, apply=fn, doc=doc, **witnesses(name.split(".")[1]))


RULES = [
    _spec("idioms.matmul", _apply_matmul, "SumReduce(Mul(expand a, expand b), -2) = MatMul(a, b)"),
    _spec("idioms.softmax", _apply_softmax, "exp(x - max x) / sum exp(x - max x) = Softmax(x)"),
    _spec("idioms.layernorm", _apply_layernorm, "(x - mean x) * rsqrt(var x + eps) = LayerNorm(x, eps)"),
    _spec("idioms.rmsnorm", _apply_rmsnorm, "x * rsqrt(mean(x*x) + eps) = RMSNorm(x, eps)"),
    _spec("idioms.attention", _apply_attention, "softmax(q k^T scale [+ bias] [causal]) v = Attention(q, k, v[, bias])"),
    _spec("idioms.online-softmax", _apply_online_softmax,
          "softmax(s) @ v = per-tile (max, sum, exp @ v) triples rescaled by exp(m_tile - m)"),
]
