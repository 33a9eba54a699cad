"""The generated CPU product's code: LLVM IR text for one :class:`KernelSpec`, with its XLA FFI handler.

``@product(x, panels, out)`` computes ``x [rows, k] float32`` times a weight
in its stored dtype (``runtime.llvm_kernels`` says why and how it runs), held
in one of two layouts (:data:`LAYOUTS`):

* ``"panels"``: ``[panels, k, width]``, a copy made once (column panels).
  Each step of the loop over ``k`` loads one panel row of ``width`` values,
  widens it to float32 in registers by the dtype's row of :data:`WIDEN`
  (exact for float16 and bfloat16) and adds ``x[m, k]`` times it into
  ``width`` float32 accumulators per row, for up to :data:`ROW_GROUP` rows
  at a time; a panel's row groups run while it is in cache.
* ``"rows"``: the weight as ``nn.Linear`` stores it, ``[panels * width, k]``
  (output rows, contiguous), read in place: no copy.  A "panel" is then
  ``width`` consecutive weight rows (the last panel may hold fewer).  One
  row of ``x`` reads one weight row at a time (a sequential stream),
  :data:`VEC` values of ``k`` per vector and up to four vectors per step,
  each accumulator summed across its lanes at the end.  More rows take the
  weight :data:`TILE` rows by :data:`TILE` values of ``k`` at a time: the
  tile is loaded, widened and transposed in registers into what a column
  panel would hold, and up to :data:`ROW_GROUP` rows of ``x`` add their
  products into their output columns; the next block of weight rows is
  prefetched in order meanwhile (its tiles' rows are ``k`` apart: read cold,
  sixteen strided streams ran at half the speed, measured).

XLA calls the product through the handler ``runtime.llvm_ffi`` adds.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..errors import BackendError
from .llvm_ffi import MAX_THREADS, SHARED, module

ROW_GROUP = 4  # rows a panel pass accumulates at once (4 rows x 64 columns: 16 AVX-512 registers)

# stored dtype -> (the LLVM element type loaded, the widening of a loaded vector %v to <w x float> named %f)
WIDEN = {
    "float32": ("i32", "  %f = bitcast <{w} x i32> %v to <{w} x float>"),
    "bfloat16": ("i16", "  %z = zext <{w} x i16> %v to <{w} x i32>\n"
                        "  %s = shl <{w} x i32> %z, splat (i32 16)\n"
                        "  %f = bitcast <{w} x i32> %s to <{w} x float>"),
    "float16": ("half", "  %f = fpext <{w} x half> %v to <{w} x float>"),
}
WIDTHS = (16, 32, 64, 128)
LAYOUTS = ("panels", "rows")
VEC = 16  # (layout "rows") k values per vector: one AVX-512 register of float32; k must be a multiple
TILE = 16  # (layout "rows", more than one row of x) weight rows x k values transposed in registers at a time


@dataclass(frozen=True)
class KernelSpec:
    """One generated product: ``[rows, k] float32 @ W -> [rows, panels * width]``, W of `dtype` held as panels
    ``[panels, k, width]`` (`layout` ``"panels"``) or as stored rows ``[panels * width, k]`` (``"rows"``)."""

    dtype: str
    rows: int
    k: int
    panels: int
    width: int
    layout: str = "panels"
    n: int = 0  # (layout "rows") the weight's rows, when the last panel holds fewer than width (0: all full)

    def __post_init__(self):
        if self.dtype not in WIDEN:
            raise BackendError(f"no generated CPU product for weights of dtype {self.dtype!r}; "
                               f"it takes {', '.join(WIDEN)}")
        if self.width not in WIDTHS or min(self.rows, self.k, self.panels) < 1:
            raise BackendError(f"a generated CPU product needs rows, k, panels >= 1 and a width in {WIDTHS}: {self}")
        if self.layout not in LAYOUTS:
            raise BackendError(f"unknown layout {self.layout!r} of a generated CPU product; one of {LAYOUTS}")
        if self.layout == "rows" and (self.k % VEC or self.weight_rows % TILE
                                      or not (self.panels - 1) * self.width < self.weight_rows <= self.panels * self.width):
            raise BackendError(f"a generated product reading stored rows needs k and the weight's rows multiples of "
                               f"{VEC} and {TILE}, within its last panel: {self}")

    @property
    def weight_rows(self) -> int:
        """(layout "rows") the weight's rows, N (the output has ``panels * width`` columns, the last N..)."""
        return self.n or self.panels * self.width

    @property
    def name(self) -> str:
        tail = "" if self.layout == "panels" else f"_{self.layout}" + (f"_{self.n}" if self.n else "")
        return f"egraft_stream_{self.dtype}_{self.rows}_{self.k}_{self.panels}_{self.width}{tail}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "KernelSpec":
        return cls(str(d["dtype"]), int(d["rows"]), int(d["k"]), int(d["panels"]), int(d["width"]),
                   str(d.get("layout", "panels")), int(d.get("n", 0)))


