"""The body of a Scatter kernel: ``x`` with ``upd`` written at ``idx`` along one axis.

A Scatter is always a kernel root: the partitioner never inlines it, since
its value is written where ``idx`` says rather than read at a consumer's
index.  Its kernel (``kernel.generate``, plan kind ``scatter``) walks
*lines* (every dimension but the axis, flattened onto tile axis 0); each
program owns whole lines, and every index of a line points into that same
line, so no two programs write one element.  The body, written here, has two
phases, each a loop over the line in chunks of ``BLOCK_C`` on tile axis 1:

1. :func:`copy_phase` stores ``x`` (inlined, whatever computes it) into the output;
2. ``tl.debug_barrier()``: every thread's copy is done before an update lands
   (one element's copy and its update may be done by different threads);
3. :func:`store_phase` stores ``upd`` at ``idx`` (both inlined).

:func:`emit_scatter_functional` is the functional Scatter, both phases into a
new buffer; an in-place update of a state buffer is the store phase alone
into ``x``'s own buffer.
"""

from __future__ import annotations

from ...ir import dtypes
from .emitter import TL_DTYPE, Ix, Val


def _chunks(w, size: int, what: str) -> tuple[int, Ix]:
    """A loop over `size` positions of the axis in chunks of BLOCK_C: (its block, the masked position index)."""
    c0 = w.fresh(f"{what}0")
    body = w.open_loop(f"for {c0} in range(0, {size}, BLOCK_C):", 0)
    c = w.new_index(f"{c0} + tl.arange(0, BLOCK_C){w.axis_slice(1)}", body, axes={1}, prefix=what)
    mask = w.let(f"{c.expr} < {size}", body, f"{what}_mask")
    w.ctx["mask_block"][mask] = body
    w.ctx["mask_axes"][mask] = frozenset({1})
    return body, Ix(c.expr, body, frozenset({mask}), c.axes)


def _store(w, at: tuple, val: Val):
    """Store `val` into the kernel's output at index `at` (one Ix per dimension), masked by `at`'s masks."""
    shape, out = w.ctx["root_shape"], w.ctx["out"]
    flat = w.flat_index(shape, at)
    masks = frozenset().union(*(ix.masks for ix in at))
    axes = frozenset().union(*(ix.axes for ix in at))
    v = w.broadcast_full(val, axes)
    if dtypes.is_half(val.dtype):
        v = f"{v}.to({TL_DTYPE[val.dtype]})"
    mask = w.mask_expr(masks)
    block = w.deepest(val, flat, *[Ix("", w.ctx["mask_block"].get(m, 0)) for m in masks])
    w.line(block, f"tl.store({out} + {flat.expr}, {v}{', mask=' + mask if mask else ''})")


def copy_phase(w, nid: int, node, lines: tuple):
    """out[.., c, ..] = x[.., c, ..] for every position c of the axis, on the program's lines."""
    ax = node.attrs["axis"]
    body, c = _chunks(w, node.shape[ax], "c")
    at = lines[:ax] + (c,) + lines[ax + 1:]
    _store(w, at, w.value(node.inputs[0], at))
    w.close_loop(body)


def store_phase(w, nid: int, node, lines: tuple):
    """out[.., idx[.., k, ..], ..] = upd[.., k, ..] for every update k along the axis, on the program's lines."""
    x, ind, upd = node.inputs
    ax = node.attrs["axis"]
    body, k = _chunks(w, w.graph.nodes[upd].shape[ax], "k")
    src = lines[:ax] + (k,) + lines[ax + 1:]
    iv = w.value(ind, src)
    # the index of a masked-off lane is garbage (a load with other=0): keep the lane's masks on the store
    pos = Ix(iv.expr, block=iv.block, masks=iv.masks | frozenset().union(*(ix.masks for ix in src)), axes=iv.axes)
    _store(w, lines[:ax] + (pos,) + lines[ax + 1:], w.value(upd, src))
    w.close_loop(body)


def emit_scatter_functional(w, nid: int, node, lines: tuple):
    """The functional Scatter: copy ``x`` into the new output, a barrier, then store the updates.

    `lines` is the root's index with the axis entry unused (the kernel's line indices on tile axis 0).
    """
    copy_phase(w, nid, node, lines)
    w.line(0, "tl.debug_barrier()")
    store_phase(w, nid, node, lines)
