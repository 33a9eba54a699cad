"""The generated product's code for a weight read where it is stored (layout ``"rows"``, ``[N, K]`` as
``nn.Linear`` keeps it), one row of x (a decode step): LLVM IR for one
:class:`~egraft.runtime.llvm_spec.KernelSpec`, and the pieces the forms for more rows
(``runtime.llvm_tiles``) and the integer product (``runtime.llvm_act8``) share.

One row: a dot per weight row (one sequential stream), up to four accumulators of :data:`VEC` lanes, summed
across lanes at the end.

Packed int4 weights: ``runtime.llvm_int4``, which builds on the pieces here.
"""

from __future__ import annotations

import re

from .llvm_spec import ITEMSIZE, VEC, WIDEN, KernelSpec, walk

# (one row of x) bytes ahead of its reads in the weight row that each step of the loop over k asks the cache for,
# by the weight's dtype.  An integer weight's product does several instructions per byte read (widen, convert,
# multiply-add), so few of its loads are in flight at once and it waits on memory: measured on an Intel Xeon
# (AVX-512, 2 cores, the 135 M Llama shape in int8, the same artifact with and without, alternating processes)
# decode 1.27x faster on two cores and 1.12x on one.  Float weights do one to three per 64 bytes: float32 measured
# 0.96-0.98x with it, bfloat16 level within the noise, so they ask for none.
AHEAD = {"int8": 4096, "int4": 4096}


def rows_product(spec: KernelSpec) -> str:
    """``@panel`` and ``@product`` for a weight read where it is stored, one row of x (more rows:
    ``runtime.llvm_tiles.many_rows_product``)."""
    if spec.rows != 1:
        raise ValueError(f"{spec}: the one-row product takes one row of x")
    if spec.group:
        raise ValueError(f"{spec}: an int4 weight's one-row product is runtime.llvm_int4.int4_row_product")
    return _rows_product(spec)


def _unroll(spec: KernelSpec) -> int:
    """(layout "rows", one row of x) vectors of k per step: up to four independent accumulators."""
    return next(u for u in (4, 2, 1) if spec.k % (VEC * u) == 0)


def prefetches(at: str, offsets: list[int], elem: str = "i8") -> str:
    """IR asking the cache for the weight row ``%wr``'s element ``at + offset`` (`at` an i64 value; elements of IR
    type `elem`, bytes by default) for each offset (a request past the weight's end is harmless: x86's prefetches
    do not fault)."""
    return "\n".join(f"  %pfo{i} = add i64 {at}, {off}\n"
                     f"  %pfp{i} = getelementptr {elem}, ptr %wr, i64 %pfo{i}\n"
                     f"  call void @llvm.prefetch.p0(ptr %pfp{i}, i32 0, i32 3, i32 1)"
                     for i, off in enumerate(offsets))