def _group_sizes(rows: int) -> list[int]:
    """The row-group sizes a product of `rows` rows calls its block with: :data:`ROW_GROUP`, and what is left."""
    full, rest = divmod(rows, ROW_GROUP)
    return sorted({ROW_GROUP if full else 0, rest} - {0})


def _row_groups(block: str, rows: int, k: int, n: int, start: str, args: str, k_at: str = "0") -> str:
    """IR calling ``@<block><G>(x rows, args, out rows)`` on each full group of :data:`ROW_GROUP` rows of x (at
    ``%x``, `k_at` values along k) and of their output rows (at ``%oc``, `n` columns apart), then once on the rest;
    entered from label `start`, it ends in the block ``groups_done`` (the product's code goes on there)."""
    full, rest = divmod(rows, ROW_GROUP)
    text = "  br label %group\n" if full else "  br label %groups_done\n"
    if full:
        text += f"""group:
  %g = phi i64 [0, %{start}], [%g1, %group]
  %gxr = mul i64 %g, {ROW_GROUP * k}
  %gxo = add i64 %gxr, {k_at}
  %gx = getelementptr float, ptr %x, i64 %gxo
  %goo = mul i64 %g, {ROW_GROUP * n}
  %go = getelementptr float, ptr %oc, i64 %goo
  call void @{block}{ROW_GROUP}(ptr %gx, {args}, ptr %go)
  %g1 = add i64 %g, 1
  %gd = icmp eq i64 %g1, {full}
  br i1 %gd, label %groups_done, label %group
"""
    text += "groups_done:\n"
    if rest:
        text += (f"  %rxo = add i64 {k_at}, {full * ROW_GROUP * k}\n"
                 f"  %rx = getelementptr float, ptr %x, i64 %rxo\n"
                 f"  %ro = getelementptr float, ptr %oc, i64 {full * ROW_GROUP * n}\n"
                 f"  call void @{block}{rest}(ptr %rx, {args}, ptr %ro)\n")
    return text


def _row_block(spec: KernelSpec, rows: int) -> str:
    """``@block<rows>(x, panel, out)``: `rows` rows of x against one panel, into their `width` output columns."""
    w, k = spec.width, spec.k
    elem, widen = WIDEN[spec.dtype]
    acc = "\n".join(f"  %a{m} = phi <{w} x float> [zeroinitializer, %entry], [%n{m}, %loop]" for m in range(rows))
    fmas = "\n".join(
        f"  %xo{m} = add i64 %k, {m * k}\n"
        f"  %xp{m} = getelementptr float, ptr %x, i64 %xo{m}\n"
        f"  %xs{m} = load float, ptr %xp{m}\n"
        f"  %xi{m} = insertelement <{w} x float> poison, float %xs{m}, i64 0\n"
        f"  %xb{m} = shufflevector <{w} x float> %xi{m}, <{w} x float> poison, <{w} x i32> zeroinitializer\n"
        f"  %n{m} = call <{w} x float> @llvm.fma.v{w}f32(<{w} x float> %xb{m}, <{w} x float> %f, <{w} x float> %a{m})"
        for m in range(rows))
    stores = "\n".join(
        f"  %op{m} = getelementptr float, ptr %out, i64 {m * spec.panels * w}\n"
        f"  store <{w} x float> %n{m}, ptr %op{m}, align 4" for m in range(rows))
    return f"""
define internal void @block{rows}(ptr noalias %x, ptr noalias %panel, ptr noalias %out) alwaysinline {{
entry:
  br label %loop
loop:
  %k = phi i64 [0, %entry], [%k1, %loop]
{acc}
  %wo = mul i64 %k, {w}
  %wp = getelementptr {elem}, ptr %panel, i64 %wo
  %v = load <{w} x {elem}>, ptr %wp, align 2
{widen.format(w=w)}
{fmas}
  %k1 = add i64 %k, 1
  %done = icmp eq i64 %k1, {k}
  br i1 %done, label %exit, label %loop
exit:
{stores}
  ret void
}}"""


