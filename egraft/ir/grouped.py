"""Products over a repeated operand, split so the repeat stays a broadcast: grouped-query attention.

Grouped-query attention repeats each key/value head for a group of query
heads (transformers' ``repeat_kv``: ``expand`` to ``[B, KV, R, S, D]``, then
``reshape`` to ``[B, KV * R, S, D]``).  The reshape merges a stride-0 axis
with a strided one, which no single strided view can express, so the graph
holds a ``View`` of a ``View`` and every backend materialises the repeated
``[B, H, S, D]`` cache before the attention product: per layer and step, a
copy R times the cache it reads.

:func:`split_grouped_products` finds each product ``SumReduce(Mul(x, y))``
one of whose factors is such an uncomposable view of a view, and splits the
product's axes at the digits that factor's view walks (``H`` into ``KV, R``)
for both factors.  The factor then is one strided view of the cache with
stride 0 along ``R`` (a broadcast, which a backend's dot handles as a free
axis of the other factor), the other factor a view of itself, and the
result a reshape back to the original shape.  Every element is the same sum
of the same products, so the rewrite is exact; nothing else changes.
"""

from __future__ import annotations

from math import prod

from . import dtypes, shapes, strided
from .builder import GraphBuilder, Tensor
from .graph import Graph
from .op_groups import Op


def _split_view(graph: Graph, nid: int) -> list[tuple[int, ...]] | None:
    """Per axis of View `nid` (a view of a View it does not compose with), the digit sizes (outer first) at which
    splitting the axis makes it compose; None where there is no such split."""
    outer = graph.nodes[nid]
    if outer.op != Op.View or graph.nodes[outer.inputs[0]].op != Op.View:
        return None
    inner = graph.nodes[outer.inputs[0]]
    o = (outer.attrs["shape"], outer.attrs["strides"], outer.attrs["offset"])
    i = (inner.attrs["shape"], inner.attrs["strides"], inner.attrs["offset"])
    if any(s < 0 for s in (*o[1], *i[1])) or not o[0]:
        return None
    src_shape = graph.nodes[inner.inputs[0]].shape
    if strided.compose_views(src_shape, i, o) is not None:
        return None  # composable as it is (the builder composes such views; nothing to gain)
    # the outer view reads the inner view's logical (row-major) layout
    m = strided.read_map(tuple(inner.shape), *o)
    if m is None:
        return None
    split = [tuple(p.size for p in pieces) or (n,) for n, pieces in zip(outer.shape, m.pieces)]
    if all(len(s) == 1 for s in split):
        return None
    if strided.compose_views(src_shape, i, _split_strided(o, split)) is None:
        return None
    return split


def _split_strided(view, split) -> tuple:
    """`view` (shape, strides, offset) with axis d split into the sizes ``split[d]`` (row-major digits)."""
    shape, strides, off = view
    new_shape, new_strides = [], []
    for n, s, parts in zip(shape, strides, split):
        span = 1
        subs = []
        for size in reversed(parts):
            subs.append((size, s * span if size > 1 else 0))
            span *= size
        for size, st in reversed(subs):
            new_shape.append(size)
            new_strides.append(st)
    return tuple(new_shape), tuple(new_strides), off


def _plan(graph: Graph, nid: int):
    """(the Mul, the split per Mul axis) for a SumReduce over a product with a splittable factor, else None."""
    n = graph.nodes[nid]
    if n.op != Op.SumReduce or not dtypes.is_float(n.dtype):
        return None
    mul = graph.nodes[n.inputs[0]]
    if mul.op != Op.Mul:
        return None
    for f in mul.inputs:
        split = _split_view(graph, f)
        if split is not None and len(split[n.attrs["axis"]]) == 1:  # the reduced axis stays one axis
            return n.inputs[0], split
    return None


def split_grouped_products(graph: Graph) -> Graph:
    """`graph` with each product over a repeated operand split (module docstring); the same object if none."""
    plans = {i: p for i in range(len(graph.nodes)) if (p := _plan(graph, i)) is not None}
    if not plans:
        return graph
    b = GraphBuilder()
    m: dict[int, Tensor] = {}
    for i, n in enumerate(graph.nodes):
        if i not in plans:
            m[i] = b.add(n.op, [m[j] for j in n.inputs], **n.attrs.as_dict())
            continue
        mul_id, split = plans[i]
        mul = graph.nodes[mul_id]
        shape = tuple(s for parts in split for s in parts)
        factors = []
        for f in mul.inputs:
            fn = graph.nodes[f]
            if fn.op == Op.View and _split_view(graph, f) == split:
                # the outer view, split, over the inner View: the builder composes the two into one strided view
                o = (fn.attrs["shape"], fn.attrs["strides"], fn.attrs["offset"])
                factors.append(b.view(m[fn.inputs[0]], *_split_strided(o, split)))
            else:  # the other factor: its own row-major layout split the same way
                view = (tuple(fn.shape), shapes.contiguous_strides(fn.shape), 0)
                factors.append(b.view(m[f], *_split_strided(view, split)))
        axis = n.attrs["axis"]
        new_axis = sum(len(parts) for parts in split[:axis])
        red = b.add(Op.SumReduce, [b.add(Op.Mul, factors)], axis=new_axis)
        assert prod(red.shape) == prod(n.shape)
        m[i] = b.view(red, tuple(n.shape), shapes.contiguous_strides(n.shape), 0)
    g = graph.rebuilt(b.nodes, [m[o].id for o in graph.outputs], [m[i].id for i in graph.input_ids])
    return g.pruned()


__all__ = ["split_grouped_products"]
