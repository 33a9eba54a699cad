"""The generated product's form for short weight rows (layout ``"rows"``, ``k <= SHORT_K``): attention's keys.

A decode step's attention scores are ``q [rows, head_dim] @ K^T`` where ``K`` is a KV cache's first slots,
``[slots, head_dim]``: the rows layout with ``k`` the head dimension (64 or 128).  The forms for weights
(``runtime.llvm_rows``, ``runtime.llvm_tiles``) are built for long rows: a sum across lanes per weight row, or
16 x 16 tiles transposed in registers, cost more than the short dots themselves (measured on the Zen 1 host, 3
rows of x against 3 x 256 slots of 64 values: 72-111 us a call where reading the same bytes took 25-38).

Here :data:`LANES` weight rows are dotted at a time with one row of x, each in :data:`LANES`-value vectors
(one accumulator per weight row, all of k), and the eight accumulators are summed across lanes together (three
rounds of pairwise shuffles and adds, ``runtime.llvm_tiles.lane_sums``, give one vector whose lane i is weight
row i's dot product), stored as eight consecutive output columns.  The rows of x run over the same eight
weight rows, which stay in cache.  The sums are float32 dot products over ``k``, in another order than the other forms'.
"""

from __future__ import annotations

from .llvm_rows import prefetches, rows_panel, widened_loads
from .llvm_spec import FLOATS, WIDEN, KernelSpec, walk
from .llvm_tiles import lane_sums

SHORT_K = 256  # longest weight row (values) this form takes: a block's 8 rows x k stay in L1 with room to spare
PREFETCH = 2  # blocks of weight rows ahead that a block fetches into cache (Zen 1 host, 3 x 256 slots of 64 values
#              out of cache: 42 us a call against 52-57 with none; 3 and 6 blocks were no better)
LANES = 8  # weight rows per block, and values of k per vector (one AVX2 register of float32)


def takes(spec: KernelSpec) -> bool:
    """Whether `spec` is a product this form computes: float weights read as short stored rows, float32 x."""
    return (spec.layout == "rows" and spec.dtype in FLOATS and spec.act == "float32" and not spec.group
            and spec.k <= SHORT_K and spec.k % LANES == 0 and spec.weight_rows % LANES == 0)


def short_product(spec: KernelSpec) -> str:
    """``@panel`` and ``@product`` for short stored rows (:func:`takes`)."""
    if not takes(spec):
        raise ValueError(f"{spec}: the short-rows product takes float weights read as stored rows, k <= {SHORT_K}")
    v, k, n = LANES, spec.k, spec.panels * spec.width
    elem = WIDEN[spec.dtype][0]
    acc = "\n".join(f"  %a{i} = phi <{v} x float> [zeroinitializer, %rows], [%n{i}, %kl]" for i in range(v))
    loads = widened_loads(spec, "%kk", [i * k for i in range(v)], v)  # %f<i>: weight row i at k values %kk..
    fmas = "\n".join(f"  %n{i} = call <{v} x float> @llvm.fma.v{v}f32(<{v} x float> %xv, <{v} x float> %f{i}, "
                     f"<{v} x float> %a{i})" for i in range(v))
    prefetch = prefetches("%kk", [PREFETCH * v * k + i * k for i in range(v)], elem)
    sums, total = lane_sums([f"%n{i}" for i in range(v)], "ls", v)  # lane i: weight row i's dot product
    body = f"""  br label %rows
rows:
  %m = phi i64 [0, %sub], [%m1, %red]
  %xro = mul i64 %m, {k}
  %xr = getelementptr float, ptr %x, i64 %xro
  br label %kl
kl:
  %kk = phi i64 [0, %rows], [%kk1, %kl]
{acc}
  %xp = getelementptr float, ptr %xr, i64 %kk
  %xv = load <{v} x float>, ptr %xp, align 4
{loads}
{fmas}
{prefetch}
  %kk1 = add i64 %kk, {v}
  %kd = icmp eq i64 %kk1, {k}
  br i1 %kd, label %red, label %kl
red:
{sums}
  %oro = mul i64 %m, {n}
  %oo = add i64 %oro, %row
  %op = getelementptr float, ptr %out, i64 %oo
  store <{v} x float> {total}, ptr %op, align 4
  %m1 = add i64 %m, 1
  %md = icmp eq i64 %m1, {spec.rows}
  br i1 %md, label %rows_done, label %rows
rows_done:
"""
    return f"""declare <{v} x float> @llvm.fma.v{v}f32(<{v} x float>, <{v} x float>, <{v} x float>)
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
""" + rows_panel(spec, v, body) + walk(spec)


__all__ = ["LANES", "SHORT_K", "short_product", "takes"]