def _unroll(spec: KernelSpec) -> int:
    """(layout "rows", one row of x) vectors of k per step: up to four independent accumulators."""
    return next(u for u in (4, 2, 1) if spec.k % (VEC * u) == 0)


def _suffixed(text: str, tag: str) -> str:
    """A load's and the widening template's value names (%wo, %wp, %v, %z, %s, %f) with the suffix `tag`."""
    return re.sub(r"%(wo|wp|[vzsf])\b", lambda mt: f"%{mt.group(1)}{tag}", text)


def _rows_product(spec: KernelSpec) -> str:
    """(layout "rows", one row of x) ``@panel(x, w, out, p)``: each weight row ``p * width ..`` in turn (one
    sequential stream) dotted with x, :func:`_unroll` vectors of k per step, each accumulator summed across its
    lanes at the end; ``@product`` and ``@work`` as for panels."""
    k, v, u = spec.k, VEC, _unroll(spec)
    elem, widen = WIDEN[spec.dtype]
    acc = "\n".join(f"  %a{j} = phi <{v} x float> [zeroinitializer, %sub], [%n{j}, %dot]" for j in range(u))
    xs = "\n".join(f"  %xo{j} = add i64 %k, {j * v}\n"
                    f"  %xp{j} = getelementptr float, ptr %x, i64 %xo{j}\n"
                    f"  %x{j} = load <{v} x float>, ptr %xp{j}, align 4" for j in range(u))
    # each weight vector's load and widening, the template's value names (%v, %z, %s, %f) suffixed with it
    ws = "\n".join(_suffixed(f"  %wo = add i64 %k, {j * v}\n"
                              f"  %wp = getelementptr {elem}, ptr %wr, i64 %wo\n"
                              f"  %v = load <{v} x {elem}>, ptr %wp, align 2\n" + widen.format(w=v), f"{j}")
                    for j in range(u))
    fmas = "\n".join(f"  %n{j} = call <{v} x float> @llvm.fma.v{v}f32(<{v} x float> %x{j}, <{v} x float> %f{j}, "
                      f"<{v} x float> %a{j})" for j in range(u))
    sums, last = [], "%n0"
    for j in range(1, u):
        sums.append(f"  %c{j} = fadd <{v} x float> {last}, %n{j}")
        last = f"%c{j}"
    sums = "\n".join(sums)
    body = f"""  br label %dot
dot:
  %k = phi i64 [0, %sub], [%k1, %dot]
{acc}
{xs}
{ws}
{fmas}
  %k1 = add i64 %k, {v * u}
  %kd = icmp eq i64 %k1, {k}
  br i1 %kd, label %dot_done, label %dot
dot_done:
{sums}
  %t = call reassoc float @llvm.vector.reduce.fadd.v{v}f32(float 0.0, <{v} x float> {last})
  %op = getelementptr float, ptr %out, i64 %row
  store float %t, ptr %op
"""
    return f"""declare <{v} x float> @llvm.fma.v{v}f32(<{v} x float>, <{v} x float>, <{v} x float>)
declare float @llvm.vector.reduce.fadd.v{v}f32(float, <{v} x float>)
""" + _rows_panel(spec, 1, body) + _walk(spec)


def _rows_panel(spec: KernelSpec, step: int, body: str) -> str:
    """(layout "rows") ``@panel(x, w, out, p)``: panel `p`'s weight rows (fewer in a part-filled last panel),
    `step` at a time: `body` runs with ``%row`` the first of them and ``%wr`` its address, from the block ``sub``,
    and ends in the block that goes on to the next."""
    w, k, elem = spec.width, spec.k, WIDEN[spec.dtype][0]
    return f"""
define internal void @panel(ptr noalias %x, ptr noalias %wts, ptr noalias %out, i64 %p) {{
entry:
  %first = mul i64 %p, {w}
  %left = sub i64 {spec.weight_rows}, %first
  %lim = call i64 @llvm.umin.i64(i64 %left, i64 {w})
  br label %sub
sub:
  %r0 = phi i64 [0, %entry], [%r1, %next]
  %row = add i64 %first, %r0
  %wrow = mul i64 %row, {k}
  %wr = getelementptr {elem}, ptr %wts, i64 %wrow
{body}  br label %next
next:
  %r1 = add i64 %r0, {step}
  %rd = icmp uge i64 %r1, %lim
  br i1 %rd, label %exit, label %sub
exit:
  ret void
}}
"""


