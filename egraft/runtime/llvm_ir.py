"""The generated CPU product's code: LLVM IR text for one :class:`KernelSpec` (``runtime.llvm_spec``), with
its XLA FFI handler.

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
  ``width`` consecutive weight rows (the last panel may hold fewer); its
  code (a dot per weight row for one row of x; transposed tiles or blocks
  of dots for more) is ``runtime.llvm_rows``' (int4: ``runtime.llvm_int4``') and ``runtime.llvm_tiles``'.
* ``"kn"``: a ``[k, panels * width]`` matrix read in place, its rows ``ldw``
  values apart (a KV cache's values, ``[slots, head_dim]``): the panel code
  of ``"panels"``, a panel being ``width`` columns of every row.

A batch of products (``spec.batch`` > 1, each W ``bstride`` values after the
last, the first ``offset`` values in) runs each form's panel code on every
panel of every product: ``@panel`` then finds the product's x, W and output
and calls the form's own (``@form_panel``).

XLA calls the product through the handler ``runtime.llvm_ffi`` adds.
"""

from __future__ import annotations

from .llvm_ffi import MAX_THREADS, module
from .llvm_act8 import act8_product
from .llvm_bf16 import bf16_product
from .llvm_int4 import int4_row_product, prepared
from .llvm_rows import rows_product
from .llvm_short import short_product, takes as short_takes
from .llvm_tiles import many_rows_product
from .llvm_spec import LAYOUTS, ROW_GROUP, TILE, VEC, WIDEN, WIDTHS, KernelSpec, group_sizes, row_groups, walk


def _row_block(spec: KernelSpec, rows: int) -> str:
    """``@block<rows>(x, panel, out)``: `rows` rows of x against one panel, into their `width` output columns."""
    w, k = spec.width, spec.k
    step = spec.ldw or w  # values between the panel's rows along k
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
  %wo = mul i64 %k, {step}
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


def _form(spec: KernelSpec):
    """The function writing `spec`'s product code (the one place a spec's form is chosen)."""
    if spec.act == "int8":
        return act8_product
    if spec.act == "bfloat16" and spec.rows == 1:
        return bf16_product  # (more rows: the tiles, in pairs)
    if spec.layout == "rows" and short_takes(spec):
        return short_product
    if spec.layout == "rows" and spec.rows == 1:
        return int4_row_product if spec.group else rows_product
    if spec.layout == "rows":
        return many_rows_product
    return _panels_product


def _panels_product(spec: KernelSpec) -> str:
    """``@panel(x, panels, out, p)``: panel `p`'s row groups against it while it is in cache; ``@product``: every
    panel in turn; ``@work(job)``: panels claimed one at a time from a shared job (``runtime.llvm_ffi.SHARED``)."""
    w, k, elem = spec.width, spec.k, WIDEN[spec.dtype][0]
    groups = row_groups("block", spec.rows, k, spec.panels * w, "entry", "ptr %pp")
    blocks = "".join(_row_block(spec, r) for r in group_sizes(spec.rows))
    return f"""declare <{w} x float> @llvm.fma.v{w}f32(<{w} x float>, <{w} x float>, <{w} x float>)
{blocks}

define internal void @panel(ptr noalias %x, ptr noalias %panels, ptr noalias %out, ptr noalias %s, i64 %p) {{
entry:
  %po = mul i64 %p, {w if spec.ldw else k * w}
  %pp = getelementptr {elem}, ptr %panels, i64 %po
  %oo = mul i64 %p, {w}
  %oc = getelementptr float, ptr %out, i64 %oo
{groups}  ret void
}}
""" + walk(spec)


def _batched(spec: KernelSpec, text: str) -> str:
    """`text` (a form's code) for a batch of products, or W at an offset: the form's ``@panel`` renamed
    ``@form_panel``, and a ``@panel`` over every panel of every product that finds the product's x, W and output."""
    if spec.batch == 1 and not spec.offset:
        return text
    head = "define internal void @panel("
    if text.count(head) != 1:  # pragma: no cover - every form defines its panel code once
        raise AssertionError(f"the product's form for {spec} does not define @panel once")
    n, elem = spec.panels * spec.width, WIDEN[spec.dtype][0]
    return text.replace(head, "define internal void @form_panel(") + f"""
define internal void @panel(ptr noalias %x, ptr noalias %w, ptr noalias %out, ptr noalias %s, i64 %p) {{
entry:
  %b = udiv i64 %p, {spec.panels}
  %j = urem i64 %p, {spec.panels}
  %xo = mul i64 %b, {spec.rows * spec.k}
  %xb = getelementptr float, ptr %x, i64 %xo
  %wo0 = mul i64 %b, {spec.bstride}
  %wo = add i64 %wo0, {spec.offset}
  %wb = getelementptr {elem}, ptr %w, i64 %wo
  %oo = mul i64 %b, {spec.rows * n}
  %ob = getelementptr float, ptr %out, i64 %oo
  call void @form_panel(ptr %xb, ptr %wb, ptr %ob, ptr %s, i64 %j)
  ret void
}}
"""


def module_ir(spec: KernelSpec) -> str:
    """The whole LLVM module for `spec`: the product and its XLA FFI handler (``runtime.llvm_ffi``)."""
    form = _form(spec)
    # (int4's one-row product makes what it reads of x once a call: llvm_int4.prepared)
    made = prepared(spec) if form is int4_row_product else 0
    return module(_batched(spec, form(spec)), spec.jobs, scales=bool(spec.group), prepared=made)


__all__ = ["KernelSpec", "LAYOUTS", "MAX_THREADS", "ROW_GROUP", "TILE", "VEC", "WIDEN", "WIDTHS", "module_ir"]
