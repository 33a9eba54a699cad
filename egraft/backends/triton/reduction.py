"""Reductions and row idioms (Softmax, LayerNorm, RMSNorm) inside a kernel.

Two ways to reduce, chosen per use:

* **row tile** (persistent rows): when the reduced axis is the kernel's
  column axis and a whole row fits one tile, the reduction runs over tile
  axis 1 of the very tile the consumer uses (``tl.sum(x, axis=1,
  keep_dims=True)``).  Softmax, layer norm and RMS norm become one kernel
  that reads each row once, whether written as idiom nodes or as primitives.
* **reduction axis**: otherwise the reduced dimension becomes a new tile
  axis (2 or more), walked in one block or in a ``for`` loop with an
  accumulator when it is longer than ``BLOCK_K``.
"""

from __future__ import annotations

from ...errors import BackendError
from ...ir import Op
from .emitter import TL_DTYPE, Ix, Val, compute_dtype

_INT_MIN = {"int32": -(2**31), "int64": -(2**63)}


def _neutral(op: str, dt: str) -> str:
    if op == Op.SumReduce or dt == "bool":
        return "0"
    if dt in _INT_MIN:
        return str(_INT_MIN[dt])
    return 'float("-inf")'


def _persistent(w, nid, axis, idx, src_shape) -> bool:
    col = w.ctx.get("col")
    if not col or not w.ctx.get("persistent"):
        return False
    if axis != col["dim"] or tuple(src_shape) != tuple(w.ctx["root_shape"]) or not col["whole"]:
        return False
    return all(1 not in ix.axes for ix in idx)


def _finish(w, nid, op, dt, x: Val, axis_t: int, count: int, kmask: str | None) -> Val:
    """Reduce tile value `x` over tile axis `axis_t` (`count` real elements, `kmask` guards the rest)."""
    masks = x.masks - ({kmask} if kmask else set())
    axes = x.axes - {axis_t}
    if axis_t not in x.axes:  # x does not vary along the reduced axis: closed form
        if op == Op.MaxReduce:
            return Val(x.expr, dt, x.block, masks, axes)
        k = w.const(count, dt)
        return w.combine(nid, "{0} * {1}", [x, k], dt, f"sum{nid}")
    src = x.expr
    if dt == "bool":
        src = f"{src}.to(tl.int32)"
    if kmask:
        src = f"tl.where({kmask}, {src}, {_neutral(op, dt)})"
    w.comment(nid, x.block)
    if op == Op.MaxReduce and dt != "bool" and not dt.startswith("int"):
        name = _nan_max(w, w.let(src, x.block, f"maxin{nid}"), axis_t, x.block, f"max{nid}")
        return Val(name, dt, x.block, masks, axes)
    fn = "tl.sum" if op == Op.SumReduce else "tl.max"
    expr = f"{fn}({src}, axis={axis_t}, keep_dims=True)"
    if dt == "bool":
        expr = f"{expr} != 0"
    name = w.let(expr, x.block, f"{'sum' if op == Op.SumReduce else 'max'}{nid}")
    return Val(name, dt, x.block, masks, axes)


def _nan_max(w, src: str, axis: int, block, prefix: str) -> str:
    """``tl.max`` that propagates NaN, as torch.amax, jnp.max and the reference do.

    ``tl.max`` / ``tl.maximum`` return the other operand when one is NaN (the
    interpreter's and PTX ``max.f32``'s rule), so a row holding a NaN would
    give a number: count the NaNs and select NaN where there are any.
    """
    nans = f"tl.sum(({src} != {src}).to(tl.int32), axis={axis}, keep_dims=True)"
    return w.let(f'tl.where({nans} > 0, float("nan"), tl.max({src}, axis={axis}, keep_dims=True))', block, prefix)


