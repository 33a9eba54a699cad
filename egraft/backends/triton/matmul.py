"""Matrix products as ``tl.dot`` over a K loop, for the MatMul idiom and its primitive form.

The primitive form ``SumReduce(Mul(a3, b3), axis=k)`` over a product of
shape ``[..., M, K, N]`` (recognised by :mod:`egraft.ir.matmul_form`) is a
matmul when one factor does not vary along N (``a3``, usually ``View(A)``
with stride 0 there) and the other does not vary along M.  Recognising it
keeps primitive graphs from materialising the ``[M, K, N]`` product: each
factor is evaluated at a ``[BLOCK_M, BLOCK_K]`` or ``[BLOCK_K, BLOCK_N]``
tile, with its producers (views, casts, scales) fused in as a prologue; the consumer's elementwise epilogue (bias,
activation, residual, row scale) is applied to the accumulator before the
single store.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import BackendError
from ...ir import Op, dtypes
from ...ir.graph import Graph
from ...ir.matmul_form import matmul_form
from .emitter import ZERO, Ix, Val

DOT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_HALF = {d: f"tl.{dtypes.row(d).triton}" for d in dtypes.HALF_DTYPES}


@dataclass(frozen=True)
class DotForm:
    """out[b..., m, n] = sum_k A(b..., m, k) * B(b..., k, n), A/B given as node + index layout."""

    a: int
    b: int
    a_layout: tuple  # per dim of a's node: "b<i>" batch i, "m", "k", "n", or "0"
    b_layout: tuple
    K: int
    dtype: str

    def index(self, layout, batch, m, k, n):
        out = []
        for role in layout:
            if role == "m":
                out.append(m)
            elif role == "k":
                out.append(k)
            elif role == "n":
                out.append(n)
            elif role == "0":
                out.append(ZERO)
            else:
                out.append(batch[int(role[1:])])
        return tuple(out)


def dot_form(graph: Graph, nid: int) -> DotForm | None:
    """The matmul this node computes, or None.

    A primitive product is one when the IR's :func:`~egraft.ir.matmul_form.matmul_form`
    finds it and its output's last two axes are M and N: one factor constant
    along N (indexed with 0 there) and the other along M.
    """
    n = graph.nodes[nid]
    if n.dtype not in DOT_DTYPES or len(n.shape) < 2:
        return None
    r = len(n.shape)
    if n.op == Op.MatMul:
        batch = tuple(f"b{i}" for i in range(r - 2))
        a, b = n.inputs
        return DotForm(a, b, batch + ("m", "k"), batch + ("k", "n"), graph.nodes[a].shape[-1], n.dtype)
    form = matmul_form(graph, nid)
    if form is None:
        return None
    ka = form.k
    pdim = [form.product_axis(d) for d in range(r)]  # output dim -> product dim
    ma, na = pdim[r - 2], pdim[r - 1]
    form = form.oriented(ma, na)
    if form is None:
        return None
    roles = {pd: f"b{od}" for od, pd in enumerate(pdim[:-2])}
    a_layout = tuple("m" if d == ma else "k" if d == ka else "0" if d == na else roles[d] for d in range(r + 1))
    b_layout = tuple("0" if d == ma else "k" if d == ka else "n" if d == na else roles[d] for d in range(r + 1))
    return DotForm(form.lhs.node, form.rhs.node, a_layout, b_layout, form.K, n.dtype)


def _operand(w, v: Val, rows: str, cols: str, kmask: str | None, dt: str, mask_block) -> str:
    """A [rows, cols] operand tile for tl.dot: full shape, zero beyond K, in the dot's input dtype.  `kmask` (masks
    joined by ``&``) is defined in `mask_block` (a K loop's body): a value that does not vary along K (a broadcast,
    computed before the loop) is masked there, not in its own block."""
    e = v.expr
    if not (set(v.axes) >= {0, 1}):
        e = w.let(f"tl.broadcast_to({e}, [{rows}, {cols}])", v.block, "bc")
    if kmask and not (v.expr.startswith("ld") and set(kmask.split(" & ")) <= set(v.masks)):
        # a load masked along K is zero where K runs past its end; a computed operand, or a load that does not vary
        # along K (broadcast over it: K = 1 in a rotary embedding's outer product), is not
        e = w.let(f"tl.where({kmask}, {e}, 0.0)", mask_block, "opnd")
    if dt in _HALF:
        e = f"{e}.to({_HALF[dt]})"
    return e


def emit_dot(w, nid, node, idx):
    form: DotForm = w.ctx["dots"][nid]
    if w.rank != 2 or len(idx) < 2 or idx[-2].axes - {0} or idx[-1].axes - {1}:
        raise BackendError(f"internal: matmul %{nid} is not at the output tile of a dot kernel")
    batch, m, n = tuple(idx[:-2]), idx[-2], idx[-1]
    bm, bn, bk = w.ctx["BM"], w.ctx["BN"], w.ctx["BK"]
    K = form.K
    parent = w.deepest(*idx)
    w.comment(nid, parent)
    acc = w.fresh(f"acc{nid}")
    w.line(parent, f"{acc} = tl.zeros([{bm}, {bn}], tl.float32)" if form.dtype != "float64"
           else f"{acc} = tl.zeros([{bm}, {bn}], tl.float64)")
    k0 = w.fresh("k0")
    body = w.open_loop(f"for {k0} in range(0, {K}, {bk}):", parent)
    need_mask = K % w.ctx["BK_value"] != 0
    ka = w.new_index(f"{k0} + tl.arange(0, {bk})[None, :]", body, axes={1}, prefix="ka")
    kb = w.new_index(f"{k0} + tl.arange(0, {bk})[:, None]", body, axes={0}, prefix="kb")
    kam = kbm = None
    if need_mask:
        kam = w.let(f"{ka.expr} < {K}", body, "ka_mask")
        kbm = w.let(f"{kb.expr} < {K}", body, "kb_mask")
        w.ctx["mask_block"][kam] = body
        w.ctx["mask_block"][kbm] = body
        w.ctx["mask_axes"][kam] = frozenset({1})
        w.ctx["mask_axes"][kbm] = frozenset({0})
        ka = Ix(ka.expr, body, frozenset({kam}), ka.axes)
        kb = Ix(kb.expr, body, frozenset({kbm}), kb.axes)
    a = w.value(form.a, form.index(form.a_layout, batch, m, ka, n))
    b = w.value(form.b, form.index(form.b_layout, batch, m, kb, n))
    ta = _operand(w, a, bm, bk, kam, w.graph.nodes[form.a].dtype if form.dtype != "float32" else "float32", body)
    tb = _operand(w, b, bk, bn, kbm, w.graph.nodes[form.b].dtype if form.dtype != "float32" else "float32", body)
    if form.dtype == "float64":
        w.line(body, f"{acc} += tl.sum({ta}[:, :, None] * {tb}[None, :, :], axis=1)")
    elif form.dtype == "float32":
        prec = w.ctx.get("input_precision", "ieee")
        w.line(body, f'{acc} += tl.dot({ta}, {tb}, input_precision="{prec}")')
    else:
        w.line(body, f"{acc} += tl.dot({ta}, {tb})")
    w.close_loop(body)
    return Val(acc, node.dtype, parent, m.masks | n.masks, frozenset({0, 1}))
