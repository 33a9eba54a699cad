"""The generated product's code for a weight read where it is stored (layout ``"rows"``, ``[N, K]`` as
``nn.Linear`` keeps it): LLVM IR for one :class:`~egraft.runtime.llvm_spec.KernelSpec`.

Three forms, by the rows of x (``runtime.llvm_spec`` holds the spec and the pieces every form shares):

* one row: a dot per weight row (one sequential stream), up to four
  accumulators of :data:`VEC` lanes, summed across lanes at the end;
* more rows, "tiles": the weight :data:`TILE` rows by :data:`TILE` values of k at
  a time, transposed in registers into what a column panel would hold, the
  next block prefetched in order; the rows of x add their products into
  their output columns;
* more rows, "dots": :data:`DOT_ROWS` weight rows at a time (as many
  sequential streams), each dotted with every row of x, one accumulator a
  pair, the lane sums of a block's accumulators made together.

Packed int4 weights (two values a byte in blocks of 32: a block's 16 bytes hold its first 16 values in bits
0-3, the next 16 in bits 4-7; one float32 scale per ``group`` values of k) take the one-row form and the dots,
32 values of k a step: each block is loaded once, its two halves sign-extended and widened, and both multiplied
by their group's scale (dequantised in registers) before the products (:func:`_int4_loads`).

Tiles are faster where their rows do not evict one another (k = 896, 4864:
120-202 GF/s against the dots' 86-195); a tile's rows are k apart, and when
that stride is a multiple of 4 KB all sixteen fall in one L1 set, which is
when the dots are used (:func:`_tiles_alias`; k = 2048, 8192: tiles 42-98
GF/s, dots 91-183; bench/rows_layout_kernels.py, an AVX-512 host).
"""

from __future__ import annotations

import re

from .llvm_spec import ITEMSIZE, TILE, VEC, WIDEN, KernelSpec, group_sizes, row_groups, walk


def rows_product(spec: KernelSpec) -> str:
    """``@panel`` and ``@product`` for a weight read where it is stored (the module docstring's three forms)."""
    if spec.rows == 1:
        return _int4_row_product(spec) if spec.group else _rows_product(spec)
    return _dots_product(spec) if spec.group or _tiles_alias(spec) else _tile_product(spec)


def _unroll(spec: KernelSpec) -> int:
    """(layout "rows", one row of x) vectors of k per step: up to four independent accumulators."""
    return next(u for u in (4, 2, 1) if spec.k % (VEC * u) == 0)


def _int4_loads(spec: KernelSpec, at: str, offsets: list[int], scaled: bool = True, prefix: str = "") -> str:
    """(int4) IR loading the block of 32 values at ``%wr`` + `at` + each offset (values along the weight's rows;
    16 bytes: bits 0-3 its first 16 values, bits 4-7 the next 16), dequantised with their group's scale (at
    ``%sr``, the scales of ``%wr``'s row, one per ``group`` values): ``%<prefix>f<2j>`` and ``%<prefix>f<2j+1>``,
    the block's two halves.  A two's complement nibble q is ``(q ^ 8) - 8``: the bytes are widened to 32 bits and
    xor'd with 0x88, each field masked out (no sign extension of bytes, which x86 has no instruction for) and
    converted, and ``u * s - 8 s`` is one fused multiply-add (exact: ``u - 8`` is q, and ``q * s`` rounds once).
    Not `scaled`: ``u`` itself (0..15; the caller applies ``s (x . u - 8 sum x)`` per group)."""
    v, shift, q = VEC, spec.group.bit_length() - 1, prefix
    out = []
    for j, off in enumerate(offsets):
        lo, hi = (f"%{q}fl{j}", f"%{q}fh{j}") if scaled else (f"%{q}f{2 * j}", f"%{q}f{2 * j + 1}")
        out.append(f"""  %{q}wo{j} = add i64 {at}, {off}
  %{q}wh{j} = lshr i64 %{q}wo{j}, 1
  %{q}wp{j} = getelementptr i8, ptr %wr, i64 %{q}wh{j}
  %{q}v{j} = load <{v} x i8>, ptr %{q}wp{j}, align 1
  %{q}vz{j} = zext <{v} x i8> %{q}v{j} to <{v} x i32>
  %{q}vx{j} = xor <{v} x i32> %{q}vz{j}, splat (i32 136)
  %{q}ul{j} = and <{v} x i32> %{q}vx{j}, splat (i32 15)
  %{q}vs{j} = lshr <{v} x i32> %{q}vx{j}, splat (i32 4)
  {lo} = sitofp <{v} x i32> %{q}ul{j} to <{v} x float>
  {hi} = sitofp <{v} x i32> %{q}vs{j} to <{v} x float>""")
        if scaled:
            out.append(f"""  %{q}si{j} = lshr i64 %{q}wo{j}, {shift}
  %{q}sp{j} = getelementptr float, ptr %sr, i64 %{q}si{j}
  %{q}ss{j} = load float, ptr %{q}sp{j}
  %{q}sn{j} = fmul float %{q}ss{j}, -8.0
  %{q}sx{j} = insertelement <{v} x float> poison, float %{q}ss{j}, i64 0
  %{q}sb{j} = shufflevector <{v} x float> %{q}sx{j}, <{v} x float> poison, <{v} x i32> zeroinitializer
  %{q}nx{j} = insertelement <{v} x float> poison, float %{q}sn{j}, i64 0
  %{q}nb{j} = shufflevector <{v} x float> %{q}nx{j}, <{v} x float> poison, <{v} x i32> zeroinitializer""")
            out += [f"  %{q}f{2 * j + e} = call <{v} x float> @llvm.fma.v{v}f32(<{v} x float> {u}, "
                    f"<{v} x float> %{q}sb{j}, <{v} x float> %{q}nb{j})" for e, u in enumerate((lo, hi))]
    return "\n".join(out)