def _transpose(names: list[str], tag: str) -> tuple[str, list[str]]:
    """IR transposing the 16 x 16 float tile held in the vectors `names` (row r in names[r]): four rounds of
    interleaving each vector with the one eight further (a perfect shuffle); the new vectors' names."""
    lo = ", ".join(f"i32 {x}" for i in range(8) for x in (i, 16 + i))
    hi = ", ".join(f"i32 {x}" for i in range(8, 16) for x in (i, 16 + i))
    lines, cur = [], list(names)
    for rnd in range(4):
        new = []
        for i in range(8):
            a, b = cur[i], cur[i + 8]
            for half, mask in (("l", lo), ("h", hi)):
                name = f"%{tag}{rnd}_{i}{half}"
                lines.append(f"  {name} = shufflevector <16 x float> {a}, <16 x float> {b}, <16 x i32> <{mask}>")
                new.append(name)
        cur = new
    return "\n".join(lines), cur


def _tile_block(spec: KernelSpec, rows: int) -> str:
    """(layout "rows", rows > 1) ``@tblock<rows>(xm, fresh, u0 .. u15, op)``: `rows` rows of x (at `xm`, k already
    offset) add their products with the transposed tile ``u`` into their :data:`TILE` output columns at `op`
    (running sums there; zeros first when `fresh`)."""
    t, k, n = TILE, spec.k, spec.panels * spec.width
    args = ", ".join(f"<{t} x float> %u{i}" for i in range(t))
    head = "\n".join(f"  %op{g} = getelementptr float, ptr %op, i64 {g * n}\n"
                      f"  %old{g} = load <{t} x float>, ptr %op{g}, align 4\n"
                      f"  %a{g}_0 = select i1 %fresh, <{t} x float> zeroinitializer, <{t} x float> %old{g}"
                      for g in range(rows))
    fmas = "\n".join(f"  %xp{g}_{i} = getelementptr float, ptr %xm, i64 {g * k + i}\n"
                      f"  %xs{g}_{i} = load float, ptr %xp{g}_{i}\n"
                      f"  %xi{g}_{i} = insertelement <{t} x float> poison, float %xs{g}_{i}, i64 0\n"
                      f"  %xb{g}_{i} = shufflevector <{t} x float> %xi{g}_{i}, <{t} x float> poison, "
                      f"<{t} x i32> zeroinitializer\n"
                      f"  %a{g}_{i + 1} = call <{t} x float> @llvm.fma.v{t}f32(<{t} x float> %xb{g}_{i}, "
                      f"<{t} x float> %u{i}, <{t} x float> %a{g}_{i})" for i in range(t) for g in range(rows))
    stores = "\n".join(f"  store <{t} x float> %a{g}_{t}, ptr %op{g}, align 4" for g in range(rows))
    return f"""
define internal void @tblock{rows}(ptr noalias %xm, i1 %fresh, {args}, ptr noalias %op) alwaysinline {{
entry:
{head}
{fmas}
{stores}
  ret void
}}"""


