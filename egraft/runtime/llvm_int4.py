"""Packed int4 weights read where they are stored (layout ``"rows"``): how a 4-bit field becomes a float, and the
one-row product (:func:`int4_row_product`); the forms for more rows (``runtime.llvm_tiles``) take
:func:`int4_loads`.

A block's 16 bytes hold 32 values (its first 16 in bits 0-3, the next 16 in bits 4-7; one float32 scale per
``group`` values of k): each block is loaded once, its two halves sign-extended and widened, and both multiplied
by their group's scale (dequantised in registers) before the products (:func:`int4_loads`).  The one-row product
reads each field as its unsigned value and scales a group's sum once; how a field becomes a float depends on the
host (:func:`int4_form`).
"""

from __future__ import annotations

from .llvm_rows import ahead, rows_panel, sum_chain, x_vectors
from .llvm_spec import VEC, KernelSpec, host_has, walk

# (int4, unscaled) u = q + 8 as a float for each value r of a 4-bit field, (r ^ 8): the table vpermps looks up
U_TABLE = "<" + ", ".join(f"float {float(r ^ 8)}" for r in range(16)) + ">"
PERMVAR = "declare <16 x float> @llvm.x86.avx512.permvar.sf.512(<16 x float>, <16 x i32>)\n"  # (VEC = 16 lanes)
LOOKUP = f"call <16 x float> @llvm.x86.avx512.permvar.sf.512(<16 x float> {U_TABLE}, <16 x i32>"  # + the indices


def permutes() -> bool:
    """Whether this host's CPU has AVX-512F, whose ``vpermps`` looks up a 16-entry float table by each lane's
    low 4 bits: one instruction from a byte's field to its value as a float (the int4 one-row product)."""
    return host_has("avx512f")


def shuffles() -> bool:
    """Whether this host's CPU has AVX2, whose ``vpshufb`` on 32 bytes the "spread" form looks fields up with."""
    return host_has("avx2")


def int4_form(group: int) -> str:
    """(int4, one row of x) how the product turns a field into a float on this host: ``"lookup"`` (AVX-512F:
    :func:`permutes`), ``"spread"`` (AVX2 and groups of 64 or more: :func:`int4_spread_loads`) or ``"convert"``
    (xor, mask and an integer conversion: :func:`int4_loads`)."""
    if permutes():
        return "lookup"
    return "spread" if shuffles() and group >= 2 * SPREAD_BLOCK else "convert"


SPREAD_BLOCK = 32  # (int4) values a packed block holds; the spread form reads two blocks (64 values) at a time
# (int4, "spread") the byte a field r looks up: bit 7 the float's lowest exponent bit, bits 3-6 u = r ^ 8, so a
# 32-bit lane [0, 0, byte, 0x3F] is the float 1 + u / 16 (exact)
_SPREAD_TABLE = [0x80 | ((r ^ 8) << 3) for r in range(16)]
# (int4, "spread") the float a field u is read as is (16 + u) / 16: the product sums x . (16 + u) / 16 per group,
# so x . q = 16 (x . f) - 24 X (X the group's sum of x), where the other forms read u itself: x . u - 8 X
UNSIGNED = {"spread": (16.0, -24.0), "lookup": (1.0, -8.0), "convert": (1.0, -8.0)}


def _i8(values: list[int]) -> str:
    return "<" + ", ".join(f"i8 {v - 256 if v > 127 else v}" for v in values) + ">"


