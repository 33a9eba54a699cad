"""The generated product's code for a weight read where it is stored (layout ``"rows"``), more than one row
of x (a prompt's chunk, a batch): LLVM IR for one :class:`~egraft.runtime.llvm_spec.KernelSpec`.

Two forms:

* "tiles": the weight :data:`~egraft.runtime.llvm_spec.TILE` rows by ``TILE`` values of k at a time, transposed
  in registers into what a column panel would hold, the next block prefetched in order; the rows of x add their
  products into their output columns;
* "dots": :data:`DOT_ROWS` weight rows at a time (as many sequential streams, each asked for
  :data:`DOTS_AHEAD` bytes ahead), each dotted with every row of x, one accumulator a pair, the lane sums of a
  block's accumulators made together (packed int4 weights take this form, dequantised in registers by
  ``runtime.llvm_int4.int4_loads``; so does a spec of 2 to ``DOTS_ROWS`` rows with ``form="dots"``: at a few
  rows the tiles' transpose costs more instructions than the multiply-adds it feeds).

A bfloat16 x (``KernelSpec(act="bfloat16")``, ``runtime.llvm_bf16``) takes the tiles with 32 values of k a tile,
each lane a pair of neighbouring weights, multiplied with x's pair by AVX512-BF16's dot instruction (or widened);
measured on an Intel Xeon with it, 1.1-2.5 times the float32-x tiles at 2-8 rows of x, 0.77-0.91 at 16 (so the
planner passes bfloat16 x up to ``ACT16_ROWS`` rows).

Tiles are faster where their rows do not evict one another (k = 896, 4864:
120-202 GF/s against the dots' 86-195); a tile's rows are k apart, and when
that stride is a multiple of 4 KB all sixteen fall in one L1 set, which is
when the dots are used (``llvm_spec.tiles_alias``; k = 2048, 8192: tiles 42-98
GF/s, dots 91-183; bench/rows_layout_kernels.py, an AVX-512 host).
"""

from __future__ import annotations

from .llvm_bf16 import dot_instruction
from .llvm_int4 import int4_loads
from .llvm_rows import AHEAD, ahead, prefetches, rows_panel, widened_loads, x_vectors
from .llvm_spec import TILE, VEC, WIDEN, KernelSpec, group_sizes, row_groups, tiles_alias, walk


def many_rows_product(spec: KernelSpec) -> str:
    """``@panel`` and ``@product`` for a weight read where it is stored, more than one row of x: the dots for
    int4 weights, where a tile's rows would share an L1 set and where the spec asks for them (``form="dots"``,
    knob ``few_rows``), the tiles otherwise."""
    return _dots_product(spec) if spec.group or tiles_alias(spec) or spec.form == "dots" else _tile_product(spec)


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