def _x_vectors(offsets: list[int], prefix: str = "") -> str:
    """IR loading :data:`VEC` values of x at ``%x + %k + offset`` for each offset, as ``%<prefix>x<j>``."""
    q = prefix
    return "\n".join(f"  %{q}xo{j} = add i64 %k, {off}\n"
                     f"  %{q}xp{j} = getelementptr float, ptr %x, i64 %{q}xo{j}\n"
                     f"  %{q}x{j} = load <{VEC} x float>, ptr %{q}xp{j}, align 4" for j, off in enumerate(offsets))


def sum_chain(names: list[str], tag: str, ty: str, add: str = "fadd") -> tuple[str, str]:
    """IR adding the values `names` (of type `ty`, by the instruction `add`) in order, as ``%<tag><j>``; the lines
    and the name of the sum."""
    lines, last = [], names[0]
    for j, name in enumerate(names[1:], 1):
        lines.append(f"  %{tag}{j} = {add} {ty} {last}, {name}")
        last = f"%{tag}{j}"
    return "\n".join(lines), last


def _widened_loads(spec: KernelSpec, at: str, offsets: list[int], width: int = VEC) -> str:
    """IR loading `width` weight values at ``%wr + at + offset`` for each offset, widened to float32 by the
    dtype's row of ``WIDEN`` as ``%f<j>`` (the template's value names %wo, %wp, %v, %z, %s, %f suffixed with j)."""
    elem, widen = WIDEN[spec.dtype]
    out = []
    for j, off in enumerate(offsets):
        text = (f"  %wo = add i64 {at}, {off}\n  %wp = getelementptr {elem}, ptr %wr, i64 %wo\n"
                f"  %v = load <{width} x {elem}>, ptr %wp, align 2\n" + widen.format(w=width))
        out.append(re.sub(r"%(wo|wp|[vzsf])\b", lambda mt: f"%{mt.group(1)}{j}", text))
    return "\n".join(out)


