"""One kernel plan -> readable Triton source, written to a file and imported.

Every kernel has the same skeleton: a 1-D grid whose program id is split
into (batch, row block, column block); the root's index is built from those
(batch dims are scalars, the row dim is tile axis 0, the column dim tile
axis 1); the root's value is written by the kernel writer with the rule
table; one masked store.  Shapes, strides and extents are literals (shapes
are static per compile), block sizes are ``tl.constexpr`` arguments, so the
source reads like hand-written Triton and a kernel's signature is just its
tensor pointers.  ``@triton.jit`` needs real source, hence the files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

from ...errors import BackendError
from ...ir import Op, dtypes
from ...ir.graph import Graph
from .device_functions import definitions
from .emitter import TL_DTYPE, ZERO, Ix, KernelWriter
from .partition import KernelPlan, pow2

PTR_TYPE = {d: r.triton_ptr for d, r in dtypes.ROWS.items()}


@dataclass
class KernelSpec:
    """A generated kernel: its source, where it lives, and how to launch it."""

    name: str
    kind: str
    root: int
    inputs: tuple  # node ids of the tensors it reads, in argument order
    params: tuple  # (argument name, IR dtype) for inputs then the output
    constexprs: dict
    grid: int
    num_warps: int
    num_stages: int
    source: str
    path: str = ""
    covers: tuple = ()
    fn: object = field(default=None, repr=False)

    @property
    def signature(self) -> dict:
        sig = {p: PTR_TYPE[dt] for p, dt in self.params}
        sig.update({k: "constexpr" for k in self.constexprs})
        return sig


def cache_dir() -> Path:
    d = Path(os.environ.get("EGRAFT_CACHE_DIR", Path.home() / ".cache" / "egraft")) / "triton_kernels"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _ident(s: str) -> str:
    s = re.sub(r"\W", "_", s)
    return s if s and not s[0].isdigit() else f"t_{s}"


def buffer_names(graph: Graph, materialised) -> dict[int, str]:
    names = {}
    for i, n in enumerate(graph.nodes):
        if n.op == Op.Input:
            names[i] = _ident(f"{'w' if n.attrs['role'] == 'weight' else 'in'}_{n.attrs['name']}")[:40] + f"_{i}"
        elif n.op == Op.Constant and n.shape != ():
            names[i] = f"const_{i}"
        elif i in materialised:
            names[i] = f"{n.op.lower()}_{i}"
    return names


def _tile_index(w, name, mask, pid, block_name, n, n_blocks, block, tile_dim, rank) -> Ix:
    """The index of one tiled axis (rows or columns): ``pid * BLOCK + arange(BLOCK)``, masked past ``n``."""
    start = f"{pid} * {block_name} + " if n_blocks > 1 else ""
    w.line(0, f"{name} = {start}tl.arange(0, {block_name}){_slice(tile_dim, rank)}")
    masks = frozenset()
    if n_blocks * block > n:
        w.line(0, f"{mask} = {name} < {n}")
        masks = frozenset({mask})
    return Ix(name, 0, masks, frozenset({tile_dim}))


def _slice(axis: int, rank: int) -> str:
    return "[" + ", ".join(":" if a == axis else "None" for a in range(rank)) + "]"


def generate(graph: Graph, plan: KernelPlan, names: dict, knobs: dict, index: int) -> KernelSpec:
    if plan.kind == "scatter":
        return _generate_scatter(graph, plan, names, knobs, index)
    root = graph.nodes[plan.root]
    S = root.shape
    rank_root = len(S)
    ca = plan.col_dim
    if plan.kind in ("dot", "attention"):
        ra, ca = rank_root - 2, rank_root - 1
    else:
        ra = next((d for d in range(rank_root - 1, -1, -1) if d != ca), None)
    R = S[ra] if ra is not None else 1
    C = S[ca] if ca is not None else 1
    batch_dims = [d for d in range(rank_root) if d not in (ra, ca)]
    elems = knobs.get("tile_elems", 2048)
    rank = 2
    constexprs: dict = {}
    ctx: dict = {"root": plan.root, "root_shape": S, "mask_block": {},
                 "mask_axes": {"row_mask": frozenset({0}), "col_mask": frozenset({1})}, "dots": plan.dots,
                 "persistent": plan.persistent, "input_precision": "tf32" if knobs.get("tf32") else "ieee"}
    if plan.kind == "tile":
        bk = 1
        if plan.reduce_k:
            rank = 3
            bk = min(pow2(plan.reduce_k), max(16, elems // 4))
        bc = pow2(C) if plan.persistent else min(pow2(C), max(1, elems // bk))
        br = max(1, min(pow2(R), elems // max(1, bc * bk)))
        constexprs = {"BLOCK_R": br, "BLOCK_C": bc}
        if rank == 3:
            constexprs["BLOCK_K"] = bk
        ctx["block_k"] = bk
        axis_sizes = {0: "BLOCK_R", 1: "BLOCK_C", 2: "BLOCK_K"}
        rows_name, cols_name = "BLOCK_R", "BLOCK_C"
    elif plan.kind == "dot":
        bm, bn, bk = knobs.get("matmul_block", (64, 64, 32))
        form = plan.dots[plan.main]
        br = min(bm, max(16, pow2(R)))
        bc = min(bn, max(16, pow2(C)))
        bk = min(bk, max(16, pow2(form.K)))
        constexprs = {"BLOCK_M": br, "BLOCK_N": bc, "BLOCK_K": bk}
        ctx.update(BM="BLOCK_M", BN="BLOCK_N", BK="BLOCK_K", BK_value=bk)
        axis_sizes = {0: "BLOCK_M", 1: "BLOCK_N"}
        rows_name, cols_name = "BLOCK_M", "BLOCK_N"
    else:
        bm, bn = knobs.get("attention_block", (64, 64))
        att = graph.nodes[plan.main]
        q, k = graph.nodes[att.inputs[0]], graph.nodes[att.inputs[1]]
        br = min(bm, max(16, pow2(R)))
        bc = max(16, pow2(C))
        constexprs = {"BLOCK_M": br, "BLOCK_N": min(bn, max(16, pow2(k.shape[-2]))),
                      "BLOCK_D": max(16, pow2(q.shape[-1])), "BLOCK_DV": bc}
        ctx["sizes"] = dict(constexprs)
        axis_sizes = {0: "BLOCK_M", 1: "BLOCK_DV"}
        rows_name, cols_name = "BLOCK_M", "BLOCK_DV"
    ctx["axis_sizes"] = axis_sizes
    NB = prod(S[d] for d in batch_dims) if batch_dims else 1
    NR, NC = -(-R // br), -(-C // bc)
    grid = NB * NR * NC

    inputs = [i for i in plan.inputs]
    out_name = f"out_{root.op.lower()}_{plan.root}"
    buffers = {i: names[i] for i in inputs}
    w = KernelWriter(graph, buffers, rank, _rules(), ctx)
    w.names |= set(buffers.values()) | {out_name, "pid", "pid_r", "pid_c", "pid_b", "rows", "cols", "zero",
                                        "row_mask", "col_mask", "tl", "triton", *constexprs}
    w.ctx["zero_tile"] = "zero"
    w.line(0, "pid = tl.program_id(0)")
    w.line(0, f"zero = tl.zeros([{', '.join('1' for _ in range(rank))}], tl.int32)")
    if NC > 1:
        w.line(0, f"pid_c = pid % {NC}")
    if NR > 1:
        w.line(0, f"pid_r = (pid // {NC}) % {NR}" if NC > 1 else f"pid_r = pid % {NR}")
    if NB > 1:
        w.line(0, f"pid_b = pid // {NC * NR}" if NC * NR > 1 else "pid_b = pid")
    idx: list = [ZERO] * rank_root
    inner = 1
    for d in reversed(batch_dims):
        n = S[d]
        if n > 1:
            e = "pid_b" if inner == 1 else f"(pid_b // {inner})"
            if inner * n < NB:
                e = f"{e} % {n}"
            idx[d] = w.new_index(e, 0, prefix=f"b{d}")
        inner *= n
    force_rows = plan.kind in ("dot", "attention")
    if ra is not None and (R > 1 or force_rows):
        idx[ra] = _tile_index(w, "rows", "row_mask", "pid_r", rows_name, R, NR, br, 0, rank)
    col_ix = None
    if ca is not None and (C > 1 or force_rows):
        col_ix = idx[ca] = _tile_index(w, "cols", "col_mask", "pid_c", cols_name, C, NC, bc, 1, rank)
    ctx["col"] = {"dim": ca, "ix": col_ix or ZERO, "mask": "col_mask" if col_ix is not None and col_ix.masks else None,
                  "whole": NC == 1} if ca is not None else None
    idx = tuple(idx)
    val = w.value(plan.root, idx)
    flat = w.flat_index(S, idx)
    all_masks = frozenset().union(*(ix.masks for ix in idx)) if idx else frozenset()
    all_axes = frozenset().union(*(ix.axes for ix in idx)) if idx else frozenset()
    v = w.broadcast_full(val, all_axes) if all_axes else val.expr
    if not all_axes and set(val.axes):
        raise BackendError(f"internal: scalar output %{plan.root} computed as a tile")
    if dtypes.is_half(root.dtype):
        v = f"{v}.to({TL_DTYPE[root.dtype]})"
    ptr = f"{out_name} + {flat.expr}" if flat.expr != "0" else out_name
    if not all_axes:
        ptr = f"{ptr} + zero"
    mask = w.mask_expr(all_masks)
    w.line(w.deepest(val, flat), f"tl.store({ptr}, {v}{', mask=' + mask if mask else ''})")

    tile_desc = (f"rows = dim {ra} ({R})" if ra is not None else "no row dim") + ", " + (
        f"cols = dim {ca} ({C})" if ca is not None else "no col dim")
    tile_desc += f"; batch dims {batch_dims}; grid = {NB} x {NR} x {NC} programs"
    return _spec(graph, plan, w, inputs, names, out_name, constexprs, grid, knobs, index, tile_desc)


def _generate_scatter(graph: Graph, plan: KernelPlan, names: dict, knobs: dict, index: int) -> KernelSpec:
    """A Scatter root's kernel: programs over blocks of whole lines (every dim but the axis, flattened onto
    tile axis 0), the body from the Scatter rule (``scatter.py``: copy x, barrier, store the updates)."""
    root = graph.nodes[plan.root]
    S, ax = root.shape, root.attrs["axis"]
    line_dims = [d for d in range(len(S)) if d != ax]
    L = prod(S[d] for d in line_dims)
    longest = max(S[ax], graph.nodes[root.inputs[2]].shape[ax])
    elems = knobs.get("tile_elems", 2048)
    bc = min(pow2(longest), max(16, elems))
    br = max(1, min(pow2(L), elems // bc))
    grid = -(-L // br)
    constexprs = {"BLOCK_R": br, "BLOCK_C": bc}
    ctx: dict = {"root": plan.root, "root_shape": S, "mask_block": {}, "mask_axes": {"row_mask": frozenset({0})},
                 "axis_sizes": {0: "BLOCK_R", 1: "BLOCK_C"}, "zero_tile": "zero"}
    inputs = list(plan.inputs)
    out_name = ctx["out"] = f"out_{root.op.lower()}_{plan.root}"
    w = KernelWriter(graph, {i: names[i] for i in inputs}, 2, _rules(), ctx)
    w.names |= set(w.buffers.values()) | {out_name, "pid", "rows", "zero", "row_mask", "tl", "triton", *constexprs}
    w.line(0, "pid = tl.program_id(0)")
    w.line(0, "zero = tl.zeros([1, 1], tl.int32)")
    lines: list = [ZERO] * len(S)
    if L > 1:
        rows = _tile_index(w, "rows", "row_mask", "pid", "BLOCK_R", L, grid, br, 0, 2)
        inner = 1
        for d in reversed(line_dims):
            if S[d] > 1:
                e = rows.expr if inner == 1 else f"({rows.expr} // {inner})"
                if inner * S[d] < L:
                    e = f"{e} % {S[d]}"
                lines[d] = w.new_index(e, 0, rows.masks, rows.axes, prefix=f"l{d}")
            inner *= S[d]
    w.covered.add(plan.root)
    w.rules[root.op].emit(w, plan.root, root, tuple(lines))
    tile_desc = f"rows = the {L} lines off axis {ax}, cols = chunks of axis {ax}; grid = {grid} programs"
    return _spec(graph, plan, w, inputs, names, out_name, constexprs, grid, knobs, index, tile_desc)


def _spec(graph, plan, w, inputs, names, out_name, constexprs, grid, knobs, index, tile_desc) -> KernelSpec:
    """The kernel's source (signature, docstring, the writer's body) as a KernelSpec."""
    root = graph.nodes[plan.root]
    covers = tuple(sorted(w.covered))
    fn_name = f"k{index}_{root.op.lower()}_{plan.root}"
    params = tuple((names[i], graph.nodes[i].dtype) for i in inputs) + ((out_name, root.dtype),)
    sig = ", ".join([p for p, _ in params] + [f"{c}: tl.constexpr" for c in constexprs])
    doc = [
        f'    """{plan.kind} kernel for %{plan.root} = {root.op} : {list(root.shape)} {root.dtype}.',
        "",
        f"    Covers IR nodes {_ranges(covers)}; reads {', '.join(f'%{i}' for i in inputs) or 'nothing'}.",
        f"    Tile: {tile_desc}.",
        '    """',
    ]
    src = [
        f'"""Generated by egraft (Triton backend): kernel {index} of a graph, root %{plan.root} {root.op}."""',
        "import triton",
        "import triton.language as tl",
        *definitions(w.functions),
        "",
        "",
        "@triton.jit",
        f"def {fn_name}({sig}):",
        *doc,
        *w.render(),
        "",
    ]
    source = "\n".join(src)
    return KernelSpec(fn_name, plan.kind, plan.root, tuple(inputs), params, constexprs, grid,
                      int(knobs.get("num_warps", 4)), int(knobs.get("num_stages", 2)), source, covers=covers)


def _ranges(ids) -> str:
    out, i = [], 0
    ids = list(ids)
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(f"%{ids[i]}" if i == j else f"%{ids[i]}-%{ids[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def _rules():
    from .rules import RULES

    return RULES


def load(spec: KernelSpec) -> KernelSpec:
    """Write the source to the cache directory and import its @triton.jit function."""
    digest = hashlib.sha256(spec.source.encode()).hexdigest()[:16]
    path = cache_dir() / f"{spec.name}_{digest}.py"
    if not path.exists() or path.read_text() != spec.source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(spec.source)
        os.replace(tmp, path)
    mod_name = f"egraft_triton_kernels.{path.stem}"
    mod = sys.modules.get(mod_name)
    if mod is None:
        s = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(s)
        s.loader.exec_module(mod)
        sys.modules[mod_name] = mod
    spec.path = str(path)
    spec.fn = getattr(mod, spec.name)
    return spec

