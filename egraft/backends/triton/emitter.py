"""Writes the body of one Triton kernel: values of IR nodes at symbolic indices.

A kernel computes its *root* node over a tile of output indices.  Every other
node it covers is inlined: asking for node ``n`` at index ``I`` (one index
expression per dimension of ``n``) emits the Triton code that computes
``n[I]`` for the whole tile, reading materialised tensors (kernel arguments)
with ``tl.load``.  This is why views never materialise inside a kernel: a
``View`` is only a change of index, and a ``Gather`` is a load at a computed
index.

Every tensor in a kernel has the same rank (``rank``): tile axis 0 walks
output rows, axis 1 output columns, axes 2.. the reduction loops.  Values
remember which tile axes they vary along, which masks guard them and which
*block* (the kernel body, or the body of a ``for`` loop over a reduction) they
live in, so a value is emitted in the outermost block where everything it
needs exists: loop-invariant work is hoisted out of reduction loops by
construction.  Values are memoised per (node, index), so a tile loaded once
is reused (e.g. the row of x that softmax reads three times).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import BackendError
from ...ir import Op, dtypes, shapes
from ...ir.graph import Graph

TL_DTYPE = {d: f"tl.{r.triton}" for d, r in dtypes.ROWS.items()}


def compute_dtype(dt: str) -> str:
    """Half types are computed in float32 (as the reference interpreter does)."""
    return dtypes.compute_name(dt)


@dataclass(frozen=True)
class Ix:
    """One index expression: a variable (or int literal) over the tile."""

    expr: str
    block: int = 0
    masks: frozenset = frozenset()
    axes: frozenset = frozenset()


ZERO = Ix("0")


@dataclass(frozen=True)
class Val:
    """A computed tile: its expression (in the compute dtype) and provenance."""

    expr: str
    dtype: str  # IR dtype of the node (the value itself is held in compute_dtype(dtype))
    block: int = 0
    masks: frozenset = frozenset()
    axes: frozenset = frozenset()


@dataclass
class Block:
    id: int
    parent: int | None
    level: int
    lines: list = field(default_factory=list)
    cse: dict = field(default_factory=dict)
    closed: bool = False


class KernelWriter:
    """Emits lines into blocks, with CSE, memoisation and loads from kernel arguments."""

    def __init__(self, graph: Graph, buffers: dict[int, str], rank: int, rules, ctx: dict):
        self.graph = graph
        self.buffers = buffers  # node id -> kernel argument name (materialised tensors)
        self.rank = rank
        self.rules = rules
        self.ctx = ctx  # kernel-level facts the rules need (tile sizes, the row/col index, ...)
        self.blocks = {0: Block(0, None, 0)}
        self.open = [0]
        self.memo: dict = {}
        self.names: set = set()
        self.commented: set = set()
        self.covered: set = set()
        self.functions: set = set()  # device functions the kernel calls (device_functions.FUNCTIONS)

    def use(self, function: str) -> str:
        """Note that the kernel calls device function `function` (its definition goes into the source)."""
        from .device_functions import FUNCTIONS

        if function not in FUNCTIONS:
            raise KeyError(f"internal: no device function {function!r}")
        self.functions.add(function)
        return function

    # -- blocks ------------------------------------------------------------------
    def deepest(self, *items) -> int:
        best = 0
        for it in items:
            if it is None:
                continue
            b = it.block
            if self.blocks[b].level > self.blocks[best].level:
                best = b
        return best

    def open_loop(self, header: str, parent: int) -> int:
        bid = len(self.blocks)
        self.blocks[bid] = Block(bid, parent, self.blocks[parent].level + 1)
        self.blocks[bid].lines.append(("head", header))
        self.open.append(bid)
        return bid

    def close_loop(self, bid: int):
        if self.open[-1] != bid:
            raise BackendError(f"internal: closing loop block {bid} out of order ({self.open})")
        self.open.pop()
        b = self.blocks[bid]
        b.closed = True
        self.blocks[b.parent].lines.append(("block", bid))
        self.memo = {k: v for k, v in self.memo.items() if not self._in_closed(v.block)}

    def _in_closed(self, bid):
        while bid is not None:
            if self.blocks[bid].closed:
                return True
            bid = self.blocks[bid].parent
        return False

    def fresh(self, prefix: str) -> str:
        name = prefix
        k = 1
        while name in self.names:
            k += 1
            name = f"{prefix}_{k}"
        self.names.add(name)
        return name

    def line(self, block: int, code: str):
        self.blocks[block].lines.append(("line", code))

    def let(self, expr: str, block: int, prefix: str) -> str:
        """Assign `expr` to a variable in `block` (reusing an identical earlier one)."""
        b = self.blocks[block]
        if expr in b.cse:
            return b.cse[expr]
        name = self.fresh(prefix)
        b.lines.append(("line", f"{name} = {expr}"))
        b.cse[expr] = name
        return name

    def comment(self, nid: int, block: int):
        if nid in self.commented:
            return
        self.commented.add(nid)
        n = self.graph.nodes[nid]
        attrs = {k: v for k, v in n.attrs.as_dict().items() if k not in ("shape", "dtype") or n.op not in (Op.Input, Op.Constant)}
        if n.op == Op.View:
            attrs = {"shape": n.attrs["shape"], "strides": n.attrs["strides"], "offset": n.attrs["offset"]}
        a = " ".join(f"{k}={v!r}" for k, v in attrs.items() if k != "value" or not hasattr(v, "array"))
        args = ", ".join(f"%{j}" for j in n.inputs)
        self.line(block, f"# %{nid} = {n.op}({args}){' ' + a if a else ''} : {list(n.shape)} {n.dtype}")

    def render(self) -> list[str]:
        out: list[str] = []

        def walk(bid, indent):
            for kind, item in self.blocks[bid].lines:
                if kind == "line":
                    out.append(" " * indent + item)
                elif kind == "head":
                    out.append(" " * (indent - 4) + item)
                else:
                    walk(item, indent + 4)

        walk(0, 4)
        return out

    # -- tiles ---------------------------------------------------------------------
    def tile_shape(self, axes) -> list[str]:
        sizes = self.ctx["axis_sizes"]
        return [str(sizes[a]) if a in axes else "1" for a in range(self.rank)]

    def axis_slice(self, axis: int) -> str:
        """`[None, :, None]`-style indexing that puts a 1-D arange on tile axis `axis`."""
        return "[" + ", ".join(":" if a == axis else "None" for a in range(self.rank)) + "]"

    def const(self, value, dt: str) -> Val:
        cdt = compute_dtype(dt)
        if dt == "bool":
            lit = "1" if value else "0"
        elif dtypes.is_int(dt):
            lit = str(int(value))
        else:
            v = float(value)
            if dtypes.is_half(dt):
                import numpy as np

                v = float(np.asarray(v, dtype=dtypes.to_numpy(dt)).astype(dtypes.compute_dtype(dt)))
            lit = repr(v) if v == v and abs(v) != float("inf") else f'float("{v}")'
        shape = "[" + ", ".join("1" for _ in range(self.rank)) + "]"
        name = self.let(f"tl.full({shape}, {lit}, {TL_DTYPE[cdt]})", 0, "c")
        return Val(name, dt)

    def broadcast_full(self, v: Val, axes) -> str:
        """v's expression broadcast to the tile over `axes` (tl.dot and stores need real shapes)."""
        if set(v.axes) >= set(axes):
            return v.expr
        shape = ", ".join(self.tile_shape(axes))
        return self.let(f"tl.broadcast_to({v.expr}, [{shape}])", self.deepest(v), "bc")

    def mask_expr(self, masks) -> str | None:
        if not masks:
            return None
        ms = sorted(masks)
        if len(ms) == 1:
            return ms[0]
        name = self.let(" & ".join(ms), self._mask_block(ms), "mask")
        self.ctx["mask_block"][name] = self._mask_block(ms)
        self.ctx["mask_axes"][name] = frozenset().union(*(self.ctx["mask_axes"].get(m, frozenset()) for m in ms))
        return name

    def _mask_block(self, masks):
        blocks = [self.ctx["mask_block"].get(m, 0) for m in masks]
        return max(blocks, key=lambda b: self.blocks[b].level)

    def new_index(self, expr: str, block: int, masks=frozenset(), axes=frozenset(), prefix="i") -> Ix:
        return Ix(self.let(expr, block, prefix), block, frozenset(masks), frozenset(axes))

    def affine(self, terms, const: int, prefix="i") -> Ix:
        """An index `const + sum(c * ix)`; reuses `ix` itself when that is all it is."""
        terms = [(c, ix) for c, ix in terms if c != 0 and ix.expr != "0"]
        if not terms:
            return Ix(str(const))
        if const == 0 and len(terms) == 1 and terms[0][0] == 1:
            return terms[0][1]
        parts = []
        for c, ix in terms:
            e = ix.expr if c == 1 else f"{ix.expr} * {c}" if c > 0 else f"{ix.expr} * ({c})"
            parts.append(e)
        expr = " + ".join(parts)
        if const:
            expr = f"{const} + {expr}"
        ixs = [ix for _, ix in terms]
        return self.new_index(
            expr, self.deepest(*ixs),
            frozenset().union(*(ix.masks for ix in ixs)),
            frozenset().union(*(ix.axes for ix in ixs)), prefix,
        )

    # -- values --------------------------------------------------------------------
    def value(self, nid: int, idx: tuple) -> Val:
        idx = tuple(idx)
        key = (nid, tuple(ix.expr for ix in idx))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        node = self.graph.nodes[nid]
        if nid in self.buffers and nid != self.ctx.get("root"):
            v = self.load(nid, idx)
        else:
            rule = self.rules.get(node.op)
            if rule is None:
                raise BackendError(f"the Triton backend has no rule for IR op {node.op!r}")
            if rule.kind == "scatter":
                raise BackendError(f"internal: %{nid} {node.op} is a kernel root and cannot be inlined")
            self.covered.add(nid)
            v = rule.emit(self, nid, node, idx)
            if dtypes.is_half(node.dtype) and rule.kind not in ("index", "leaf") and node.op != Op.Cast:
                # the reference rounds every half-typed result; so do we (math stays in float32)
                tl_dt = TL_DTYPE[node.dtype]
                name = self.let(f"{v.expr}.to({tl_dt}).to(tl.float32)", v.block, f"{node.op.lower()}{nid}_r")
                v = Val(name, v.dtype, v.block, v.masks, v.axes)
        self.memo[key] = v
        return v

    def flat_index(self, shape, idx) -> Ix:
        cs = shapes.contiguous_strides(shape)
        return self.affine([(s, ix) for s, ix in zip(cs, idx) if shape and True], 0, "off")

    def load(self, nid: int, idx) -> Val:
        node = self.graph.nodes[nid]
        flat = self.flat_index(node.shape, idx)
        masks = frozenset().union(*(ix.masks for ix in idx)) if idx else frozenset()
        axes = frozenset().union(*(ix.axes for ix in idx)) if idx else frozenset()
        return self.load_flat(nid, flat, masks, axes)

    def load_flat(self, nid: int, flat: Ix, masks, axes) -> Val:
        """Load buffer `nid` at a flat element offset; half types are widened to float32.

        Only masks over tile axes the address varies along are applied: along
        any other axis the address is the one of an in-range lane.
        """
        node = self.graph.nodes[nid]
        axes = frozenset(flat.axes)
        masks = frozenset(m for m in masks if self.ctx["mask_axes"].get(m, frozenset()) <= axes)
        block = self.deepest(flat, *[Ix("", self.ctx["mask_block"].get(m, 0)) for m in masks])
        mask = self.mask_expr(masks)
        ptr = f"{self.buffers[nid]} + {flat.expr}" if flat.expr != "0" else self.buffers[nid]
        if not axes:
            # one element for the whole tile: load it as a rank-matched [1, 1, ...] tile
            ptr = f"{ptr} + {self.ctx['zero_tile']}"
        expr = f"tl.load({ptr}" + (f", mask={mask}, other=0)" if mask else ")")
        if dtypes.is_half(node.dtype):
            expr += f".to({TL_DTYPE[compute_dtype(node.dtype)]})"
        name = self.let(expr, block, f"ld{nid}")
        return Val(name, node.dtype, block, masks, axes)

    def combine(self, nid: int, template: str, args: list, dt: str, prefix: str | None = None) -> Val:
        """Emit an elementwise expression over `args` (Vals) into the right block."""
        block = self.deepest(*args)
        self.comment(nid, block)
        expr = template.format(*[a.expr for a in args])
        name = self.let(expr, block, prefix or f"{self.graph.nodes[nid].op.lower()}{nid}")
        return Val(
            name, dt, block,
            frozenset().union(*(a.masks for a in args)) if args else frozenset(),
            frozenset().union(*(a.axes for a in args)) if args else frozenset(),
        )
