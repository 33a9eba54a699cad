"""Model rules, weight layout: concatenated weights, re-association, materialised and grouped weights.

They match the ``MatMul`` idiom (put in the e-graph by ``idioms.matmul``).  A
*weight matrix* below is a ``[..., K, N]`` operand that is a batch broadcast
(stride 0) of a 2-D strided view of a weight input; products and
concatenations of weight matrices are weight-only, so
:mod:`egraft.backends.fold` computes them once at load time and the per-call
program sees one folded weight.  (The scaling rules of the same family are in
:mod:`.models_scale`.)

Concatenated weights are written in primitives (no new op): for parts
``W_i [K, N_i]`` at column offsets ``o_i``::

    j = Iota(N);  part_i = Gather(W_i, bcast(Mod(j + c_i, N_i)), axis=1)
    cat = Where(j < o_2, part_1, Where(j < o_3, part_2, ... part_n))

with ``c_i = N_i * ceil(o_i / N_i) - o_i >= 0`` so every gathered index is in
range and ``(j + c_i) mod N_i = j - o_i`` on part i's columns.  A strided
(e.g. transposed) weight view is materialised the same way: one ``Gather``
from the flattened weight with index ``o + k*s_k + n*s_n``.

* ``models.shared-input``: all matmuls of one input against weight matrices
  become one matmul against the concatenated weights plus slices (QKV,
  gate/up, LoRA's x@A beside x@W);
* ``models.reassoc`` / ``models.reassoc-rev``: ``(x @ A) @ B = x @ (A @ B)``, with
  the product of two weight matrices computed once in 2-D (explosive);
* ``models.pretranspose``: a strided (transposed) weight view feeding a matmul
  becomes a materialised contiguous weight;
* ``models.kv-repeat``: a matmul against K/V heads repeated by an
  expand+reshape (repeat_interleave / repeat_kv) runs on grouped heads with
  the repetition as a stride-0 view, so the repeated tensor never exists.
  (A repeat spelt as a ``Gather`` is not matched.)
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import Op, strided
from ...ir.builder import GraphBuilder
from ..rule import RuleSpec, Witness, contig, dims, norm_strides, term, view
from .match import Index, batch_bcast, matmuls

# --- concatenated weights ----------------------------------------------------------------------------

def concat_columns(parts, k: int, dtype: str):
    """``[K, sum N_i]`` concatenation of 2-D terms ``(term, N_i)`` along columns (see module doc)."""
    total = sum(n for _, n in parts)
    j = term("Iota", n=total, dtype="int64")

    def ibc(v):
        return term("View", term("Constant", value=int(v), shape=(), dtype="int64"), shape=(total,), strides=(0,), offset=0)

    def col(t):  # [total] -> [K, total]
        return term("View", t, shape=(k, total), strides=norm_strides((k, total), (0, 1)), offset=0)

    offs = np.cumsum([0] + [n for _, n in parts])[:-1]
    gathered = []
    for (t, n), o in zip(parts, offs):
        c = int(n * math.ceil(o / n) - o)
        idx = term("Mod", term("Add", j, ibc(c)) if c else j, ibc(n))
        gathered.append(term("Gather", t, col(idx), axis=1))
    out = gathered[-1]
    for g, o, (_, n) in reversed(list(zip(gathered[:-1], offs[:-1], parts[:-1]))):
        out = term("Where", col(term("LessThan", j, ibc(o + n))), g, out)
    return out


def _apply_shared_input(snap):
    ix = Index.of(snap)
    groups: dict[int, list] = {}
    for n, a, b in matmuls(ix):
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
        fused = term("MatMul", a, batch_bcast(concat_columns(parts, k, ix.dtype(uniq[0][1])), (k, total), batch))
        osh = ix.shape(a)[:-1] + (total,)
        cs = contig(osh)
        o = 0
        for (n, b, _), (_, nn) in zip(uniq, parts):
            sh = osh[:-1] + (nn,)
            yield n.cls, term("View", fused, shape=sh, strides=norm_strides(sh, cs), offset=o)
            o += nn


def _w_shared_input(rng):
    b = GraphBuilder()
    batch = dims(rng, int(rng.integers(0, 3)))
    m, k = dims(rng, 2, 2, 6)
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
        mm = term("MatMul", ix.matrix_term(w1, (k, r), s1, o1), ix.matrix_term(w2, (r, n), s2, o2))
        return batch_bcast(mm, (k, n), psh[:-2])
    return term("MatMul", p, q)


def _apply_reassoc(snap):
    ix = Index.of(snap)
    for n, xa, b in matmuls(ix):
        if not ix.weight_only(b):
            continue
        for inner in ix.nodes(xa, Op.MatMul):
            x, a = inner.children
            if not ix.weight_only(a):
                continue
            yield n.cls, term("MatMul", x, _product(ix, a, b))


def _apply_reassoc_rev(snap):
    ix = Index.of(snap)
    for n, x, c in matmuls(ix):
        for inner in ix.nodes(c, Op.MatMul):
            a, b = inner.children
            yield n.cls, term("MatMul", term("MatMul", x, a), b)


def _w_reassoc(rng, rev=False):
    b = GraphBuilder()
    batch = dims(rng, int(rng.integers(0, 3)))
    m, k, r, n = dims(rng, 4, 1, 6)
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
        io = term("Iota", n=size, dtype="int64")
        st2 = (1, 0) if axis == 0 else (0, 1)
        t = term("View", io, shape=(k, n), strides=norm_strides((k, n), st2), offset=0)
        if stride != 1:
            t = term("Mul", t, term("View", term("Constant", value=int(stride), shape=(), dtype="int64"), shape=(k, n), strides=(0, 0), offset=0))
        return t

    idx = term("Add", axis_index(k, 0, st[0]), axis_index(n, 1, st[1]))
    if off:
        idx = term("Add", idx, term("View", term("Constant", value=int(off), shape=(), dtype="int64"), shape=(k, n), strides=(0, 0), offset=0))
    idx = term("View", idx, shape=(1, k * n), strides=norm_strides((1, k * n), (0, 1)), offset=0)
    g = term("Gather", flat, idx, axis=1)
    return term("View", g, shape=(k, n), strides=contig((k, n)), offset=0)


def _apply_pretranspose(snap):
    ix = Index.of(snap)
    for n, a, b in matmuls(ix):
        bsh = ix.shape(b)
        kn = bsh[-2:]
        for w, st, off in ix.weight_matrices(b):
            if tuple(st) == contig(kn) and off == 0 and math.prod(ix.shape(w)) == math.prod(kn):
                continue  # already contiguous
            yield n.cls, term("MatMul", a, batch_bcast(materialise(ix, w, kn, st, off), kn, bsh[:-2]))

def _w_pretranspose(rng):
    """x @ W^T, W a [N, K] weight read through a transposed (strided) view."""
    b = GraphBuilder()
    batch = dims(rng, int(rng.integers(0, 3)))
    m, k, n = dims(rng, 3, 2, 6)
    x = b.input("x", batch + (m, k), "float32")
    w = b.weight("w", rng.standard_normal((n, k)).astype(np.float32)).T.expand(batch + (k, n))
    return Witness(b.build([b.add("MatMul", [x, w])]))


def _apply_kv_repeat(snap):
    """MatMul(a, reshape(expand(k))) with a repeated batch axis -> grouped MatMul over a stride-0 view."""
    ix = Index.of(snap)
    for n, a, b in matmuls(ix):
        bsh, ash = ix.shape(b), ix.shape(a)
        r = len(bsh)
        for v in ix.nodes(b, Op.View):
            e = v.children[0]
            st, off = tuple(v.attrs["strides"]), v.attrs["offset"]
            for h in range(r - 2):
                size = bsh[h]
                if size < 2 or st[h] == 0:
                    continue
                for inner in ix.nodes(e, Op.View):
                    ish = (tuple(inner.attrs["shape"]), tuple(inner.attrs["strides"]), inner.attrs["offset"])
                    for rep in range(2, size + 1):
                        if size % rep:
                            continue
                        g = size // rep
                        osh = bsh[:h] + (g, rep) + bsh[h + 1:]
                        ost = st[:h] + (st[h] * rep, st[h]) + st[h + 1:]
                        comp = strided.compose_views(ix.shape(inner.children[0]), ish, (osh, ost, off))
                        if comp is None or comp[1][h + 1] != 0 or comp[1][h] == 0:
                            continue
                        src = inner.children[0]
                        a5sh = ash[:h] + (g, rep) + ash[h + 1:]
                        a5 = view(a, ash, a5sh, contig(a5sh))
                        mm = term("MatMul", a5, term("View", src, shape=comp[0], strides=norm_strides(comp[0], comp[1]), offset=comp[2]))
                        out = ix.shape(n.cls)
                        yield n.cls, term("View", mm, shape=out, strides=contig(out), offset=0)
                        break


def _kv_heads(interleaved: bool):
    """q @ k^T with K's G heads repeated to G*R: interleaved (head h reads h // R, what GQA does) or tiled
    (h reads h % G: no head pairs up with its neighbour, the rule's near-miss)."""
    def wit(rng):
        b = GraphBuilder()
        bs = int(rng.integers(1, 3))
        g, rep = dims(rng, 2, 2, 4)
        s, d, sk = dims(rng, 3, 2, 5)
        q = b.input("q", (bs, g * rep, s, d), "float32")
        k = b.input("k", (bs, g, sk, d), "float32")
        if interleaved:
            krep = k.unsqueeze(2).expand((bs, g, rep, sk, d)).reshape((bs, g * rep, sk, d))
        else:
            krep = k.unsqueeze(1).expand((bs, rep, g, sk, d)).reshape((bs, rep * g, sk, d))
        return Witness(b.build([b.add("MatMul", [q, krep.transpose(-2, -1)])]))
    return wit


_w_kv_repeat = _kv_heads(interleaved=True)


# --- near-misses: the guard is violated, the rule must not fire ----------------------------------------

def _nm_matmuls(kind):
    """x @ W1 beside x @ Y (Y an input: one weight matrix, nothing to share); (x @ A) @ Y and
    (x @ Y) @ W (not weight-only); x @ W with W already contiguous (nothing to pretranspose)."""
    def wit(rng):
        b = GraphBuilder()
        m, k, n = dims(rng, 3, 2, 6)
        x = b.input("x", (m, k), "float32")
        w = b.weight("w", rng.standard_normal((k, n)).astype(np.float32))
        xw = b.add("MatMul", [x, w])
        if kind == "shared-input":
            return Witness(b.build([xw, b.add("MatMul", [x, b.input("y", (k, n), "float32")])]))
        if kind == "reassoc":
            return Witness(b.build([b.add("MatMul", [xw, b.input("y", (n, k), "float32")])]))
        if kind == "reassoc-inner":
            return Witness(b.build([b.add("MatMul", [b.add("MatMul", [x, b.input("y", (k, k), "float32")]), w])]))
        return Witness(b.build([xw]))
    return wit


_nm_kv_repeat = _kv_heads(interleaved=False)


RULES = [
    RuleSpec("models.shared-input", apply=_apply_shared_input, witness=_w_shared_input, near_misses=(_nm_matmuls("shared-input"),),
             doc="x @ W1, x @ W2, ... = slices of x @ cat(W1, W2, ...)"),
    RuleSpec("models.reassoc", apply=_apply_reassoc, witness=_w_reassoc, explosive=True, near_misses=(_nm_matmuls("reassoc"), _nm_matmuls("reassoc-inner")),
             doc="(x @ A) @ B = x @ (A @ B)"),
    RuleSpec("models.reassoc-rev", apply=_apply_reassoc_rev,
             witness=lambda rng: _w_reassoc(rng, rev=True), explosive=True,
             doc="x @ (A @ B) = (x @ A) @ B"),
    RuleSpec("models.pretranspose", apply=_apply_pretranspose, witness=_w_pretranspose, near_misses=(_nm_matmuls("pretranspose"),),
             doc="x @ strided_view(W) = x @ contiguous copy of that view (weight-only, folded)"),
    RuleSpec("models.kv-repeat", apply=_apply_kv_repeat, witness=_w_kv_repeat, near_misses=(_nm_kv_repeat,),
             doc="a @ repeat(k) = grouped a @ stride-0 broadcast of k"),
]
