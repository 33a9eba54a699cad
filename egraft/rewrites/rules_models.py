"""Modern-model rules: rewrites around ``MatMul`` that move work onto weights or fuse kernels.

They match the ``MatMul`` idiom (put in the e-graph by ``idioms/matmul``), so
they apply whatever primitives spelt the product.  A *weight matrix* below is
a ``[..., K, N]`` operand that is a batch broadcast (stride 0) of a 2-D
strided view of a weight input; products and concatenations of weight
matrices are weight-only, so :mod:`egraft.backends.fold` computes them once
at load time and the per-call program sees one folded weight.

Concatenated weights are written in primitives (no new op): for parts
``W_i [K, N_i]`` at column offsets ``o_i``::

    j = Iota(N);  part_i = Gather(W_i, bcast(Mod(j + c_i, N_i)), axis=1)
    cat = Where(j < o_2, part_1, Where(j < o_3, part_2, ... part_n))

with ``c_i = N_i * ceil(o_i / N_i) - o_i >= 0`` so every gathered index is in
range and ``(j + c_i) mod N_i = j - o_i`` on part i's columns.  A strided
(e.g. transposed) weight view is materialised the same way: one ``Gather``
from the flattened weight with index ``o + k*s_k + n*s_n``.

Rules:

* ``models/row_scale``: ``(s ⊙ x) @ W = s ⊙ (x @ W)`` when s is constant along K
  (RMSNorm's 1/rms moves after the next Linear);
* ``models/col_scale_in``: ``(x ⊙ g) @ W = x @ (g[:, None] ⊙ W)`` when g is
  constant along M (an RMSNorm/LayerNorm weight folds into the Linear);
* ``models/col_scale_out``: ``(x @ W) ⊙ s = x @ (W ⊙ s)`` when s is constant
  along M (a scalar, a LoRA scaling, an eval-mode batch norm scale after a conv);
* ``models/affine_fold``: ``(x @ W + c) ⊙ s = x @ (W ⊙ s) + c ⊙ s`` (an eval-mode
  batch norm after a conv — a sliding-window view + matmul — folds into the
  weights and bias one scale at a time);
* ``models/matmul_add``: ``x @ A + x @ B = x @ (A + B)`` (merges a LoRA adapter);
* ``models/shared_input``: all matmuls of one input against weight matrices
  become one matmul against the concatenated weights plus slices (QKV,
  gate/up, LoRA's x@A beside x@W);
* ``models/reassoc`` / ``models/reassoc_rev``: ``(x @ A) @ B = x @ (A @ B)``, with
  the product of two weight matrices computed once in 2-D (explosive);
* ``models/pretranspose``: a strided (transposed) weight view feeding a matmul
  becomes a materialised contiguous weight;
* ``models/kv_repeat``: a matmul against K/V heads repeated by an
  expand+reshape (repeat_interleave / repeat_kv) runs on grouped heads with
  the repetition as a stride-0 view, so the repeated tensor never exists.
  (A repeat spelt as a ``Gather`` is not matched.)
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import shapes
from ..ir.builder import GraphBuilder
from .encode import RuleSpec, T, Witness
from .idiom_match import Index, batch_bcast, contig, norm_strides, view


def _dims(rng, k, lo=1, hi=5):
    return tuple(int(x) for x in rng.integers(lo, hi, size=k))


def _matmuls(ix):
    for n in ix.by_op["MatMul"]:
        yield n, n.children[0], n.children[1]


# --- scaling ------------------------------------------------------------------------------------

def _scale_views(ix, c, axis_const):
    """(src, strides, offset) of each View in class c that is constant along `axis_const` (from the end)."""
    sh = ix.shape(c)
    for v in ix.nodes(c, "View"):
        st = norm_strides(sh, v.attrs["strides"])
        if st[len(sh) + axis_const] == 0:
            yield v.children[0], st, v.attrs["offset"]


def _apply_row_scale(snap):
    ix = Index.of(snap)
    for n, a, b in _matmuls(ix):
        out = ix.shape(n.cls)
        for m in ix.nodes(a, "Mul"):
            for x, s in (m.children, m.children[::-1]):
                for src, st, off in _scale_views(ix, s, -1):
                    yield n.cls, T("Mul", T("MatMul", x, b), T("View", src, shape=out, strides=norm_strides(out, st), offset=off))


def _apply_col_scale_in(snap):
    ix = Index.of(snap)
    for n, a, b in _matmuls(ix):
        bsh = ix.shape(b)
        if not ix.weight_only(b):
            continue
        for m in ix.nodes(a, "Mul"):
            for x, s in (m.children, m.children[::-1]):
                for src, st, off in _scale_views(ix, s, -2):
                    if not ix.weight_only(src):
                        continue
                    g = T("View", src, shape=bsh, strides=norm_strides(bsh, st[:-2] + (st[-1], 0)), offset=off)
                    yield n.cls, T("MatMul", x, T("Mul", b, g))


def _mm_frames(ix, c):
    """(MatMul node, reshape attrs or None) for each way class c is a MatMul, possibly seen
    through a contiguous reshape that keeps the last (N) axis (a Linear on 3-D input is
    lowered as a 2-D product reshaped back)."""
    key = ("mm_frames", c)
    if key not in ix._memo:
        ix._memo[key] = list(_mm_frames_of(ix, c))
    return ix._memo[key]


def _mm_frames_of(ix, c):
    for n in ix.nodes(c, "MatMul"):
        yield n, None
    for v in ix.nodes(c, "View"):
        sh = tuple(v.attrs["shape"])
        src = v.children[0]
        if v.attrs["offset"] == 0 and norm_strides(sh, v.attrs["strides"]) == contig(sh) and \
                math.prod(sh) == math.prod(ix.shape(src)) and sh[-1:] == ix.shape(src)[-1:]:
            for n in ix.nodes(src, "MatMul"):
                yield n, v.attrs


def _reframe(term, attrs):
    return term if attrs is None else T("View", term, **attrs.as_dict())


def _apply_col_scale_out(snap):
    ix = Index.of(snap)
    for m in ix.by_op["Mul"]:
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
                    g = T("View", src, shape=bsh, strides=norm_strides(bsh, lead + (0, st[-1])), offset=off)
                    yield m.cls, _reframe(T("MatMul", a, T("Mul", b, g)), fr)


def _apply_matmul_add(snap):
    ix = Index.of(snap)
    for ad in ix.by_op["Add"]:
        p, q = ad.children
        for m1, f1 in _mm_frames(ix, p):
            for m2, f2 in _mm_frames(ix, q):
                b1, b2 = m1.children[1], m2.children[1]
                if f1 == f2 and m1.children[0] == m2.children[0] and ix.shape(b1) == ix.shape(b2) and \
                        ix.weight_only(b1) and ix.weight_only(b2):
                    yield ad.cls, _reframe(T("MatMul", m1.children[0], T("Add", m1.children[1], m2.children[1])), f1)


def _apply_affine_fold(snap):
    """(x @ W + c) ⊙ s = x @ (W ⊙ s) + c ⊙ s for s constant along M: an eval-mode batch
    norm ``(y - mean) * rsqrt(var + eps) * gamma + beta`` after a conv/linear y folds into
    the weights and a bias, one scale at a time."""
    ix = Index.of(snap)
    for m in ix.by_op["Mul"]:
        for p, s in (m.children, m.children[::-1]):
            for ad in ix.nodes(p, "Add"):
                for y, c in (ad.children, ad.children[::-1]):
                    for n in ix.nodes(y, "MatMul"):
                        a, b = n.children
                        bsh = ix.shape(b)
                        if not (ix.weight_only(b) and ix.weight_only(c)):
                            continue
                        for src, st, off in _scale_views(ix, s, -2):
                            if not ix.weight_only(src):
                                continue
                            g = T("View", src, shape=bsh, strides=norm_strides(bsh, st[:-2] + (0, st[-1])), offset=off)
                            yield m.cls, T("Add", T("MatMul", a, T("Mul", b, g)), T("Mul", c, s))


def _wit_affine_fold(rng):
    """A conv as sliding-window view + matmul (channels last), then eval-mode batch norm."""
    b = GraphBuilder()
    bs, cin, cout = _dims(rng, 3, 1, 4)
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


def _mm_wit(rng, prologue=None, epilogue=None, rhs_batch_bcast=True):
    b = GraphBuilder()
    batch = _dims(rng, int(rng.integers(0, 3)))
    m, k, n = _dims(rng, 3, 2, 6)
    x = b.input("x", batch + (m, k), "float32")
    w = b.weight("w", rng.standard_normal((n, k)).astype(np.float32)).T.expand(batch + (k, n))
    if prologue:
        x = prologue(b, x, batch, m, k, rng)
    y = b.add("MatMul", [x, w])
    if epilogue:
        y = epilogue(b, y, batch, m, n, rng)
    return Witness(b.build([y]))


def _wit_row_scale(rng):
    def pro(b, x, batch, m, k, rng):
        s = b.input("s", batch + (m, 1), "float32")
        return x * s if rng.integers(2) else s * x
    return _mm_wit(rng, prologue=pro)


def _wit_col_scale_in(rng):
    def pro(b, x, batch, m, k, rng):
        return x * b.weight("g", rng.standard_normal(k).astype(np.float32))
    return _mm_wit(rng, prologue=pro)


def _wit_col_scale_out(rng):
    def epi(b, y, batch, m, n, rng):
        if rng.integers(2):
            y = y.reshape((-1, 2 if m % 2 == 0 else 1, n))
        if rng.integers(2):
            return y * float(rng.uniform(0.5, 2))
        return y * b.weight("s", rng.standard_normal(n).astype(np.float32))
    return _mm_wit(rng, epilogue=epi)


def _wit_matmul_add(rng):
    b = GraphBuilder()
    batch = _dims(rng, int(rng.integers(0, 3)))
    m, k, n = _dims(rng, 3, 2, 6)
    x = b.input("x", batch + (m, k), "float32")
    w1 = b.weight("w1", rng.standard_normal((k, n)).astype(np.float32)).expand(batch + (k, n))
    w2 = b.weight("w2", rng.standard_normal((k, n)).astype(np.float32)).expand(batch + (k, n))
    y1, y2 = b.add("MatMul", [x, w1]), b.add("MatMul", [x, w2])
    if rng.integers(2):
        y1, y2 = y1.reshape((-1, n)), y2.reshape((-1, n))
    return Witness(b.build([y1 + y2]))


# --- concatenated weights ----------------------------------------------------------------------------

def concat_columns(parts, k: int, dtype: str):
    """``[K, sum N_i]`` concatenation of 2-D terms ``(term, N_i)`` along columns (see module doc)."""
    total = sum(n for _, n in parts)
    j = T("Iota", n=total, dtype="int64")

    def ibc(v):
        return T("View", T("Constant", value=int(v), shape=(), dtype="int64"), shape=(total,), strides=(0,), offset=0)

    def col(t):  # [total] -> [K, total]
        return T("View", t, shape=(k, total), strides=norm_strides((k, total), (0, 1)), offset=0)

    offs = np.cumsum([0] + [n for _, n in parts])[:-1]
    gathered = []
    for (t, n), o in zip(parts, offs):
        c = int(n * math.ceil(o / n) - o)
        idx = T("Mod", T("Add", j, ibc(c)) if c else j, ibc(n))
        gathered.append(T("Gather", t, col(idx), axis=1))
    out = gathered[-1]
    for g, o, (_, n) in reversed(list(zip(gathered[:-1], offs[:-1], parts[:-1]))):
        out = T("Where", col(T("LessThan", j, ibc(o + n))), g, out)
    return out


def _apply_shared_input(snap):
    ix = Index.of(snap)
    groups: dict[int, list] = {}
    for n, a, b in _matmuls(ix):
        wm = ix.weight_matrices(b)
        if wm and ix.is_float(b):
            groups.setdefault(a, []).append((n, b, wm[0]))
    for a, members in groups.items():
        seen, uniq = set(), []
        for n, b, wm in sorted(members, key=lambda t: t[1]):
            if b not in seen:
                seen.add(b)
                uniq.append((n, b, wm))
        if len(uniq) < 2 or len({ix.dtype(b) for _, b, _ in uniq}) != 1:
            continue
        bsh = ix.shape(uniq[0][1])
        batch, k = bsh[:-2], bsh[-2]
        parts = []
        for n, b, (w, st, off) in uniq:
            nn = ix.shape(b)[-1]
            parts.append((ix.matrix_term(w, (k, nn), st, off), nn))
        total = sum(p[1] for p in parts)
        fused = T("MatMul", a, batch_bcast(concat_columns(parts, k, ix.dtype(uniq[0][1])), (k, total), batch))
        osh = ix.shape(a)[:-1] + (total,)
        cs = contig(osh)
        o = 0
        for (n, b, _), (_, nn) in zip(uniq, parts):
            sh = osh[:-1] + (nn,)
            yield n.cls, T("View", fused, shape=sh, strides=norm_strides(sh, cs), offset=o)
            o += nn


def _wit_shared_input(rng):
    b = GraphBuilder()
    batch = _dims(rng, int(rng.integers(0, 3)))
    m, k = _dims(rng, 2, 2, 6)
    x = b.input("x", batch + (m, k), "float32")
    outs = []
    for i in range(int(rng.integers(2, 4))):
        n = int(rng.integers(1, 6))
        w = b.weight(f"w{i}", rng.standard_normal((n, k)).astype(np.float32))
        outs.append(b.add("MatMul", [x, w.T.expand(batch + (k, n))]))
    y = outs[0].sum(-1, keepdim=True) * outs[1].sum(-1, keepdim=True)
    return Witness(b.build([y] + outs[2:]))


# --- re-association ------------------------------------------------------------------------------------

def _product(ix, p, q):
    """``p @ q`` for classes p [..., K, R], q [..., R, N]: in 2-D when both are weight matrices."""
    wp, wq = ix.weight_matrices(p), ix.weight_matrices(q)
    psh, qsh = ix.shape(p), ix.shape(q)
    if wp and wq:
        (w1, s1, o1), (w2, s2, o2) = wp[0], wq[0]
        k, r, n = psh[-2], psh[-1], qsh[-1]
        mm = T("MatMul", ix.matrix_term(w1, (k, r), s1, o1), ix.matrix_term(w2, (r, n), s2, o2))
        return batch_bcast(mm, (k, n), psh[:-2])
    return T("MatMul", p, q)


def _apply_reassoc(snap):
    ix = Index.of(snap)
    for n, xa, b in _matmuls(ix):
        if not ix.weight_only(b):
            continue
        for inner in ix.nodes(xa, "MatMul"):
            x, a = inner.children
            if not ix.weight_only(a):
                continue
            yield n.cls, T("MatMul", x, _product(ix, a, b))


def _apply_reassoc_rev(snap):
    ix = Index.of(snap)
    for n, x, c in _matmuls(ix):
        for inner in ix.nodes(c, "MatMul"):
            a, b = inner.children
            yield n.cls, T("MatMul", T("MatMul", x, a), b)


def _wit_reassoc(rng, rev=False):
    b = GraphBuilder()
    batch = _dims(rng, int(rng.integers(0, 3)))
    m, k, r, n = _dims(rng, 4, 1, 6)
    x = b.input("x", batch + (m, k), "float32")
    wa = b.weight("A", rng.standard_normal((k, r)).astype(np.float32)).expand(batch + (k, r))
    wb = b.weight("B", rng.standard_normal((r, n)).astype(np.float32)).expand(batch + (r, n))
    if rev:
        return Witness(b.build([b.add("MatMul", [x, b.add("MatMul", [wa, wb])])]))
    return Witness(b.build([b.add("MatMul", [b.add("MatMul", [x, wa]), wb])]))


# --- weights in the layout the kernel wants ------------------------------------------------------------

def materialise(ix, w: int, kn, st, off):
    """A contiguous ``[K, N]`` copy of the strided 2-D view (st, off) of weight w, as one Gather."""
    k, n = kn
    numel = math.prod(ix.shape(w))
    flat = view(w, ix.shape(w), (1, numel), (0, 1))

    def axis_index(size, axis, stride):
        io = T("Iota", n=size, dtype="int64")
        st2 = (1, 0) if axis == 0 else (0, 1)
        t = T("View", io, shape=(k, n), strides=norm_strides((k, n), st2), offset=0)
        if stride != 1:
            t = T("Mul", t, T("View", T("Constant", value=int(stride), shape=(), dtype="int64"), shape=(k, n), strides=(0, 0), offset=0))
        return t

    idx = T("Add", axis_index(k, 0, st[0]), axis_index(n, 1, st[1]))
    if off:
        idx = T("Add", idx, T("View", T("Constant", value=int(off), shape=(), dtype="int64"), shape=(k, n), strides=(0, 0), offset=0))
    idx = T("View", idx, shape=(1, k * n), strides=norm_strides((1, k * n), (0, 1)), offset=0)
    g = T("Gather", flat, idx, axis=1)
    return T("View", g, shape=(k, n), strides=contig((k, n)), offset=0)


def _apply_pretranspose(snap):
    ix = Index.of(snap)
    for n, a, b in _matmuls(ix):
        bsh = ix.shape(b)
        kn = bsh[-2:]
        for w, st, off in ix.weight_matrices(b):
            if tuple(st) == contig(kn) and off == 0 and math.prod(ix.shape(w)) == math.prod(kn):
                continue  # already contiguous
            yield n.cls, T("MatMul", a, batch_bcast(materialise(ix, w, kn, st, off), kn, bsh[:-2]))


def _wit_pretranspose(rng):
    return _mm_wit(rng)


def _apply_kv_repeat(snap):
    """MatMul(a, reshape(expand(k))) with a repeated batch axis -> grouped MatMul over a stride-0 view."""
    ix = Index.of(snap)
    for n, a, b in _matmuls(ix):
        bsh, ash = ix.shape(b), ix.shape(a)
        r = len(bsh)
        for v in ix.nodes(b, "View"):
            e = v.children[0]
            st, off = tuple(v.attrs["strides"]), v.attrs["offset"]
            for h in range(r - 2):
                size = bsh[h]
                if size < 2 or st[h] == 0:
                    continue
                for inner in ix.nodes(e, "View"):
                    ish = (tuple(inner.attrs["shape"]), tuple(inner.attrs["strides"]), inner.attrs["offset"])
                    for rep in range(2, size + 1):
                        if size % rep:
                            continue
                        g = size // rep
                        osh = bsh[:h] + (g, rep) + bsh[h + 1:]
                        ost = st[:h] + (st[h] * rep, st[h]) + st[h + 1:]
                        comp = shapes.compose_views(ix.shape(inner.children[0]), ish, (osh, ost, off))
                        if comp is None or comp[1][h + 1] != 0 or comp[1][h] == 0:
                            continue
                        src = inner.children[0]
                        a5sh = ash[:h] + (g, rep) + ash[h + 1:]
                        a5 = view(a, ash, a5sh, contig(a5sh))
                        mm = T("MatMul", a5, T("View", src, shape=comp[0], strides=norm_strides(comp[0], comp[1]), offset=comp[2]))
                        out = ix.shape(n.cls)
                        yield n.cls, T("View", mm, shape=out, strides=contig(out), offset=0)
                        break


def _wit_kv_repeat(rng):
    b = GraphBuilder()
    bs = int(rng.integers(1, 3))
    g, rep = _dims(rng, 2, 2, 4)
    s, d, sk = _dims(rng, 3, 2, 5)
    q = b.input("q", (bs, g * rep, s, d), "float32")
    k = b.input("k", (bs, g, sk, d), "float32")
    krep = k.unsqueeze(2).expand((bs, g, rep, sk, d)).reshape((bs, g * rep, sk, d))
    return Witness(b.build([b.add("MatMul", [q, krep.transpose(-2, -1)])]))


RULES = [
    RuleSpec("models/row_scale", "models", apply=_apply_row_scale, witness=_wit_row_scale,
             doc="(s ⊙ x) @ W = s ⊙ (x @ W), s constant along K"),
    RuleSpec("models/col_scale_in", "models", apply=_apply_col_scale_in, witness=_wit_col_scale_in,
             doc="(x ⊙ g) @ W = x @ (g ⊙ W), g constant along M"),
    RuleSpec("models/col_scale_out", "models", apply=_apply_col_scale_out, witness=_wit_col_scale_out,
             doc="(x @ W) ⊙ s = x @ (W ⊙ s), s constant along M"),
    RuleSpec("models/affine_fold", "models", apply=_apply_affine_fold, witness=_wit_affine_fold,
             doc="(x @ W + c) ⊙ s = x @ (W ⊙ s) + c ⊙ s (batch-norm folding)"),
    RuleSpec("models/matmul_add", "models", apply=_apply_matmul_add, witness=_wit_matmul_add,
             doc="x @ A + x @ B = x @ (A + B)"),
    RuleSpec("models/shared_input", "models", apply=_apply_shared_input, witness=_wit_shared_input,
             doc="x @ W1, x @ W2, ... = slices of x @ cat(W1, W2, ...)"),
    RuleSpec("models/reassoc", "models", apply=_apply_reassoc, witness=_wit_reassoc, explosive=True,
             doc="(x @ A) @ B = x @ (A @ B)"),
    RuleSpec("models/reassoc_rev", "models", apply=_apply_reassoc_rev,
             witness=lambda rng: _wit_reassoc(rng, rev=True), explosive=True,
             doc="x @ (A @ B) = (x @ A) @ B"),
    RuleSpec("models/pretranspose", "models", apply=_apply_pretranspose, witness=_wit_pretranspose,
             doc="x @ strided_view(W) = x @ contiguous copy of that view (weight-only, folded)"),
    RuleSpec("models/kv_repeat", "models", apply=_apply_kv_repeat, witness=_wit_kv_repeat,
             doc="a @ repeat(k) = grouped a @ stride-0 broadcast of k"),
]
