"""Weight-only work runs once: split a graph into a fold part and a per-call part.

A node is *weight-only* (:func:`egraft.ir.analysis.weight_only`) when
everything it depends on is a weight, a constant or an ``Iota``.
Weight-only compute that the per-call program needs (concatenated QKV
weights, a LoRA adapter merged into its weight, a batch norm folded into a
convolution, a transposed weight, a causal mask) is evaluated once, when
an executable is built or loaded, and enters the per-call graph as a new
weight named ``__folded_<k>``.  Views over a folded
value stay views (folding an expanded weight would materialise copies), and
plain weights are never copied.  A dtype whose table row says ``fold=False``
(a packed weight format, say) is never folded, nor is anything computed from
it: its dequantise stays in the per-call program, so the weight stays packed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import Op, dtypes, strided
from ..ir.analysis import weight_only, weight_operand
from ..ir.graph import Attrs, Graph, Node
from ..errors import InputError
from ..ir.serialize import graph_to_dict
from ..ir.shapes import contiguous_strides
from ..runtime.derived import derived

FOLDED_PREFIX = "__folded_"


@dataclass(frozen=True)
class FoldPlan:
    main: Graph  # per-call graph; folded values are its weights named __folded_<k>
    fold: Graph | None  # weight-only graph whose outputs are the folded values, in order
    folded_names: tuple[str, ...]


def plan(graph: Graph, widen: bool = True, grow: bool = True) -> FoldPlan:
    """Find the weight-only values the per-call graph needs and cut them out.

    ``widen=False``: a weight widened to float32 (:func:`widened`'s form) is not folded: the per-call program
    widens it where it reads it, so no float32 copy of the weight is held (``CompileConfig.weight_copies``).
    ``grow=False``: nor is any other value larger than the stored weights it is computed from (a quantised
    weight dequantised to float32 would be four times its int8 values): it is computed where it is read."""
    graph = _broadcasts_after_casts(graph)
    wo = weight_only(graph)
    foldable: list[bool] = []  # no value of a dtype that must not fold on the way to this node
    for n in graph.nodes:
        foldable.append(dtypes.row(n.dtype).fold and all(foldable[j] for j in n.inputs))
    alive = graph.live()
    targets: list[int] = []  # weight-only compute nodes to materialise, in topological order
    seen = set()

    def base(i):
        while graph.nodes[i].op == Op.View:
            i = graph.nodes[i].inputs[0]
        return i

    needed = set()
    for i, n in enumerate(graph.nodes):
        if not alive[i] or wo[i]:
            continue
        for j in n.inputs:
            if wo[j]:
                needed.add(j)
    for o in graph.outputs:
        if wo[o]:
            needed.add(o)
    for j in needed:
        b = base(j)
        if not widen and _widening(graph, b):
            continue
        if not grow and not _widening(graph, b) and _grows(graph, b):
            continue
        if graph.nodes[b].op not in (Op.Input, Op.Constant) and foldable[b] and b not in seen:
            seen.add(b)
            targets.append(b)
    if not targets:
        return FoldPlan(graph, None, ())
    targets.sort()
    names = tuple(f"{FOLDED_PREFIX}{k}" for k in range(len(targets)))
    # the fold graph: the original nodes, outputs = targets, no model inputs
    # (a state input is a plain input there: the fold graph never reads it, and has no state to update)
    fold_nodes = [Node(n.op, n.inputs, Attrs({**n.attrs.as_dict(), "role": "input"}), n.shape, n.dtype)
                  if n.op == Op.Input and n.attrs["role"] == "state" else n for n in graph.nodes]
    fold = Graph(fold_nodes, targets, [i for i in graph.input_ids], graph.weights).pruned()
    # the main graph: replace each target by a new weight input
    name_of = dict(zip(targets, names))
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        if i in name_of:
            nodes.append(Node("Input", (), Attrs(dict(name=name_of[i], shape=n.shape, dtype=n.dtype, role="weight")), n.shape, n.dtype))
        else:
            nodes.append(Node(n.op, tuple(remap[j] for j in n.inputs), n.attrs, n.shape, n.dtype))
        remap[i] = len(nodes) - 1
    main = graph.rebuilt(nodes, [remap[o] for o in graph.outputs], [remap[i] for i in graph.input_ids]).pruned()
    return FoldPlan(main, fold, names)


def _broadcasts_after_casts(graph: Graph) -> Graph:
    """`graph` with each weight-only ``Cast(View(x))`` whose view repeats values (a stride-0 axis of size > 1)
    written ``View(Cast(compact View(x)))``: the same values (a cast is elementwise), but the folded value is the
    cast of the compact view (a widened weight, which a product may read as stored, ``widened``) and the repeat
    stays a view of it, not copies.  A batch of rows times a weight is lowered so (the weight broadcast along the
    rows, then widened): folded as it was, a 135 M model's tied output layer of four rows became 453 MB of
    float32 copies a prefill call made."""
    def repeats(n: Node) -> bool:
        return n.op == Op.View and any(s == 0 and d > 1 for d, s in zip(n.shape, n.attrs["strides"]))

    hits = [i for i, n in enumerate(graph.nodes) if n.op == Op.Cast and repeats(graph.nodes[n.inputs[0]])]
    if hits:  # (the weight-only analysis only where a candidate is)
        wo = weight_only(graph)
        hits = [i for i in hits if wo[i]]
    if not hits:
        return graph
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    made: dict[int, tuple] = {}  # a repeating view made here -> (its cast, the cast's shape, the view)
    for i, n in enumerate(graph.nodes):
        if i in hits:
            v = graph.nodes[n.inputs[0]]
            keep = [k for k, (d, st) in enumerate(zip(v.shape, v.attrs["strides"])) if not (st == 0 and d > 1)]
            shape = tuple(v.shape[k] for k in keep)
            compact = Node(Op.View, (remap[v.inputs[0]],), Attrs(dict(
                shape=shape, strides=tuple(v.attrs["strides"][k] for k in keep), offset=v.attrs["offset"])),
                shape, v.dtype)
            nodes.append(compact)
            nodes.append(Node(Op.Cast, (len(nodes) - 1,), n.attrs, shape, n.dtype))
            inner = dict(zip(keep, contiguous_strides(shape)))
            strides = tuple(inner.get(k, 0) for k in range(len(v.shape)))
            nodes.append(Node(Op.View, (len(nodes) - 1,), Attrs(dict(shape=tuple(v.shape), strides=strides,
                                                                          offset=0)), tuple(v.shape), n.dtype))
            made[len(nodes) - 1] = (len(nodes) - 2, shape, (tuple(v.shape), strides, 0))
        elif n.op == Op.View and remap[n.inputs[0]] in made:  # a view of the repeat: one view of the cast
            cast, shape, view = made[remap[n.inputs[0]]]
            comp = strided.compose_views(shape, view, (n.attrs["shape"], n.attrs["strides"], n.attrs["offset"]))
            src = remap[n.inputs[0]] if comp is None else cast
            attrs = n.attrs if comp is None else Attrs(dict(shape=comp[0], strides=comp[1], offset=comp[2]))
            nodes.append(Node(n.op, (src,), attrs, n.shape, n.dtype))
        else:
            nodes.append(Node(n.op, tuple(remap[j] for j in n.inputs), n.attrs, n.shape, n.dtype))
        remap[i] = len(nodes) - 1
    return graph.rebuilt(nodes, [remap[o] for o in graph.outputs], [remap[i] for i in graph.input_ids]).pruned()


def _grows(graph: Graph, i: int) -> bool:
    """Whether node `i` holds more bytes than the stored weights (and tensor constants) it is computed from."""
    def size(n):
        return int(np.prod(n.shape, dtype=np.int64)) * dtypes.to_numpy(n.dtype).itemsize

    seen, stack, sources = set(), [i], 0
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        n = graph.nodes[j]
        if n.op in (Op.Input, Op.Constant):
            sources += size(n)
        stack.extend(n.inputs)
    return size(graph.nodes[i]) > sources


@dataclass(frozen=True)
class Widened:
    """A folded value that is a 2-D weight widened to float32, as stored or through its plain transpose; or
    (dtype ``"int4"``) the dequantised ``[N, G, group]`` form of packed int4 values and their scales."""

    source: str  # the weight's name (int4: the packed bytes [N, K / 2])
    dtype: str  # its stored dtype ("int4": packed, egraft.frontend.quantize's layout)
    transposed: bool  # the folded value is the weight's transpose
    scales: str = ""  # (int4) the scales' weight [N, K / group]
    group: int = 0  # (int4) values of k per scale


def widened(p: FoldPlan) -> dict[str, Widened]:
    """The folded values that are ``Cast(W)`` or ``Cast(transpose(W))`` to float32 of a 2-D weight ``W``, or
    that dequantise packed int4 values (:func:`_dequantizes`) (name -> :class:`Widened`): a backend that reads
    the stored weight itself (a product that widens it in registers) need not make the float32 copy."""
    if p.fold is None:
        return {}
    g = p.fold
    out = {}
    for name, o in zip(p.folded_names, g.outputs):
        found = _widens(g, o)
        if found is not None:
            out[name] = Widened(found[0], g.nodes[g.nodes[o].inputs[0]].dtype, found[1])
        elif (int4 := _dequantizes(g, o)) is not None:
            out[name] = Widened(int4[0], "int4", False, int4[1], int4[2])
    return out


def _widening(g: Graph, i: int) -> bool:
    """Node `i` only widens a stored weight (:func:`_widens`, :func:`_dequantizes`)."""
    return _widens(g, i) is not None or _dequantizes(g, i) is not None


def _dequantizes(g: Graph, i: int) -> tuple[str, str, int] | None:
    """(packed, scales, group) when node `i` is the dequantised form ``[N, G, group]`` of an int4 layer
    (``egraft.frontend.quantize``): ``Cast(unpack_int4(P)) * S`` with ``P`` int8 bytes ``[N, K / 2]`` (read
    through the ``Nibble`` form of ``Tensor.unpack_int4``; reshapes and the cast in either order) and the scales
    ``S [N, G]`` float32 broadcast along each group."""
    n = g.nodes[i]
    if n.op != Op.Mul or n.dtype != "float32" or len(n.shape) != 3:
        return None
    rows, groups, group = n.shape
    for a, b in (n.inputs, n.inputs[::-1]):
        scale = _broadcast_scales(g, b, n.shape)
        packed = _unpacked(g, a, rows, groups * group)
        if scale is not None and packed is not None:
            return packed, scale, group
    return None


def _broadcast_scales(g: Graph, i: int, shape) -> str | None:
    """The weight ``S [N, G]`` float32 when node `i` is it viewed as ``[N, G, group]`` (stride 0 along a group)."""
    n = g.nodes[i]
    if n.op != Op.View or n.attrs["offset"] != 0:
        return None
    src = g.nodes[n.inputs[0]]
    ok = (src.op == Op.Input and src.attrs["role"] == "weight" and src.dtype == "float32"
          and tuple(src.shape) == tuple(shape[:2]) and tuple(n.attrs["strides"]) == (shape[1], 1, 0))
    return src.attrs["name"] if ok else None


def _unpacked(g: Graph, i: int, rows: int, k: int) -> str | None:
    """The packed weight ``P [rows, k / 2]`` int8 when node `i` is ``Cast(unpack_int4(P))`` to float32 through
    contiguous reshapes (``Tensor.unpack_int4``'s views and ``Nibble``)."""
    cast = False
    n = g.nodes[i]
    while n.op in (Op.View, Op.Cast):
        if n.op == Op.View and (n.attrs["offset"] != 0 or any(
                d != 1 and s != c for d, s, c in zip(n.shape, n.attrs["strides"], contiguous_strides(n.shape)))):
            return None  # (not a reshape of the whole)
        if n.op == Op.View and math.prod(n.shape) != math.prod(g.nodes[n.inputs[0]].shape):
            return None
        if n.op == Op.Cast:
            if cast or n.dtype != "float32" or g.nodes[n.inputs[0]].dtype != "int8":
                return None
            cast = True
        n = g.nodes[n.inputs[0]]
    if n.op != Op.Nibble or not cast or tuple(n.shape) != (rows, k // 32, 2, 16):
        return None
    bytes_, pos = (g.nodes[j] for j in n.inputs)
    if bytes_.op != Op.View or pos.op != Op.View or bytes_.attrs["offset"] or pos.attrs["offset"]:
        return None
    src, iota = g.nodes[bytes_.inputs[0]], g.nodes[pos.inputs[0]]
    ok = (src.op == Op.Input and src.attrs["role"] == "weight" and src.dtype == "int8"
          and tuple(src.shape) == (rows, k // 2) and tuple(bytes_.attrs["strides"]) == (k // 2, 16, 0, 1)
          and iota.op == Op.Iota and iota.attrs["n"] == 2 and tuple(pos.attrs["strides"]) == (0, 0, 1, 0))
    return src.attrs["name"] if ok else None


def _widens(g: Graph, i: int) -> tuple[str, bool] | None:
    """(weight, transposed) when node `i` is ``Cast(W)`` or ``Cast(transpose(W))`` to float32 of a 2-D weight."""
    n = g.nodes[i]
    return weight_operand(g, n.inputs[0]) if n.op == Op.Cast and n.dtype == "float32" else None


def compute_folded(p: FoldPlan, names=None) -> dict[str, np.ndarray]:
    """Evaluate each folded value (those in `names`, default all) once (reference semantics, in the values' own
    dtypes).

    Each is the ``fold`` recipe of ``runtime.derived`` over the weight arrays
    it reads, so it is shared with every other program that folds the same
    computation over the same arrays (the bucket programs of a generation,
    the search's candidates), and a saved generation stores the recipe.
    """
    if p.fold is None:
        return {}
    g = p.fold
    hashes = g.node_hashes()
    out = {}
    for name, o in zip(p.folded_names, g.outputs):
        if names is not None and name not in names:
            continue
        sub = target_graph(g, o)
        reads = sub.weight_names()
        missing = [w for w in reads if w not in g.weights]
        if missing:
            raise InputError(f"weight {missing[0]!r} has no bound value; bind it with graph.with_weights(...)")
        out[name] = derived("fold", lambda sub=sub, reads=reads: {"graph": graph_to_dict(sub), "weights": list(reads)},
                            tuple(g.weights[w] for w in reads), reads, key=hashes[o])
    return out


def target_graph(g: Graph, o: int) -> Graph:
    """Node `o` of the weight-only graph `g` alone: the nodes it depends on, its weights unbound, no model inputs."""
    alive = g.needed(outputs=[o])  # (no model input: the value is weight-only)
    need = [j for j, keep in enumerate(alive) if keep]
    remap = {j: k for k, j in enumerate(need)}
    nodes = [Node(g.nodes[j].op, tuple(remap[i] for i in g.nodes[j].inputs), g.nodes[j].attrs, g.nodes[j].shape,
                  g.nodes[j].dtype) for j in need]
    return Graph(nodes, [remap[o]], [])


def inline(p: FoldPlan, graph: Graph, names) -> Graph:
    """`graph` (``p.main``, its folded values bound or not) with the folded values `names` computed where they
    are read: each one's weight input replaced by the weight-only nodes that fold it, reading the stored weights
    (added as weight inputs where `graph` did not read them).  A widened weight that no product reads as stored
    is so computed by the per-call program instead of held as a float32 copy (``fold_growing=False``)."""
    names = set(names)
    index = dict(zip(p.folded_names, p.fold.outputs)) if p.fold is not None else {}
    unknown = sorted(names - set(index))
    if unknown:
        raise InputError(f"{unknown[0]!r} is not a folded value of this plan")
    subs = {name: target_graph(p.fold, index[name]) for name in names}
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    by_name: dict[str, int] = {}  # weight inputs of the new graph

    def add(n: Node, inputs=()) -> int:
        nodes.append(Node(n.op, tuple(inputs), n.attrs, n.shape, n.dtype))
        return len(nodes) - 1

    # inputs have no operands: every kept one first, then the stored weights only an inlined value reads
    for i, n in enumerate(graph.nodes):
        if n.op == Op.Input and n.attrs["name"] not in names:
            remap[i] = add(n)
            if n.attrs["role"] == "weight":
                by_name[n.attrs["name"]] = remap[i]
    for sub in subs.values():
        for n in sub.nodes:
            if n.op == Op.Input and n.attrs["name"] not in by_name:
                by_name[n.attrs["name"]] = add(n)
    for i, n in enumerate(graph.nodes):
        if i in remap:
            continue
        if n.op == Op.Input:  # a folded value computed here
            sub, local = subs[n.attrs["name"]], {}
            for j, m in enumerate(sub.nodes):
                local[j] = by_name[m.attrs["name"]] if m.op == Op.Input else add(m, (local[k] for k in m.inputs))
            remap[i] = local[sub.outputs[0]]
        else:
            remap[i] = add(n, (remap[j] for j in n.inputs))
    weights = {k: v for k, v in graph.weights.items() if k not in names}
    return graph.rebuilt(nodes, [remap[o] for o in graph.outputs], [remap[i] for i in graph.input_ids],
                         weights).pruned()


def fold_weights(graph: Graph, widen: bool = True, grow: bool = True) -> tuple[Graph, dict[str, np.ndarray]]:
    """The per-call graph with its folded weights bound, plus those folded values (`widen`, `grow`:
    :func:`plan`'s)."""
    p = plan(graph, widen, grow)
    folded = compute_folded(p)
    return (p.main.with_weights(folded) if folded else p.main), folded