def _x_terms(spec: KernelSpec, g: int, i: int) -> str:
    """(a tile block) IR adding row `g` of x's share of transposed vector ``%u<i>`` into ``%a<g>_<i>`` as
    ``%a<g>_<i+1>``.  float32 x: x[g, i] broadcast times the vector (TILE values of k a step).  bfloat16 x
    (``runtime.llvm_bf16``): the vector holds pairs of bfloat16 weights (k = 2i, 2i + 1), x's pair at the same k
    is broadcast as one 32-bit lane and the CPU's bfloat16 dot adds both products, or, without it, both are
    widened and multiplied-added in turn."""
    t, k, q = TILE, spec.k, f"{g}_{i}"
    if spec.act == "float32":
        return (f"  %xp{q} = getelementptr float, ptr %xm, i64 {g * k + i}\n"
                f"  %xs{q} = load float, ptr %xp{q}\n"
                f"  %xi{q} = insertelement <{t} x float> poison, float %xs{q}, i64 0\n"
                f"  %xb{q} = shufflevector <{t} x float> %xi{q}, <{t} x float> poison, <{t} x i32> zeroinitializer\n"
                f"  %a{g}_{i + 1} = call <{t} x float> @llvm.fma.v{t}f32(<{t} x float> %xb{q}, "
                f"<{t} x float> %u{i}, <{t} x float> %a{g}_{i})")
    pair = (f"  %xp{q} = getelementptr i16, ptr %xm, i64 {g * k + 2 * i}\n"
            f"  %xs{q} = load i32, ptr %xp{q}, align 2\n"
            f"  %xi{q} = insertelement <{t} x i32> poison, i32 %xs{q}, i64 0\n"
            f"  %xb{q} = shufflevector <{t} x i32> %xi{q}, <{t} x i32> poison, <{t} x i32> zeroinitializer\n")
    if dot_instruction():
        return pair + (f"  %xd{q} = bitcast <{t} x i32> %xb{q} to <{2 * t} x bfloat>\n"
                       f"  %ud{q} = bitcast <{t} x float> %u{i} to <{2 * t} x bfloat>\n"
                       f"  %a{g}_{i + 1} = call <{t} x float> @llvm.x86.avx512bf16.dpbf16ps.512(<{t} x float> "
                       f"%a{g}_{i}, <{2 * t} x bfloat> %ud{q}, <{2 * t} x bfloat> %xd{q})")
    lines = [pair, f"  %ui{q} = bitcast <{t} x float> %u{i} to <{t} x i32>"]
    acc = f"%a{g}_{i}"
    for half, (op, mask) in enumerate((("shl", "16"), ("and", "-65536"))):  # the pair's first value, then its second
        out = f"%a{g}_{i + 1}" if half else f"%ah{q}"
        lines.append(f"""  %uh{q}_{half} = {op} <{t} x i32> %ui{q}, splat (i32 {mask})
  %uf{q}_{half} = bitcast <{t} x i32> %uh{q}_{half} to <{t} x float>
  %xh{q}_{half} = {op} <{t} x i32> %xb{q}, splat (i32 {mask})
  %xf{q}_{half} = bitcast <{t} x i32> %xh{q}_{half} to <{t} x float>
  {out} = call <{t} x float> @llvm.fma.v{t}f32(<{t} x float> %xf{q}_{half}, <{t} x float> %uf{q}_{half}, \
<{t} x float> {acc})""")
        acc = out
    return "\n".join(lines)