def ahead(spec: KernelSpec, values: int, rows: int = 1, table: dict | None = None) -> str:
    """IR asking, from a step at value ``%k`` of the weight row (and of the `rows` - 1 rows after it, k values
    apart), for every 64-byte line of the `values` it reads of each, the dtype's distance in `table` (default
    :data:`AHEAD`) further on (:func:`prefetches`); nothing for a dtype without one."""
    table = AHEAD if table is None else table
    if spec.dtype not in table:
        return ""
    size = ITEMSIZE[spec.dtype]
    byte = "  %kb = lshr i64 %k, 1" if size == 0.5 else f"  %kb = mul i64 %k, {size}"  # (int4: two values a byte)
    return byte + "\n" + prefetches("%kb", [table[spec.dtype] + int(r * spec.k * size) + 64 * i for r in range(rows)
                                             for i in range(max(1, int(values * size) // 64))])


def x_vectors(offsets: list[int], prefix: str = "", base: str = "%x") -> str:
    """IR loading :data:`VEC` values of x (at `base`) at ``%x + %k + offset`` for each offset, as ``%<prefix>x<j>``."""
    q = prefix
    return "\n".join(f"  %{q}xo{j} = add i64 %k, {off}\n"
                     f"  %{q}xp{j} = getelementptr float, ptr {base}, i64 %{q}xo{j}\n"
                     f"  %{q}x{j} = load <{VEC} x float>, ptr %{q}xp{j}, align 4" for j, off in enumerate(offsets))


def sum_chain(names: list[str], tag: str, ty: str, add: str = "fadd") -> tuple[str, str]:
    """IR adding the values `names` (of type `ty`, by the instruction `add`) in order, as ``%<tag><j>``; the lines
    and the name of the sum."""
    lines, last = [], names[0]
    for j, name in enumerate(names[1:], 1):
        lines.append(f"  %{tag}{j} = {add} {ty} {last}, {name}")
        last = f"%{tag}{j}"
    return "\n".join(lines), last


def widened_loads(spec: KernelSpec, at: str, offsets: list[int], width: int = VEC, base: str = "%wr",
                  tag: str = "") -> str:
    """IR loading `width` values of the weight's dtype at ``base + at + offset`` (the weight row ``%wr`` unless
    told) for each offset, widened to float32 by the dtype's row of ``WIDEN`` as ``%<tag>f<j>`` (the template's
    value names %wo, %wp, %v, %z, %s, %f prefixed with `tag` and suffixed with j)."""
    elem, widen = WIDEN[spec.dtype]
    out = []
    for j, off in enumerate(offsets):
        text = (f"  %wo = add i64 {at}, {off}\n  %wp = getelementptr {elem}, ptr {base}, i64 %wo\n"
                f"  %v = load <{width} x {elem}>, ptr %wp, align 2\n" + widen.format(w=width))
        out.append(re.sub(r"%(wo|wp|[vzsf])\b", lambda mt: f"%{tag}{mt.group(1)}{j}", text))
    return "\n".join(out)


def _rows_product(spec: KernelSpec) -> str:
    """(layout "rows", one row of x) ``@panel(x, w, out, s, p)``: each weight row ``p * width ..`` in turn (one
    sequential stream) dotted with x, :func:`_unroll` vectors of k per step, each accumulator summed across its
    lanes at the end; ``@product`` and ``@work`` as for panels."""
    k, v, u = spec.k, VEC, _unroll(spec)
    xs = x_vectors([j * v for j in range(u)])
    ws = widened_loads(spec, "%k", [j * v for j in range(u)])
    fmas = "\n".join(f"  %n{j} = call <{v} x float> @llvm.fma.v{v}f32(<{v} x float> %x{j}, <{v} x float> %f{j}, "
                      f"<{v} x float> %a{j})" for j in range(u))
    body = row_dot(f"{xs}\n{ws}\n{fmas}\n{ahead(spec, v * u)}", u, f"<{v} x float>", v * u, k)
    return f"""declare <{v} x float> @llvm.fma.v{v}f32(<{v} x float>, <{v} x float>, <{v} x float>)
declare float @llvm.vector.reduce.fadd.v{v}f32(float, <{v} x float>)
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
""" + rows_panel(spec, 1, body) + walk(spec)


def row_dot(steps: str, u: int, ty: str, advance: int, k: int) -> str:
    """(layout "rows", one row of x) the body of :func:`rows_panel` that dots the weight row ``%wr`` with x: a loop
    over k, `advance` values a pass, whose `steps` add into the `u` accumulators ``%a<j>`` (of type `ty`) as
    ``%n<j>``; then the accumulators added, their lanes summed and the sum stored as the row's output."""
    acc = "\n".join(f"  %a{j} = phi {ty} [zeroinitializer, %sub], [%n{j}, %dot]" for j in range(u))
    sums, last = sum_chain([f"%n{j}" for j in range(u)], "c", ty)
    lanes = ty[1:ty.index(" ")]
    return f"""  br label %dot
dot:
  %k = phi i64 [0, %sub], [%k1, %dot]
{acc}
{steps}
  %k1 = add i64 %k, {advance}
  %kd = icmp eq i64 %k1, {k}
  br i1 %kd, label %dot_done, label %dot
dot_done:
{sums}
  %t = call reassoc float @llvm.vector.reduce.fadd.v{lanes}f32(float 0.0, {ty} {last})
  %op = getelementptr float, ptr %out, i64 %row
  store float %t, ptr %op
"""


def rows_panel(spec: KernelSpec, step: int, body: str, prologue: str = "") -> str:
    """(layout "rows") ``@panel(x, w, out, s, p)``: panel `p`'s weight rows (fewer in a part-filled last panel),
    `step` at a time: `body` runs with ``%row`` the first of them and ``%wr`` its address (int4: ``%sr`` its
    scales'), from the block ``sub``, and ends in the block that goes on to the next.  A `prologue` runs first,
    from ``entry``, and ends by branching to ``start``."""
    w, k, elem = spec.width, spec.k, WIDEN[spec.dtype][0]
    stride = k // 2 if spec.group else k  # (int4: two values a byte)
    scales = (f"  %srow = mul i64 %row, {k // spec.group}\n  %sr = getelementptr float, ptr %s, i64 %srow\n"
              if spec.group else "")
    return f"""
define internal void @panel(ptr noalias %x, ptr noalias %wts, ptr noalias %out, ptr noalias %s, i64 %p) {{
entry:
{prologue or "  br label %start"}
start:
  %first = mul i64 %p, {w}
  %left = sub i64 {spec.weight_rows}, %first
  %lim = call i64 @llvm.umin.i64(i64 %left, i64 {w})
  br label %sub
sub:
  %r0 = phi i64 [0, %start], [%r1, %next]
  %row = add i64 %first, %r0
  %wrow = mul i64 %row, {stride}
  %wr = getelementptr {elem}, ptr %wts, i64 %wrow
{scales}{body}  br label %next
next:
  %r1 = add i64 %r0, {step}
  %rd = icmp uge i64 %r1, %lim
  br i1 %rd, label %exit, label %sub
exit:
  ret void
}}
"""


__all__ = ["AHEAD", "ahead", "prefetches", "row_dot", "rows_panel", "rows_product", "sum_chain", "widened_loads",
           "x_vectors"]
