"""The generated product of a quantised activation and int8 weights: ``x [1, k] int8 @ W [N, k] int8`` summed
in int32 (exact), each sum converted to float32 once (``KernelSpec(act="int8")``).

The lossy ``quantize="w8a8"`` mode (``frontend.quantize``) rounds each row of
a layer's input to int8 with one scale per row; the product of those values
with the int8 weight is an integer dot product.  Here it is read where the
weight is stored (layout ``"rows"``, one row of x: a decode step), two weight
rows at a time so each load of x serves both, :data:`ACT8_STEP` values of k a
vector step: both operands sign-extended, multiplied in 32-bit lanes and the
products of neighbouring lanes added (the pattern x86 compiles to one
``vpmaddwd``: sixteen products and eight sums an instruction on AVX2, against
the float form's eight products and a conversion), the pair sums added into
int32 accumulators, the weight's bytes :data:`PREFETCH` ahead asked for
(measured on one core of an AVX2-only EPYC, a 1536 x 576 weight read from
memory: 4.3-4.5 G weights/s without, 5.7-7.3 with; the float-x int8
product of ``runtime.llvm_rows`` 4.9-5.6, and in cache 10.5 against 5.5).
|x|, |w| <= 127, so a sum of up to 133,000 products
cannot overflow, and it is the float64 reference's sum exactly; the one
rounding is the conversion to float32 at the end.
"""

from __future__ import annotations

from .llvm_rows import prefetches, rows_panel, sum_chain
from .llvm_spec import ACT8_STEP, KernelSpec, walk

ROWS_AT_ONCE = 2  # weight rows a step reads (each load of x serves them all)
PREFETCH = 2048  # bytes ahead of each weight row's reads that a step asks the cache for, every line the step
#                  reads (a prefetch past the weight's end is a hint, never a fault).  One line a step, where a step
#                  reads up to 96 bytes a row, left a third to the hardware: asking for each measured w8a8 decode
#                  1.08x on one core of the Xeon (7 pairs of processes, 6 faster), 1.06x on two (not concluded)


def _unroll(k: int) -> int:
    """Vector steps of k per loop iteration (independent accumulators per weight row)."""
    return next(u for u in (3, 2, 1) if (k // ACT8_STEP) % u == 0)


def act8_product(spec: KernelSpec) -> str:
    """``@panel`` and ``@product`` of an int8-x, int8-weight product (the module docstring)."""
    k, s, u, r = spec.k, ACT8_STEP, _unroll(spec.k), ROWS_AT_ONCE
    h = s // 2
    even = ", ".join(f"i32 {2 * i}" for i in range(h))
    odd = ", ".join(f"i32 {2 * i + 1}" for i in range(h))
    phis, steps = [], []
    for j in range(u):
        steps.append(f"  %xo{j} = add i64 %k, {j * s}\n"
                     f"  %xp{j} = getelementptr i8, ptr %x, i64 %xo{j}\n"
                     f"  %xv{j} = load <{s} x i8>, ptr %xp{j}, align 1\n"
                     f"  %xe{j} = sext <{s} x i8> %xv{j} to <{s} x i32>")
        for i in range(r):
            t = f"{i}_{j}"
            phis.append(f"  %a{t} = phi <{h} x i32> [zeroinitializer, %sub], [%n{t}, %dot]")
            steps.append(f"""  %wo{t} = add i64 %xo{j}, {i * k}
  %wp{t} = getelementptr i8, ptr %wr, i64 %wo{t}
  %wv{t} = load <{s} x i8>, ptr %wp{t}, align 1
  %we{t} = sext <{s} x i8> %wv{t} to <{s} x i32>
  %p{t} = mul nsw <{s} x i32> %xe{j}, %we{t}
  %pe{t} = shufflevector <{s} x i32> %p{t}, <{s} x i32> poison, <{h} x i32> <{even}>
  %po{t} = shufflevector <{s} x i32> %p{t}, <{s} x i32> poison, <{h} x i32> <{odd}>
  %ps{t} = add nsw <{h} x i32> %pe{t}, %po{t}
  %n{t} = add nsw <{h} x i32> %a{t}, %ps{t}""")
    ends = []
    for i in range(r):
        lines, last = sum_chain([f"%n{i}_{j}" for j in range(u)], f"c{i}_", f"<{h} x i32>", "add nsw")
        ends += [lines] if lines else []
        ends.append(f"""  %t{i} = call i32 @llvm.vector.reduce.add.v{h}i32(<{h} x i32> {last})
  %f{i} = sitofp i32 %t{i} to float
  %or{i} = add i64 %row, {i}
  %op{i} = getelementptr float, ptr %out, i64 %or{i}
  store float %f{i}, ptr %op{i}""")
    nl = "\n"
    lines = -(-s * u // 64)  # 64-byte lines of a weight row a step reads: each is asked for ahead
    prefetch = prefetches("%k", [PREFETCH + i * k + 64 * c for i in range(r) for c in range(lines)])
    body = f"""  br label %dot
dot:
  %k = phi i64 [0, %sub], [%k1, %dot]
{nl.join(phis)}
{nl.join(steps)}
{prefetch}
  %k1 = add i64 %k, {s * u}
  %kd = icmp eq i64 %k1, {k}
  br i1 %kd, label %dot_done, label %dot
dot_done:
{nl.join(ends)}
"""
    return (f"declare void @llvm.prefetch.p0(ptr, i32, i32, i32)\n"
            f"declare i32 @llvm.vector.reduce.add.v{h}i32(<{h} x i32>)\n" + rows_panel(spec, r, body) + walk(spec))


__all__ = ["PREFETCH", "ROWS_AT_ONCE", "act8_product"]