def emit_reduce(w, nid, node, idx):
    if nid in w.ctx.get("dots", {}):
        from .matmul import emit_dot

        return emit_dot(w, nid, node, idx)
    src = node.inputs[0]
    axis = node.attrs["axis"]
    snode = w.graph.nodes[src]
    K = snode.shape[axis]
    op, dt = node.op, node.dtype
    if _persistent(w, nid, axis, idx, snode.shape):
        col = w.ctx["col"]
        j = tuple(idx[:axis]) + (col["ix"],) + tuple(idx[axis:])
        x = w.value(src, j)
        return _finish(w, nid, op, dt, x, 1, K, col["mask"])
    # a new tile axis for the reduced dimension
    a = max([max(ix.axes) for ix in idx if ix.axes] + [1]) + 1
    if a >= w.rank:
        raise BackendError(f"internal: reduction %{nid} needs tile axis {a} but the kernel has rank {w.rank}")
    bk = min(w.ctx["block_k"], _pow2(K))
    parent = w.deepest(*idx)
    sl = w.axis_slice(a)
    if bk >= K:
        k = w.new_index(f"tl.arange(0, {bk}){sl}", parent, axes={a}, prefix=f"k{nid}")
        kmask = None
        if bk > K:
            kmask = w.let(f"{k.expr} < {K}", parent, f"k{nid}_mask")
            w.ctx["mask_block"][kmask] = parent
            w.ctx["mask_axes"][kmask] = frozenset({a})
            k = Ix(k.expr, k.block, frozenset({kmask}), k.axes)
        x = w.value(src, tuple(idx[:axis]) + (k,) + tuple(idx[axis:]))
        return _finish(w, nid, op, dt, x, a, K, kmask)
    # loop over the reduced axis in chunks of BLOCK_K, accumulating a tile
    cdt = compute_dtype(dt)
    acc_axes = frozenset().union(*(ix.axes for ix in idx)) | {a} if idx else frozenset({a})
    shape = w.tile_shape(acc_axes)
    shape[a] = str(bk)
    acc = w.fresh(f"acc{nid}")
    w.comment(nid, parent)
    acc_dt = "tl.int32" if dt == "bool" else TL_DTYPE[cdt]
    w.line(parent, f"{acc} = tl.full([{', '.join(shape)}], {_neutral(op, dt)}, {acc_dt})")
    k0 = w.fresh(f"k0_{nid}")
    body = w.open_loop(f"for {k0} in range(0, {K}, {bk}):", parent)
    k = w.new_index(f"{k0} + tl.arange(0, {bk}){sl}", body, axes={a}, prefix=f"k{nid}")
    kmask = w.let(f"{k.expr} < {K}", body, f"k{nid}_mask")
    w.ctx["mask_block"][kmask] = body
    w.ctx["mask_axes"][kmask] = frozenset({a})
    k = Ix(k.expr, body, frozenset({kmask}), k.axes)
    x = w.value(src, tuple(idx[:axis]) + (k,) + tuple(idx[axis:]))
    xe = f"{x.expr}.to(tl.int32)" if dt == "bool" else x.expr
    masked = f"tl.where({kmask}, {xe}, {_neutral(op, dt)})"
    is_float = dt != "bool" and not dt.startswith("int")
    if op == Op.SumReduce:
        w.line(body, f"{acc} = {acc} + {masked}")
    elif is_float:  # NaN sticks in the accumulator (tl.maximum drops it)
        mv = w.fresh(f"maxin{nid}")
        w.line(body, f"{mv} = {masked}")
        w.line(body, f'{acc} = tl.where(({acc} != {acc}) | ({mv} != {mv}), float("nan"), tl.maximum({acc}, {mv}))')
    else:
        w.line(body, f"{acc} = tl.maximum({acc}, {masked})")
    w.close_loop(body)
    if op == Op.MaxReduce and is_float:
        name = _nan_max(w, acc, a, parent, f"max{nid}")
    else:
        fn = "tl.sum" if op == Op.SumReduce else "tl.max"
        expr = f"{fn}({acc}, axis={a}, keep_dims=True)" + (" != 0" if dt == "bool" else "")
        name = w.let(expr, parent, f"{'sum' if op == Op.SumReduce else 'max'}{nid}")
    return Val(name, dt, parent, frozenset().union(*(ix.masks for ix in idx)) if idx else frozenset(),
               acc_axes - {a})


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


# --- row idioms: the whole row is in the tile -------------------------------------------
def emit_row_idiom(w, nid, node, idx):
    axis = node.attrs["axis"]
    col = w.ctx.get("col")
    if not col or not col["whole"] or axis != col["dim"] or idx[axis].expr != col["ix"].expr:
        raise BackendError(
            f"internal: {node.op} %{nid} reached a kernel whose tile does not hold its whole rows; "
            "the partitioner should have made it a kernel of its own"
        )
    x = w.value(node.inputs[0], idx)
    n = w.graph.nodes[node.inputs[0]].shape[axis]
    cm = col["mask"]
    b = x.block
    w.comment(nid, b)
    p = f"{node.op.lower()}{nid}"

    def let(expr, suffix):
        return w.let(expr, b, f"{p}_{suffix}")

    def masked(e, neutral):
        return f"tl.where({cm}, {e}, {neutral})" if cm else e

    if node.op == Op.Softmax:
        xm = let(masked(x.expr, 'float("-inf")'), "x")
        m = let(f"tl.max({xm}, axis=1, keep_dims=True)", "max")
        e = let(f"tl.exp({xm} - {m})", "exp")
        s = let(f"tl.sum({e}, axis=1, keep_dims=True)", "sum")
        out = let(f"{e} / {s}", "out")
    elif node.op == Op.LayerNorm:
        mean = let(f"tl.sum({masked(x.expr, '0.0')}, axis=1, keep_dims=True) / {float(n)}", "mean")
        d = let(f"{x.expr} - {mean}", "centered")
        var = let(f"tl.sum({masked(f'{d} * {d}', '0.0')}, axis=1, keep_dims=True) / {float(n)}", "var")
        out = let(f"{d} / tl.sqrt({var} + {float(node.attrs['eps'])!r})", "out")
    elif node.op == Op.RMSNorm:
        ms = let(f"tl.sum({masked(f'{x.expr} * {x.expr}', '0.0')}, axis=1, keep_dims=True) / {float(n)}", "ms")
        out = let(f"{x.expr} / tl.sqrt({ms} + {float(node.attrs['eps'])!r})", "out")
    else:  # pragma: no cover - the rule table only routes the three row idioms here
        raise BackendError(f"internal: {node.op} is not a row idiom")
    return Val(out, node.dtype, b, x.masks, x.axes | {1})