def _int4_row_product(spec: KernelSpec) -> str:
    """(int4, one row of x) ``@panel(x, w, out, s, p)``: each weight row in turn, a group of k at a time: the
    products of x with the group's unsigned fields u (``q + 8``) summed, then scaled once,
    ``y = sum_g s_g (x_g . u_g) - 8 sum_g s_g X_g`` with ``X_g`` the sum of x over group g (made once per panel),
    which is ``x . (q * s)`` to rounding.  Up to four groups a step, each with its own accumulators."""
    k, v, g = spec.k, VEC, spec.group
    groups, per_group = k // g, g // VEC  # vectors of k a group
    step = next(n for n in (4, 2, 1) if n * g <= 128 and groups % n == 0 or n == 1)  # groups a step
    shift = g.bit_length() - 1
    xs_loads = "\n".join(f"  %xq{j} = getelementptr float, ptr %xg, i64 {j * v}\n"
                          f"  %xv{j} = load <{v} x float>, ptr %xq{j}, align 4" for j in range(per_group))
    xs_sum, xs_total = sum_chain([f"%xv{j}" for j in range(per_group)], "xw", f"<{v} x float>")
    prologue = f"""  %xsum = alloca float, i64 {groups}, align 64
  br label %xs
xs:
  %gi = phi i64 [0, %entry], [%gi1, %xs]
  %xo = mul i64 %gi, {g}
  %xg = getelementptr float, ptr %x, i64 %xo
{xs_loads}
{xs_sum}
  %xr = call reassoc float @llvm.vector.reduce.fadd.v{v}f32(float 0.0, <{v} x float> {xs_total})
  %xsp = getelementptr float, ptr %xsum, i64 %gi
  store float %xr, ptr %xsp
  %gi1 = add i64 %gi, 1
  %gd = icmp eq i64 %gi1, {groups}
  br i1 %gd, label %start, label %xs
"""
    lines = []
    for i in range(step):  # group i of the step: its vectors, two chains (first and second halves of blocks)
        lines.append(_x_vectors([i * g + j * v for j in range(per_group)], f"g{i}"))
        lines.append(_int4_loads(spec, "%k", [i * g + b * 32 for b in range(per_group // 2)], False, f"g{i}"))
        ends = []
        for h in (0, 1):
            prev = None
            for j in range(h, per_group, 2):
                name = f"%g{i}c{h}_{j}"
                if prev is None:
                    lines.append(f"  {name} = fmul <{v} x float> %g{i}x{j}, %g{i}f{j}")
                else:
                    lines.append(f"  {name} = call <{v} x float> @llvm.fma.v{v}f32(<{v} x float> %g{i}x{j}, "
                                 f"<{v} x float> %g{i}f{j}, <{v} x float> {prev})")
                prev = name
            ends.append(prev)
        lines.append(f"""  %g{i}acc = fadd <{v} x float> {ends[0]}, {ends[1]}
  %g{i}k = add i64 %k, {i * g}
  %g{i}i = lshr i64 %g{i}k, {shift}
  %g{i}sp = getelementptr float, ptr %sr, i64 %g{i}i
  %g{i}s = load float, ptr %g{i}sp
  %g{i}xp = getelementptr float, ptr %xsum, i64 %g{i}i
  %g{i}X = load float, ptr %g{i}xp
  %g{i}sx = insertelement <{v} x float> poison, float %g{i}s, i64 0
  %g{i}sb = shufflevector <{v} x float> %g{i}sx, <{v} x float> poison, <{v} x i32> zeroinitializer
  %t{i}n = call <{v} x float> @llvm.fma.v{v}f32(<{v} x float> %g{i}acc, <{v} x float> %g{i}sb, <{v} x float> %t{i})
  %c{i}n = call float @llvm.fma.f32(float %g{i}s, float %g{i}X, float %c{i})""")
    phis = "\n".join(f"  %t{i} = phi <{v} x float> [zeroinitializer, %sub], [%t{i}n, %grp]\n"
                      f"  %c{i} = phi float [0.0, %sub], [%c{i}n, %grp]" for i in range(step))
    tsum, tlast = sum_chain([f"%t{i}n" for i in range(step)], "tt", f"<{v} x float>")
    rsum, rlast = sum_chain([f"%c{i}n" for i in range(step)], "cc", "float")
    body = f"""  br label %grp
grp:
  %k = phi i64 [0, %sub], [%k1, %grp]
{phis}
{chr(10).join(lines)}
  %k1 = add i64 %k, {step * g}
  %kd = icmp eq i64 %k1, {k}
  br i1 %kd, label %dot_done, label %grp
dot_done:
{tsum}
{rsum}
  %t = call reassoc float @llvm.vector.reduce.fadd.v{v}f32(float 0.0, <{v} x float> {tlast})
  %res = call float @llvm.fma.f32(float {rlast}, float -8.0, float %t)
  %op = getelementptr float, ptr %out, i64 %row
  store float %res, ptr %op
"""
    return f"""declare <{v} x float> @llvm.fma.v{v}f32(<{v} x float>, <{v} x float>, <{v} x float>)
declare float @llvm.fma.f32(float, float, float)
declare float @llvm.vector.reduce.fadd.v{v}f32(float, <{v} x float>)
""" + rows_panel(spec, 1, body, prologue) + walk(spec)


def _rows_product(spec: KernelSpec) -> str:
    """(layout "rows", one row of x) ``@panel(x, w, out, s, p)``: each weight row ``p * width ..`` in turn (one
    sequential stream) dotted with x, :func:`_unroll` vectors of k per step, each accumulator summed across its
    lanes at the end; ``@product`` and ``@work`` as for panels."""
    k, v, u = spec.k, VEC, _unroll(spec)
    acc = "\n".join(f"  %a{j} = phi <{v} x float> [zeroinitializer, %sub], [%n{j}, %dot]" for j in range(u))
    xs = _x_vectors([j * v for j in range(u)])
    ws = _widened_loads(spec, "%k", [j * v for j in range(u)])
    fmas = "\n".join(f"  %n{j} = call <{v} x float> @llvm.fma.v{v}f32(<{v} x float> %x{j}, <{v} x float> %f{j}, "
                      f"<{v} x float> %a{j})" for j in range(u))
    sums, last = sum_chain([f"%n{j}" for j in range(u)], "c", f"<{v} x float>")
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
""" + rows_panel(spec, 1, body) + walk(spec)


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
    """(layout "rows", rows > 1) ``@panel(x, w, out, s, p)``: the panel's weight rows :data:`TILE` at a time; for each
    :data:`TILE` values of k their tile is loaded, widened and transposed in registers (so vector i holds the
    block's weights at k + i, as a column panel would), then the rows of x, :data:`ROW_GROUP` at a time, add
    their products into their :data:`TILE` output columns in ``out`` (the running sums live there; k in
    order, as the panel product's)."""
    w, k, elem, t = spec.width, spec.k, WIDEN[spec.dtype][0], TILE
    n = spec.panels * w
    loads = _widened_loads(spec, "%wk", [r * k for r in range(t)], t)
    shuffle, cols = _transpose([f"%f{r}" for r in range(t)], "q")
    us = ", ".join(f"<{t} x float> {c}" for c in cols)
    groups = row_groups("tblock", spec.rows, k, n, "kt", f"i1 %fresh, {us}", "%wk")
    blocks = "".join(_tile_block(spec, r) for r in group_sizes(spec.rows))
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
""" + rows_panel(spec, t, body) + walk(spec)


DOT_ROWS = 4  # (layout "rows", more than one row of x) weight rows a dot block reads together


def _lane_sums(names: list[str], tag: str) -> tuple[str, str]:
    """IR summing the lanes of each of up to :data:`VEC` float vectors: the name of one vector whose lane j is
    the sum of ``names[j]`` (lanes past them 0).  Four rounds each add pairs of vectors, half of each lane run
    of one vector with the other half (two shuffles and an add a pair), then one shuffle puts the sums in order."""
    v = VEC
    cur = list(names) + ["zeroinitializer"] * (v - len(names))
    owner = [[j] * v for j in range(v)]  # owner[i][lane]: whose partial sum that lane of vector i holds
    lines = []
    for rnd in range(4):
        b = v >> (rnd + 1)  # each owner's run of lanes is 2b long; its two halves are added
        new, new_owner = [], []
        for i in range(0, len(cur), 2):
            lo = [c + h for k in range(0, v, 2 * b) for c in (k, v + k) for h in range(b)]
            hi = [x + b for x in lo]
            src = owner[i] + owner[i + 1]
            for half, mask in (("l", lo), ("h", hi)):
                lines.append(f"  %{tag}{rnd}_{i}{half} = shufflevector <{v} x float> {cur[i]}, <{v} x float> "
                             f"{cur[i + 1]}, <{v} x i32> <{', '.join(f'i32 {x}' for x in mask)}>")
            lines.append(f"  %{tag}{rnd}_{i} = fadd <{v} x float> %{tag}{rnd}_{i}l, %{tag}{rnd}_{i}h")
            new.append(f"%{tag}{rnd}_{i}")
            new_owner.append([src[x] for x in lo])
        cur, owner = new, new_owner
    order = [owner[0].index(j) for j in range(v)]
    lines.append(f"  %{tag} = shufflevector <{v} x float> {cur[0]}, <{v} x float> poison, "
                 f"<{v} x i32> <{', '.join(f'i32 {x}' for x in order)}>")
    return "\n".join(lines), f"%{tag}"


def _dot_block(spec: KernelSpec, rows: int) -> str:
    """``@dblock<rows>(x, wr, sr, out)``: `rows` rows of x dotted with the :data:`DOT_ROWS` weight rows at `wr`
    (int4: their scales at `sr`), one :data:`VEC`-wide accumulator per pair, each summed across its lanes at the
    end into ``out`` (rows n apart).  A step reads :data:`VEC` values of k (int4: a block of 32, two vectors)."""
    k, v, d, n = spec.k, VEC, DOT_ROWS, spec.panels * spec.width
    h = 2 if spec.group else 1  # vectors of k a step
    acc = "\n".join(f"  %a{m}_{r} = phi <{v} x float> [zeroinitializer, %entry], [%n{m}_{r}, %loop]"
                    for m in range(rows) for r in range(d))
    xs = _x_vectors([m * k + e * v for m in range(rows) for e in range(h)])  # %x<h m + e>
    ws = (_int4_loads(spec, "%k", [r * k for r in range(d)]) if spec.group  # %f<2 r + e>
          else _widened_loads(spec, "%k", [r * k for r in range(d)]))

    def fma(m, r):
        chain, acc_in = [], f"%a{m}_{r}"
        for e in range(h):
            out = f"%n{m}_{r}" if e == h - 1 else f"%t{m}_{r}_{e}"
            chain.append(f"  {out} = call <{v} x float> @llvm.fma.v{v}f32(<{v} x float> %x{h * m + e}, "
                         f"<{v} x float> %f{h * r + e}, <{v} x float> {acc_in})")
            acc_in = out
        return "\n".join(chain)
    fmas = "\n".join(fma(m, r) for m in range(rows) for r in range(d))
    reduce, total = _lane_sums([f"%n{m}_{r}" for m in range(rows) for r in range(d)], "rs")
    sums = reduce + "\n" + "\n".join(
        f"  %row{m} = shufflevector <{v} x float> {total}, <{v} x float> poison, "
        f"<{d} x i32> <{', '.join(f'i32 {m * d + r}' for r in range(d))}>\n"
        f"  %op{m} = getelementptr float, ptr %out, i64 {m * n}\n"
        f"  store <{d} x float> %row{m}, ptr %op{m}, align 4" for m in range(rows))
    return f"""
define internal void @dblock{rows}(ptr noalias %x, ptr noalias %wr, ptr noalias %sr, ptr noalias %out) alwaysinline {{
entry:
  br label %loop
loop:
  %k = phi i64 [0, %entry], [%k1, %loop]
{acc}
{xs}
{ws}
{fmas}
  %k1 = add i64 %k, {v * h}
  %kd = icmp eq i64 %k1, {k}
  br i1 %kd, label %exit, label %loop
exit:
{sums}
  ret void
}}"""


def _dots_product(spec: KernelSpec) -> str:
    """(layout "rows", rows > 1) ``@panel(x, w, out, s, p)``: the panel's weight rows :data:`DOT_ROWS` at a time (as
    many sequential streams), each block dotted with every row of x, :data:`ROW_GROUP` rows at a time."""
    v, n = VEC, spec.panels * spec.width
    groups = row_groups("dblock", spec.rows, spec.k, n, "sub", f"ptr %wr, ptr {'%sr' if spec.group else '%s'}")
    blocks = "".join(_dot_block(spec, r) for r in group_sizes(spec.rows))
    body = f"""  %oc = getelementptr float, ptr %out, i64 %row
{groups}"""
    return f"""declare <{v} x float> @llvm.fma.v{v}f32(<{v} x float>, <{v} x float>, <{v} x float>)
{blocks}
""" + rows_panel(spec, DOT_ROWS, body) + walk(spec)


def _tiles_alias(spec: KernelSpec) -> bool:
    """(layout "rows") A tile's :data:`TILE` weight rows are ``k`` apart: when that stride is a multiple of 4 KB
    they all fall in one set of an L1 data cache (64 sets of 64 bytes on x86) and evict one another.  Measured
    (bench/rows_layout_kernels.py, AVX-512 host): k = 2048 and 8192 ran the tiles at 42-98 GF/s against the dots'
    91-183; k = 896 and 4864 at 120-202 against 86-195."""
    return (spec.k * ITEMSIZE[spec.dtype]) % 4096 == 0


__all__ = ["DOT_ROWS", "rows_panel", "rows_product", "sum_chain"]