def _tile_block(spec: KernelSpec, rows: int) -> str:
    """(layout "rows", rows > 1) ``@tblock<rows>(xm, fresh, u0 .. u15, op)``: `rows` rows of x (at `xm`, k already
    offset) add their products with the transposed tile ``u`` into their :data:`TILE` output columns at `op`
    (running sums there; zeros first when `fresh`)."""
    t, n = TILE, spec.panels * spec.width
    args = ", ".join(f"<{t} x float> %u{i}" for i in range(t))
    head = "\n".join(f"  %op{g} = getelementptr float, ptr %op, i64 {g * n}\n"
                      f"  %old{g} = load <{t} x float>, ptr %op{g}, align 4\n"
                      f"  %a{g}_0 = select i1 %fresh, <{t} x float> zeroinitializer, <{t} x float> %old{g}"
                      for g in range(rows))
    fmas = "\n".join(_x_terms(spec, g, i) for i in range(t) for g in range(rows))
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
    n, pairs = spec.panels * w, spec.act == "bfloat16"
    step = 2 * t if pairs else t  # values of k a tile holds (bfloat16 x: pairs of weights as 32-bit lanes)
    if pairs:  # the 16 weight rows' 32 values each, as they are: transposed as 16 x 16 lanes of two values
        loads = "\n".join(f"  %wo{r} = add i64 %wk, {r * k}\n  %wp{r} = getelementptr i16, ptr %wr, i64 %wo{r}\n"
                           f"  %f{r} = load <{t} x float>, ptr %wp{r}, align 2" for r in range(t))
    else:
        loads = widened_loads(spec, "%wk", [r * k for r in range(t)], t)
    shuffle, cols = _transpose([f"%f{r}" for r in range(t)], "q")
    us = ", ".join(f"<{t} x float> {c}" for c in cols)
    groups = row_groups("tblock", spec.rows, k, n, "kt", f"i1 %fresh, {us}", "%wk", "i16" if pairs else "float")
    blocks = "".join(_tile_block(spec, r) for r in group_sizes(spec.rows))
    # the tile's rows are k apart (t streams): the next block of t weight rows (contiguous) is fetched ahead in
    # order, a tile's worth (t * t values) per step, so the strided reads find it in cache
    per_line = 64 // (4 if spec.dtype == "float32" else 2)
    prefetch = prefetches("%pfb", [j * per_line for j in range(step * t // per_line)], elem)
    prefetch = f"  %pfk = mul i64 %wk, {t}\n  %pfb = add i64 %pfk, {t * k}\n" + prefetch
    body = f"""  %oc = getelementptr float, ptr %out, i64 %row
  br label %kt
kt:
  %wk = phi i64 [0, %sub], [%wk1, %groups_done]
  %fresh = icmp eq i64 %wk, 0
{loads}
{prefetch}
{shuffle}
{groups}  %wk1 = add i64 %wk, {step}
  %kd = icmp eq i64 %wk1, {k}
  br i1 %kd, label %tiles_done, label %kt
tiles_done:
"""
    dot = ("declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)\n"
           if pairs and dot_instruction() else "")
    return f"""declare <{t} x float> @llvm.fma.v{t}f32(<{t} x float>, <{t} x float>, <{t} x float>)
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
{dot}{blocks}
""" + rows_panel(spec, t, body) + walk(spec)


DOT_ROWS = 4  # (layout "rows", more than one row of x) weight rows a dot block reads together
# bytes ahead of its reads a dot block asks for each of its weight rows (llvm_rows.ahead), by stored dtype.  On an
# Intel Xeon (AVX-512; 4 rows of x, 1536 x 576 and 576 x 1536 weights, 300 MB, one core) the dots of float32
# weights read 11.7-11.8 GB/s without and 12.5-12.6 with (4 KB; 2 KB: 11.8-12.4), int8's 5.9-6.1 and 8.5-8.9; the
# 135 M model's four-sequence decode in int4 (groups of 64) 36.2-36.9 tok/s a sequence without, 43.7-45.0 with
DOTS_AHEAD = {**AHEAD, "float32": 4096}


def lane_sums(names: list[str], tag: str, v: int = VEC) -> tuple[str, str]:
    """IR summing the lanes of each of up to `v` float vectors of `v` lanes (a power of two): the name of one
    vector whose lane j is the sum of ``names[j]`` (lanes past them 0).  log2(v) rounds each add pairs of
    vectors, half of each lane run of one vector with the other half (two shuffles and an add a pair), then one
    shuffle puts the sums in order."""
    cur = list(names) + ["zeroinitializer"] * (v - len(names))
    owner = [[j] * v for j in range(v)]  # owner[i][lane]: whose partial sum that lane of vector i holds
    lines = []
    for rnd in range(v.bit_length() - 1):
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
    xs = x_vectors([m * k + e * v for m in range(rows) for e in range(h)])  # %x<h m + e>
    ws = (int4_loads(spec, "%k", [r * k for r in range(d)]) if spec.group  # %f<2 r + e>
          else widened_loads(spec, "%k", [r * k for r in range(d)]))

    def fma(m, r):
        chain, acc_in = [], f"%a{m}_{r}"
        for e in range(h):
            out = f"%n{m}_{r}" if e == h - 1 else f"%t{m}_{r}_{e}"
            chain.append(f"  {out} = call <{v} x float> @llvm.fma.v{v}f32(<{v} x float> %x{h * m + e}, "
                         f"<{v} x float> %f{h * r + e}, <{v} x float> {acc_in})")
            acc_in = out
        return "\n".join(chain)
    fmas = "\n".join(fma(m, r) for m in range(rows) for r in range(d))
    reduce, total = lane_sums([f"%n{m}_{r}" for m in range(rows) for r in range(d)], "rs")
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
{ahead(spec, v * h, d, DOTS_AHEAD)}
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


__all__ = ["DOTS_AHEAD", "DOT_ROWS", "lane_sums", "many_rows_product", "tiles_alias"]
