"""The generated product of a bfloat16 activation and bfloat16 weights: ``x [1, k] bfloat16 @ W [N, k]
bfloat16``, summed in float32 (``KernelSpec(act="bfloat16")``).

A bfloat16 model's linear layer multiplies a bfloat16 input by a bfloat16
weight and sums in float32; egraft's IR says so as a cast of each to float32
and a float32 product, and the float32 form (``runtime.llvm_rows``) widens
every weight value in registers before its multiply-add: a zero extension
and a shift per 16 values, three instructions per 32 bytes read, where a
float32 weight needs one per 64.  Given the input as it is (bfloat16, not
widened) the product can use the CPU's own bfloat16 dot product
(AVX512-BF16's ``vdpbf16ps``: 32 pairs of bfloat16 values multiplied, each
product exact in float32, and added in pairs into 16 float32 sums, one
rounding an addition, subnormals flushed to zero): one instruction per 64
bytes of weight, the input's 32 values loaded beside it.  The same float32
sums as the widened form's, up to their order and to subnormals.

On a CPU without those instructions the same spec compiles to the widened
form (each 32 values of x and W widened in halves and multiplied-added in
float32), so a saved program runs anywhere; which one a host gets is
:func:`dot_instruction` (``EGRAFT_LLVM_BF16_DOT=0`` forces the widened one).

Where it is read: layout ``"rows"`` (``W`` as ``nn.Linear`` stores it), one
row of x (a decode step), :data:`ACT16_STEP` values of k a vector step, up
to four independent accumulators; each weight row is one sequential stream.
Two to :data:`~egraft.runtime.llvm_spec.ACT16_ROWS` rows (a batch's decode
step, a short chunk) take ``runtime.llvm_tiles``' tiles with each lane holding
a pair of weights (the same instruction, or the pair widened in turn).
"""

from __future__ import annotations


from ..env import flag
from .llvm_rows import row_dot, rows_panel, widened_loads
from .llvm_spec import ACT16_STEP, KernelSpec, host_has, walk


def dot_instruction() -> bool:
    """Whether this host's bfloat16-input products use the CPU's bfloat16 dot instruction (else widened)."""
    return flag("EGRAFT_LLVM_BF16_DOT", True) and host_has("avx512bf16")


def _unroll(k: int) -> int:
    return next(u for u in (4, 2, 1) if k % (ACT16_STEP * u) == 0)


def _steps(spec: KernelSpec, u: int, dot: bool) -> tuple[str, str]:
    """IR of `u` vector steps: step j adds x's and the weight row's :data:`ACT16_STEP` values at ``%k + j * step``
    into the accumulator ``%a<j>`` as ``%n<j>``; and the accumulators' type."""
    s, h, offsets = ACT16_STEP, ACT16_STEP // 2, [j * ACT16_STEP for j in range(u)]
    if not dot:  # both operands widened exactly (a bfloat16's 16 bits are a float32's high half)
        loads = (widened_loads(spec, "%k", offsets, s, base="%x", tag="x") + "\n"
                 + widened_loads(spec, "%k", offsets, s, tag="w"))
        return loads + "\n" + "\n".join(
            f"  %n{j} = call <{s} x float> @llvm.fma.v{s}f32(<{s} x float> %xf{j}, <{s} x float> %wf{j}, "
            f"<{s} x float> %a{j})" for j in range(u)), f"<{s} x float>"
    return "\n".join(f"""  %o{j} = add i64 %k, {off}
  %xp{j} = getelementptr i16, ptr %x, i64 %o{j}
  %wp{j} = getelementptr i16, ptr %wr, i64 %o{j}
  %xv{j} = load <{s} x bfloat>, ptr %xp{j}, align 2
  %wv{j} = load <{s} x bfloat>, ptr %wp{j}, align 2
  %n{j} = call <{h} x float> @llvm.x86.avx512bf16.dpbf16ps.512(<{h} x float> %a{j}, <{s} x bfloat> %xv{j}, \
<{s} x bfloat> %wv{j})""" for j, off in enumerate(offsets)), f"<{h} x float>"


def bf16_product(spec: KernelSpec) -> str:
    """``@panel`` and ``@product`` of a bfloat16-x, bfloat16-weight product, one row of x (the module docstring)."""
    u, dot = _unroll(spec.k), dot_instruction()
    steps, ty = _steps(spec, u, dot)
    body = row_dot(steps, u, ty, ACT16_STEP * u, spec.k)
    lanes = ty[1:ty.index(" ")]
    declare = ("declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)"
               if dot else f"declare <{ACT16_STEP} x float> @llvm.fma.v{ACT16_STEP}f32(<{ACT16_STEP} x float>, "
                           f"<{ACT16_STEP} x float>, <{ACT16_STEP} x float>)")
    return (f"{declare}\ndeclare float @llvm.vector.reduce.fadd.v{lanes}f32(float, {ty})\n"
            + rows_panel(spec, 1, body) + walk(spec))


__all__ = ["bf16_product", "dot_instruction"]