def spread_order() -> list[int]:
    """(int4, ``"spread"``) position p of a 64-value chunk of x as :func:`int4_spread_loads` reads it -> the value of
    the chunk it holds: lane ``l`` of 8-lane vector ``s`` (``p = 8 s + l``) holds field ``4 (s % 4) + l % 4`` of
    the low (s < 4) or high (s >= 4) halves of block ``l // 4``."""
    return [SPREAD_BLOCK * ((p % 8) // 4) + 16 * ((p // 8) >= 4) + 4 * ((p // 8) % 4) + p % 4 for p in range(64)]


def int4_spread_loads(at: str, offsets: list[int], prefix: str = "") -> str:
    """(int4, AVX2) IR reading the two blocks (64 values) at ``%wr`` + `at` + each offset as four vectors of
    :data:`VEC` floats ``%<prefix>f<4c + m>`` (c the offset's index), values in :func:`spread_order`, each
    ``(16 + u) / 16``: one 32-byte load, the low and high fields masked out of the bytes (a 16-bit shift for the
    high ones), each looked up by ``vpshufb`` in :data:`_SPREAD_TABLE`, and each looked-up byte spread into byte 2
    of a 32-bit lane (``vpshufb`` again, within each 128-bit half) under the exponent byte 0x3F: no integer
    conversion and no widening of bytes, which the "convert" form spends most of its instructions on (measured on
    an AVX2 Zen 3)."""
    q, table = prefix, _i8(_SPREAD_TABLE * 2)
    out = []
    for c, off in enumerate(offsets):
        out.append(f"""  %{q}so{c} = add i64 {at}, {off}
  %{q}sh{c} = lshr i64 %{q}so{c}, 1
  %{q}sp{c} = getelementptr i8, ptr %wr, i64 %{q}sh{c}
  %{q}sv{c} = load <32 x i8>, ptr %{q}sp{c}, align 1
  %{q}sl{c} = and <32 x i8> %{q}sv{c}, splat (i8 15)
  %{q}sw{c} = bitcast <32 x i8> %{q}sv{c} to <16 x i16>
  %{q}ss{c} = lshr <16 x i16> %{q}sw{c}, splat (i16 4)
  %{q}sb{c} = bitcast <16 x i16> %{q}ss{c} to <32 x i8>
  %{q}su{c} = and <32 x i8> %{q}sb{c}, splat (i8 15)
  %{q}tl{c} = call <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8> {table}, <32 x i8> %{q}sl{c})
  %{q}th{c} = call <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8> {table}, <32 x i8> %{q}su{c})""")
        for t in range(8):
            j, src = t % 4, ("tl" if t < 4 else "th")
            mask = _i8([(4 * j + lane % 4 if b == 2 else 0x80) for lane in range(8) for b in range(4)])
            out.append(f"""  %{q}e{c}_{t} = call <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8> %{q}{src}{c},
                                                  <32 x i8> {mask})
  %{q}d{c}_{t} = bitcast <32 x i8> %{q}e{c}_{t} to <8 x i32>
  %{q}o{c}_{t} = or <8 x i32> %{q}d{c}_{t}, splat (i32 {0x3F000000})
  %{q}g{c}_{t} = bitcast <8 x i32> %{q}o{c}_{t} to <8 x float>""")
        out += [f"  %{q}f{4 * c + m} = shufflevector <8 x float> %{q}g{c}_{2 * m}, <8 x float> %{q}g{c}_{2 * m + 1}, "
                f"<16 x i32> <{', '.join(f'i32 {i}' for i in range(16))}>" for m in range(4)]
    return "\n".join(out)


SPREAD_DECLS = "declare <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8>, <32 x i8>)\n"


def int4_loads(spec: KernelSpec, at: str, offsets: list[int], scaled: bool = True, prefix: str = "") -> str:
    """(int4) IR loading the block of 32 values at ``%wr`` + `at` + each offset (values along the weight's rows;
    16 bytes: bits 0-3 its first 16 values, bits 4-7 the next 16), dequantised with their group's scale (at
    ``%sr``, the scales of ``%wr``'s row, one per ``group`` values): ``%<prefix>f<2j>`` and ``%<prefix>f<2j+1>``,
    the block's two halves.  A two's complement nibble q is ``(q ^ 8) - 8``: the bytes are widened to 32 bits and
    xor'd with 0x88, each field masked out (no sign extension of bytes, which x86 has no instruction for) and
    converted, and ``u * s - 8 s`` is one fused multiply-add (exact: ``u - 8`` is q, and ``q * s`` rounds once).
    Not `scaled`: ``u`` itself (0..15; the caller applies ``s (x . u - 8 sum x)`` per group), where the host has
    AVX-512F (:func:`permutes`) looked up in :data:`U_TABLE` by each field's bits in place of the xor, mask and
    conversion (measured on the Xeon: int4 decode 1.08x on one core, a 1536 x 576 product in cache 1.2x)."""
    v, shift, q = VEC, spec.group.bit_length() - 1, prefix
    out = []
    for j, off in enumerate(offsets):
        lo, hi = (f"%{q}fl{j}", f"%{q}fh{j}") if scaled else (f"%{q}f{2 * j}", f"%{q}f{2 * j + 1}")
        out.append(f"""  %{q}wo{j} = add i64 {at}, {off}
  %{q}wh{j} = lshr i64 %{q}wo{j}, 1
  %{q}wp{j} = getelementptr i8, ptr %wr, i64 %{q}wh{j}
  %{q}v{j} = load <{v} x i8>, ptr %{q}wp{j}, align 1
  %{q}vz{j} = zext <{v} x i8> %{q}v{j} to <{v} x i32>""")
        if not scaled and int4_form(spec.group) == "lookup":  # vpermps reads each lane's low 4 bits: the low field
            out.append(f"""  {lo} = {LOOKUP} %{q}vz{j})
  %{q}vs{j} = lshr <{v} x i32> %{q}vz{j}, splat (i32 4)
  {hi} = {LOOKUP} %{q}vs{j})""")
            continue
        out.append(f"""  %{q}vx{j} = xor <{v} x i32> %{q}vz{j}, splat (i32 136)
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


PREPARED_MAX = 32768  # (int4, one row) floats of a prepared x held on the stack at most (128 KiB: k up to ~32 K)


def prepared(spec: KernelSpec) -> int:
    """(int4, one row of x) floats of what :func:`int4_row_product` makes of x once a call (``@prepare``, on the
    stack of the handler or of ``@product``, then read by every panel): x as the panels read it (k values; the
    spread form's order) and each group's sum ``X_g``; 0 where that would not fit :data:`PREPARED_MAX` (each
    panel then makes its own)."""
    n = spec.k + spec.k // spec.group
    return n if n <= PREPARED_MAX else 0


def int4_row_product(spec: KernelSpec) -> str:
    """(int4, one row of x) ``@panel(x, w, out, s, p)``: each weight row in turn, a group of k at a time: the
    products of x with the group's unsigned fields u (``q + 8``) summed, then scaled once,
    ``y = sum_g s_g (x_g . u_g) - 8 sum_g s_g X_g`` with ``X_g`` the sum of x over group g,
    which is ``x . (q * s)`` to rounding (the "spread" form reads ``(16 + u) / 16``: :data:`UNSIGNED`, with x
    copied in the order it reads the fields in).  The sums ``X_g`` (and the spread form's copy of x) are made once
    a call (:func:`prepared`), not once a panel.  Up to four groups a step, each with its own accumulators."""
    k, v, g = spec.k, VEC, spec.group
    form = int4_form(g)
    groups, per_group = k // g, g // VEC  # vectors of k a group
    step = next(n for n in (4, 2, 1) if n * g <= 128 and groups % n == 0 or n == 1)  # groups a step
    shift = g.bit_length() - 1
    xs_loads = "\n".join(f"  %xq{j} = getelementptr float, ptr %xg, i64 {j * v}\n"
                          f"  %xv{j} = load <{v} x float>, ptr %xq{j}, align 4" for j in range(per_group))
    xs_sum, xs_total = sum_chain([f"%xv{j}" for j in range(per_group)], "xw", f"<{v} x float>")
    once = prepared(spec) > 0
    src, read = ("%xin", "%x") if once else ("%x", "%xperm" if form == "spread" else "%x")
    # X_g per group into %xsum; the spread form also copies x into %xperm in the order it reads the fields in
    # (spread_order), 64 values at a time: each vector of 8 two runs of 4, one 128-bit load each
    sums = f"""  br label %xs
xs:
  %gi = phi i64 [0, %entry], [%gi1, %xs]
  %xo = mul i64 %gi, {g}
  %xg = getelementptr float, ptr {src}, i64 %xo
{xs_loads}
{xs_sum}
  %xr = call reassoc float @llvm.vector.reduce.fadd.v{v}f32(float 0.0, <{v} x float> {xs_total})
  %xsp = getelementptr float, ptr %xsum, i64 %gi
  store float %xr, ptr %xsp
  %gi1 = add i64 %gi, 1
  %gd = icmp eq i64 %gi1, {groups}
  br i1 %gd, label %{"perm" if form == "spread" else ("copy" if once else "start")}, label %xs
"""
    if form == "spread":
        order, eight = spread_order(), "<" + ", ".join(f"i32 {i}" for i in range(8)) + ">"
        runs = "\n".join(f"""  %pa{t} = getelementptr float, ptr %cx, i64 {order[8 * t]}
  %pb{t} = getelementptr float, ptr %cx, i64 {order[8 * t + 4]}
  %la{t} = load <4 x float>, ptr %pa{t}, align 4
  %lb{t} = load <4 x float>, ptr %pb{t}, align 4
  %lv{t} = shufflevector <4 x float> %la{t}, <4 x float> %lb{t}, <8 x i32> {eight}
  %ly{t} = getelementptr float, ptr %cy, i64 {8 * t}
  store <8 x float> %lv{t}, ptr %ly{t}, align 32""" for t in range(8))
        sums += f"""perm:
  br label %pc
pc:
  %ci = phi i64 [0, %perm], [%ci1, %pc]
  %co = mul i64 %ci, 64
  %cx = getelementptr float, ptr {src}, i64 %co
  %cy = getelementptr float, ptr {"%x" if once else "%xperm"}, i64 %co
{runs}
  %ci1 = add i64 %ci, 1
  %cd = icmp eq i64 %ci1, {k // 64}
  br i1 %cd, label %{"done" if once else "start"}, label %pc
"""
    elif once:
        sums += f"""copy:
  call void @llvm.memcpy.p0.p0.i64(ptr align 64 %x, ptr align 4 %xin, i64 {4 * k}, i1 false)
  br label %done
"""
    if once:  # made once a call (the handler's, or @product's, stack): [x as read, k values][X_g, a group each]
        prepare = f"""
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)

define internal void @prepare(ptr noalias %xin, ptr noalias %x) {{
entry:
  %xsum = getelementptr float, ptr %x, i64 {k}
{sums}done:
  ret void
}}
"""
        prologue = f"  %xsum = getelementptr float, ptr %x, i64 {k}\n  br label %start\n"
    else:  # (x too long for the stack) made in each panel
        prepare = ""
        prologue = (f"  %xsum = alloca float, i64 {groups}, align 64\n"
                    + (f"  %xperm = alloca float, i64 {k}, align 64\n" if form == "spread" else "") + sums)
    lines = []
    for i in range(step):  # group i of the step: its vectors, two chains (first and second halves of blocks)
        if form == "spread":
            lines.append(x_vectors([i * g + j * v for j in range(per_group)], f"g{i}", read))
            lines.append(int4_spread_loads("%k", [i * g + c * 64 for c in range(per_group // 4)], f"g{i}"))
        else:
            lines.append(x_vectors([i * g + j * v for j in range(per_group)], f"g{i}"))
            lines.append(int4_loads(spec, "%k", [i * g + b * 32 for b in range(per_group // 2)], False, f"g{i}"))
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
{ahead(spec, step * g)}
  %k1 = add i64 %k, {step * g}
  %kd = icmp eq i64 %k1, {k}
  br i1 %kd, label %dot_done, label %grp
dot_done:
{tsum}
{rsum}
  %t = call reassoc float @llvm.vector.reduce.fadd.v{v}f32(float 0.0, <{v} x float> {tlast})
  %tu = fmul float %t, {UNSIGNED[form][0]}
  %res = call float @llvm.fma.f32(float {rlast}, float {UNSIGNED[form][1]}, float %tu)
  %op = getelementptr float, ptr %out, i64 %row
  store float %res, ptr %op
"""
    return f"""declare <{v} x float> @llvm.fma.v{v}f32(<{v} x float>, <{v} x float>, <{v} x float>)
declare float @llvm.fma.f32(float, float, float)
declare float @llvm.vector.reduce.fadd.v{v}f32(float, <{v} x float>)
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
{ {"lookup": PERMVAR, "spread": SPREAD_DECLS}.get(form, "")}""" + prepare + rows_panel(spec, 1, body, prologue) \
        + walk(spec, prepared(spec))


__all__ = ["LOOKUP", "PERMVAR", "PREPARED_MAX", "SPREAD_BLOCK", "SPREAD_DECLS", "UNSIGNED", "U_TABLE", "int4_form", "int4_loads",
           "int4_row_product", "int4_spread_loads", "permutes", "prepared", "shuffles", "spread_order"]
