"""Model rules, scaling and fusion: move a scale or an add across a ``MatMul`` onto the weights.

They match the ``MatMul`` idiom (put in the e-graph by ``idioms.matmul``), so
they apply whatever primitives spelt the product.  Work moved onto weights is
weight-only, so :mod:`egraft.backends.fold` computes it once at load time and
the per-call program sees one folded weight.  (The weight-layout rules of the
same family are in :mod:`.models_weights`.)

* ``models.row-scale``: ``(s ⊙ x) @ W = s ⊙ (x @ W)`` when s is constant along K
  (RMSNorm's 1/rms moves after the next Linear);
* ``models.col-scale-in``: ``(x ⊙ g) @ W = x @ (g[:, None] ⊙ W)`` when g is
  constant along M (an RMSNorm/LayerNorm weight folds into the Linear);
* ``models.col-scale-out``: ``(x @ W) ⊙ s = x @ (W ⊙ s)`` when s is constant
  along M (a scalar, a LoRA scaling, an eval-mode batch norm scale after a conv);
* ``models.affine-fold``: ``(x @ W + c) ⊙ s = x @ (W ⊙ s) + c ⊙ s`` (an eval-mode
  batch norm after a conv — a sliding-window view + matmul — folds into the
  weights and bias one scale at a time);
* ``models.matmul-add``: ``x @ A + x @ B = x @ (A + B)`` (merges a LoRA adapter).
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import Op
from ...ir.builder import GraphBuilder
from ..rule import RuleSpec, Witness, contig, dims, norm_strides, term
from .match import Index, matmuls

# --- scaling ------------------------------------------------------------------------------------

def _scale_views(ix, c, axis_const):
    """(src, strides, offset) of each View in class c that is constant along `axis_const` (from the end)."""
    sh = ix.shape(c)
    for v in ix.nodes(c, Op.View):
        st = norm_strides(sh, v.attrs["strides"])
        if st[len(sh) + axis_const] == 0:
            yield v.children[0], st, v.attrs["offset"]


def _apply_row_scale(snap):
    ix = Index.of(snap)
    for n, a, b in matmuls(ix):
        out = ix.shape(n.cls)
        for m in ix.nodes(a, Op.Mul):
            for x, s in (m.children, m.children[::-1]):
                for src, st, off in _scale_views(ix, s, -1):
                    yield n.cls, term("Mul", term("MatMul", x, b), term("View", src, shape=out, strides=norm_strides(out, st), offset=off))


def _apply_col_scale_in(snap):
    ix = Index.of(snap)
    for n, a, b in matmuls(ix):
        bsh = ix.shape(b)
        if not ix.weight_only(b):
            continue
        for m in ix.nodes(a, Op.Mul):
            for x, s in (m.children, m.children[::-1]):
                for src, st, off in _scale_views(ix, s, -2):
                    if not ix.weight_only(src):
                        continue
                    g = term("View", src, shape=bsh, strides=norm_strides(bsh, st[:-2] + (st[-1], 0)), offset=off)
                    yield n.cls, term("MatMul", x, term("Mul", b, g))


def _mm_frames(ix, c):
    """(MatMul node, reshape attrs or None) for each way class c is a MatMul, possibly seen
    through a contiguous reshape that keeps the last (N) axis (a Linear on 3-D input is
    lowered as a 2-D product reshaped back)."""
    key = ("mm_frames", c)
    return ix.memo(key, lambda: list(_mm_frames_of(ix, c)))


def _mm_frames_of(ix, c):
    for n in ix.nodes(c, Op.MatMul):
        yield n, None
    for v in ix.nodes(c, Op.View):
        sh = tuple(v.attrs["shape"])
        src = v.children[0]
        if v.attrs["offset"] == 0 and norm_strides(sh, v.attrs["strides"]) == contig(sh) and \
                math.prod(sh) == math.prod(ix.shape(src)) and sh[-1:] == ix.shape(src)[-1:]:
            for n in ix.nodes(src, Op.MatMul):
                yield n, v.attrs


def _reframe(t, attrs):
    return t if attrs is None else term("View", t, **attrs.as_dict())


def _apply_col_scale_out(snap):
    ix = Index.of(snap)
    for m in ix.by_op[Op.Mul]:
        for p, s in (m.children, m.children[::-1]):
            for n, fr in _mm_frames(ix, p):
                a, b = n.children
                bsh = ix.shape(b)
                if not ix.weight_only(b):
                    continue
                for src, st, off in _scale_views(ix, s, -2):
                    if not ix.weight_only(src):
                        continue
                    if fr is not None and any(st[:-1]):
                        continue  # through a reshape only a per-column scale is safe
                    lead = (0,) * (len(bsh) - 2) if fr is not None else st[:-2]
                    g = term("View", src, shape=bsh, strides=norm_strides(bsh, lead + (0, st[-1])), offset=off)
                    yield m.cls, _reframe(term("MatMul", a, term("Mul", b, g)), fr)


def _apply_matmul_add(snap):
    ix = Index.of(snap)
    for ad in ix.by_op[Op.Add]:
        p, q = ad.children
        for m1, f1 in _mm_frames(ix, p):
            for m2, f2 in _mm_frames(ix, q):
                b1, b2 = m1.children[1], m2.children[1]
                if f1 == f2 and m1.children[0] == m2.children[0] and ix.shape(b1) == ix.shape(b2) and \
                        ix.weight_only(b1) and ix.weight_only(b2):
                    yield ad.cls, _reframe(term("MatMul", m1.children[0], term("Add", m1.children[1], m2.children[1])), f1)


def _apply_affine_fold(snap):
    """(x @ W + c) ⊙ s = x @ (W ⊙ s) + c ⊙ s for s constant along M: an eval-mode batch
    norm ``(y - mean) * rsqrt(var + eps) * gamma + beta`` after a conv/linear y folds into
    the weights and a bias, one scale at a time."""
    ix = Index.of(snap)
    for m in ix.by_op[Op.Mul]:
        for p, s in (m.children, m.children[::-1]):
            for ad in ix.nodes(p, Op.Add):
                for y, c in (ad.children, ad.children[::-1]):
                    for n in ix.nodes(y, Op.MatMul):
                        a, b = n.children
                        bsh = ix.shape(b)
                        if not (ix.weight_only(b) and ix.weight_only(c)):
                            continue
                        for src, st, off in _scale_views(ix, s, -2):
                            if not ix.weight_only(src):
                                continue
                            g = term("View", src, shape=bsh, strides=norm_strides(bsh, st[:-2] + (0, st[-1])), offset=off)
                            yield m.cls, term("Add", term("MatMul", a, term("Mul", b, g)), term("Mul", c, s))


def _w_affine_fold(rng):
    """A conv as sliding-window view + matmul (channels last), then eval-mode batch norm."""
    b = GraphBuilder()
    bs, cin, cout = dims(rng, 3, 1, 4)
    h = int(rng.integers(3, 6))
    x = b.input("x", (bs, h, cin), "float32")
    kw = 2
    win = x.view_as_strided((bs, h - kw + 1, kw, cin), (h * cin, cin, cin, 1))
    patches = win.reshape((bs, h - kw + 1, kw * cin))
    w = b.weight("w", rng.standard_normal((kw * cin, cout)).astype(np.float32)).expand((bs, kw * cin, cout))
    y = b.add("MatMul", [patches, w])
    wt = {k: b.weight(k, (rng.standard_normal(cout) if k != "var" else rng.uniform(0.5, 1.5, cout)).astype(np.float32))
          for k in ("mean", "var", "gamma", "beta")}
    out = (y - wt["mean"]) * (wt["var"] + 1e-5).rsqrt() * wt["gamma"] + wt["beta"]
    return Witness(b.build([out]))


def _w_matmul(rng, prologue=None, epilogue=None, rhs_batch_bcast=True):
    b = GraphBuilder()
    batch = dims(rng, int(rng.integers(0, 3)))
    m, k, n = dims(rng, 3, 2, 6)
    x = b.input("x", batch + (m, k), "float32")
    w = b.weight("w", rng.standard_normal((n, k)).astype(np.float32)).T.expand(batch + (k, n))
    if prologue:
        x = prologue(b, x, batch, m, k, rng)
    y = b.add("MatMul", [x, w])
    if epilogue:
        y = epilogue(b, y, batch, m, n, rng)
    return Witness(b.build([y]))


# --- the other forms and the near-misses ------------------------------------------------------------

def _w_row_scale_form(first=False, along_k=None):
    """(s * x) @ W with s [.., M, 1] (s first or second); near-misses, s varies along K:
    ``"vector"`` a [K] vector broadcast over M, ``"transposed"`` a transposed [.., K, M] input."""
    def wit(rng):
        def pro(b, x, batch, m, k, rng):
            if along_k == "vector":
                s = b.input("s", (k,), "float32")
            elif along_k == "transposed":
                s = b.input("s", batch + (k, m), "float32").transpose(-2, -1)
            else:
                s = b.input("s", batch + (m, 1), "float32")
            return s * x if first else x * s
        return _w_matmul(rng, prologue=pro)
    return wit


def _w_col_scale_in_form(first=False, along_m=False):
    """(x * g) @ W with g a [K] weight; near-miss: g a [M, 1] weight broadcast over K (varies along M)."""
    def wit(rng):
        def pro(b, x, batch, m, k, rng):
            g = b.weight("g", rng.standard_normal((m, 1) if along_m else (k,)).astype(np.float32))
            return g * x if first else x * g
        return _w_matmul(rng, prologue=pro)
    return wit


def _w_col_scale_out_form(reshape=False, scalar=False, first=False, along_m=False):
    """(x @ W) * s, through a keep-N reshape or not, s a scalar or a [N] weight (or first);
    near-miss: s a weight that varies along M (through the reshape: per row of the reshape)."""
    def wit(rng):
        b = GraphBuilder()
        batch = dims(rng, int(rng.integers(0, 3)))
        m, k, n = dims(rng, 3, 2, 6)
        m = 2 * m if reshape else m  # even: the reshape to (-1, 2, N) keeps N last
        x = b.input("x", batch + (m, k), "float32")
        y = b.add("MatMul", [x, b.weight("w", rng.standard_normal((n, k)).astype(np.float32)).T.expand(batch + (k, n))])
        if reshape:
            y = y.reshape((-1, 2, n))
        if scalar:
            c = float(rng.uniform(0.5, 2))
            return Witness(b.build([c * y if first else y * c]))
        ssh = ((y.shape[0], 1, n) if reshape else (m, n)) if along_m else (n,)
        w = b.weight("s", rng.standard_normal(ssh).astype(np.float32))
        return Witness(b.build([w * y if first else y * w]))
    return wit


def _w_affine_near(rng):
    """(x @ W + c) * s with s a [M, 1] weight broadcast over N: it varies along M."""
    b = GraphBuilder()
    m, k, n = dims(rng, 3, 2, 5)
    x = b.input("x", (m, k), "float32")
    y = b.add("MatMul", [x, b.weight("w", rng.standard_normal((k, n)).astype(np.float32))])
    c = b.weight("c", rng.standard_normal(n).astype(np.float32))
    return Witness(b.build([(y + c) * b.weight("s", rng.standard_normal((m, 1)).astype(np.float32))]))


def _w_matmul_add_form(reshape=False, other_input=False):
    """x @ A + x @ B (through a reshape); near-miss: x @ A + y @ B."""
    def wit(rng):
        b = GraphBuilder()
        m, k, n = dims(rng, 3, 2, 6)
        x = b.input("x", (2, m, k), "float32")
        y = b.input("y", (2, m, k), "float32") if other_input else x
        w1, w2 = (b.weight(f"w{i}", rng.standard_normal((k, n)).astype(np.float32)).expand((2, k, n)) for i in (1, 2))
        y1, y2 = b.add("MatMul", [x, w1]), b.add("MatMul", [y, w2])
        if reshape:
            y1, y2 = y1.reshape((-1, n)), y2.reshape((-1, n))
        return Witness(b.build([y1 + y2]))
    return wit


RULES = [
    RuleSpec("models.row-scale", apply=_apply_row_scale, witness=_w_row_scale_form(), witnesses=(_w_row_scale_form(first=True),),
             near_misses=(_w_row_scale_form(along_k="vector"), _w_row_scale_form(True, "transposed")),
             doc="(s ⊙ x) @ W = s ⊙ (x @ W), s constant along K"),
    RuleSpec("models.col-scale-in", apply=_apply_col_scale_in, witness=_w_col_scale_in_form(), witnesses=(_w_col_scale_in_form(first=True),),
             near_misses=(_w_col_scale_in_form(along_m=True),),
             doc="(x ⊙ g) @ W = x @ (g ⊙ W), g constant along M"),
    RuleSpec("models.col-scale-out", apply=_apply_col_scale_out, witness=_w_col_scale_out_form(),
             witnesses=(_w_col_scale_out_form(first=True), _w_col_scale_out_form(scalar=True), _w_col_scale_out_form(True),
                        _w_col_scale_out_form(True, True), _w_col_scale_out_form(True, True, True)),
             near_misses=(_w_col_scale_out_form(along_m=True), _w_col_scale_out_form(True, along_m=True)),
             doc="(x @ W) ⊙ s = x @ (W ⊙ s), s constant along M"),
    RuleSpec("models.affine-fold", apply=_apply_affine_fold, witness=_w_affine_fold, near_misses=(_w_affine_near,),
             doc="(x @ W + c) ⊙ s = x @ (W ⊙ s) + c ⊙ s (batch-norm folding)"),
    RuleSpec("models.matmul-add", apply=_apply_matmul_add, witness=_w_matmul_add_form(), witnesses=(_w_matmul_add_form(True),),
             near_misses=(_w_matmul_add_form(other_input=True),),
             doc="x @ A + x @ B = x @ (A + B)"),
]