def _tile_product(spec: KernelSpec) -> str:
    """(layout "rows", rows > 1) ``@panel(x, w, out, p)``: the panel's weight rows :data:`TILE` at a time; for each
    :data:`TILE` values of k their tile is loaded, widened and transposed in registers (so vector i holds the
    block's weights at k + i, as a column panel would), then the rows of x, :data:`ROW_GROUP` at a time, add
    their products into their :data:`TILE` output columns in ``out`` (the running sums live there; k in
    order, as the panel product's)."""
    w, k, elem, t = spec.width, spec.k, WIDEN[spec.dtype][0], TILE
    n = spec.panels * w
    widen = WIDEN[spec.dtype][1]
    loads = "\n".join(_suffixed(f"  %wo = add i64 %wk, {r * k}\n"
                                 f"  %wp = getelementptr {elem}, ptr %wr, i64 %wo\n"
                                 f"  %v = load <{t} x {elem}>, ptr %wp, align 2\n" + widen.format(w=t), f"{r}")
                       for r in range(t))
    shuffle, cols = _transpose([f"%f{r}" for r in range(t)], "q")
    us = ", ".join(f"<{t} x float> {c}" for c in cols)
    groups = _row_groups("tblock", spec.rows, k, n, "kt", f"i1 %fresh, {us}", "%wk")
    blocks = "".join(_tile_block(spec, r) for r in _group_sizes(spec.rows))
    # the tile's rows are k apart (t streams): the next block of t weight rows (contiguous) is fetched ahead in
    # order, a tile's worth (t * t values) per step, so the strided reads find it in cache
    per_line = 64 // (4 if spec.dtype == "float32" else 2)
    prefetch = "\n".join(f"  %pfo{j} = add i64 %pfb, {j * per_line}\n"
                          f"  %pfp{j} = getelementptr {elem}, ptr %wr, i64 %pfo{j}\n"
                          f"  call void @llvm.prefetch.p0(ptr %pfp{j}, i32 0, i32 3, i32 1)"
                          for j in range(t * t // per_line))
    prefetch = f"  %pfk = mul i64 %wk, {t}\n  %pfb = add i64 %pfk, {t * k}\n" + prefetch
    body = f"""  %oc = getelementptr float, ptr %out, i64 %row
  br label %kt
kt:
  %wk = phi i64 [0, %sub], [%wk1, %groups_done]
  %fresh = icmp eq i64 %wk, 0
{loads}
{prefetch}
{shuffle}
{groups}  %wk1 = add i64 %wk, {t}
  %kd = icmp eq i64 %wk1, {k}
  br i1 %kd, label %tiles_done, label %kt
tiles_done:
"""
    return f"""declare <{t} x float> @llvm.fma.v{t}f32(<{t} x float>, <{t} x float>, <{t} x float>)
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
{blocks}
""" + _rows_panel(spec, t, body) + _walk(spec)


def _product(spec: KernelSpec) -> str:
    """``@panel(x, panels, out, p)``: panel `p`'s row groups against it while it is in cache; ``@product``: every
    panel in turn; ``@work(job)``: panels claimed one at a time from a shared job (``runtime.llvm_ffi.SHARED``)."""
    if spec.layout == "rows":
        return _rows_product(spec) if spec.rows == 1 else _tile_product(spec)
    w, k, elem = spec.width, spec.k, WIDEN[spec.dtype][0]
    groups = _row_groups("block", spec.rows, k, spec.panels * w, "entry", "ptr %pp")
    blocks = "".join(_row_block(spec, r) for r in _group_sizes(spec.rows))
    return f"""declare <{w} x float> @llvm.fma.v{w}f32(<{w} x float>, <{w} x float>, <{w} x float>)
{blocks}

define internal void @panel(ptr noalias %x, ptr noalias %panels, ptr noalias %out, i64 %p) {{
entry:
  %po = mul i64 %p, {k * w}
  %pp = getelementptr {elem}, ptr %panels, i64 %po
  %oo = mul i64 %p, {w}
  %oc = getelementptr float, ptr %out, i64 %oo
{groups}  ret void
}}
""" + _walk(spec)


def _walk(spec: KernelSpec) -> str:
    """``@product``: every panel in turn (whatever its layout), then the shared job's code (``runtime.llvm_ffi.SHARED``)."""
    return f"""
define void @product(ptr noalias %x, ptr noalias %panels, ptr noalias %out) {{
entry:
  br label %loop
loop:
  %p = phi i64 [0, %entry], [%p1, %loop]
  call void @panel(ptr %x, ptr %panels, ptr %out, i64 %p)
  %p1 = add i64 %p, 1
  %pd = icmp eq i64 %p1, {spec.panels}
  br i1 %pd, label %done, label %loop
done:
  ret void
}}
""" + SHARED


def module_ir(spec: KernelSpec) -> str:
    """The whole LLVM module for `spec`: the product and its XLA FFI handler (``runtime.llvm_ffi``)."""
    return module(_product(spec), spec.panels)


__all__ = ["KernelSpec", "LAYOUTS", "MAX_THREADS", "ROW_GROUP", "TILE", "VEC", "WIDEN", "WIDTHS", "module_ir"]
