"""What a generated CPU product is (:class:`KernelSpec`) and the LLVM IR pieces its forms share.

The forms' code: ``runtime.llvm_ir`` (column panels, and the whole module
of one spec), ``runtime.llvm_rows`` (a weight read where it is stored, one row of x; int4: ``runtime.llvm_int4``) and
``runtime.llvm_tiles`` (the same, more rows).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from ..errors import BackendError
from .llvm_ffi import SHARED

ROW_GROUP = 4  # rows a panel pass accumulates at once (4 rows x 64 columns: 16 AVX-512 registers)

# stored dtype -> (the LLVM element type loaded, the widening of a loaded vector %v to <w x float> named %f)
WIDEN = {
    "float32": ("i32", "  %f = bitcast <{w} x i32> %v to <{w} x float>"),
    "bfloat16": ("i16", "  %z = zext <{w} x i16> %v to <{w} x i32>\n"
                        "  %s = shl <{w} x i32> %z, splat (i32 16)\n"
                        "  %f = bitcast <{w} x i32> %s to <{w} x float>"),
    "float16": ("half", "  %f = fpext <{w} x half> %v to <{w} x float>"),
    "int8": ("i8", "  %f = sitofp <{w} x i8> %v to <{w} x float>"),  # a quantised weight's values (exact)
    # packed int4 (two values a byte, blocks of 32, with a float32 scale per group of k): layout "rows" only, its
    # own loads (runtime.llvm_int4.int4_loads), no template
    "int4": ("i8", None),
}
FLOATS = ("float32", "bfloat16", "float16")  # the float dtypes of W (a batch of products, or one at an offset)
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "int4": 0.5}  # bytes per stored value
GROUPS = (32, 64, 128)  # (int4) values of k that share one scale
WIDTHS = (16, 32, 64, 128)
LAYOUTS = ("panels", "rows", "kn")
VEC = 16  # (layout "rows") k values per vector: one AVX-512 register of float32; k must be a multiple
ACTS = ("float32", "int8", "bfloat16")  # what x may be (int8: a quantised activation, the products summed in
#                                        int32; bfloat16: a bfloat16 model's input to a bfloat16 weight, not widened)
ACT8_STEP = 32  # (int8 x) k values per vector step
ACT16_STEP = 32  # (bfloat16 x) k values per vector step
# (bfloat16 x) the most rows of x a product reads the input as bfloat16 at (in tiles of weight pairs, more than
# one): measured on an Intel Xeon with AVX512-BF16, 1.1-2.5 times the float32-x tiles at 2-8 rows, 0.77-0.91 at 16
ACT16_ROWS = 8
# (layout "rows") the forms a product of more than one row of x may be asked for: "" (tiles, or dots where
# int4 or tiles_alias asks for them) and "dots" (runtime.llvm_tiles), for 2 to DOTS_ROWS rows of float32 x
FORMS = ("", "dots")
DOTS_ROWS = 8
TILE = 16  # (layout "rows", more than one row of x) weight rows x k values transposed in registers at a time


@dataclass(frozen=True)
class KernelSpec:
    """One generated product: ``[rows, k] float32 @ W -> [rows, panels * width]``, W of `dtype` held as panels
    ``[panels, k, width]`` (`layout` ``"panels"``), as stored rows ``[panels * width, k]`` (``"rows"``) or as a
    ``[k, panels * width]`` matrix whose rows are `ldw` values apart (``"kn"``).

    With `batch` > 1 it is `batch` such products at once: x ``[batch, rows, k]`` and the output ``[batch, rows,
    panels * width]`` contiguous, product b's W starting `bstride` values after product b - 1's; W's first value
    is `offset` values into the operand.  So W can be a view read where it lies, as a KV cache's first slots
    are (``backends.jax.view_dots``)."""

    dtype: str
    rows: int
    k: int
    panels: int
    width: int
    layout: str = "panels"
    n: int = 0  # (layout "rows") the weight's rows, when the last panel holds fewer than width (0: all full)
    group: int = 0  # (int4) values of k per scale: the product takes the scales [weight rows, k / group] too
    act: str = "float32"  # x's dtype: "int8" (quantised activations, ``runtime.llvm_act8``) sums in int32
    batch: int = 1  # products at once (x, W and the output each advance per product)
    bstride: int = 0  # values of the W operand between one product's W and the next's
    offset: int = 0  # values of the W operand before the first product's W
    ldw: int = 0  # (layout "kn") values between W's rows along k
    form: str = ""  # (layout "rows", 2 to DOTS_ROWS rows of float32 x) "dots": blocks of dots, not tiles (FORMS)

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
        if (self.dtype == "int4") != bool(self.group) or (self.group and (
                self.layout != "rows" or self.group not in GROUPS or self.k % self.group)):
            raise BackendError(f"a generated product of int4 weights reads them as stored rows with a group size of "
                               f"{GROUPS} dividing k (and only int4 has groups): {self}")
        if self.act not in ACTS or (self.act != "float32" and (
                self.dtype != self.act or self.layout != "rows" or self.batch != 1
                or self.k % (ACT8_STEP if self.act == "int8" else ACT16_STEP)
                or self.rows != 1 and (self.act == "int8" or tiles_alias(self)))):
            raise BackendError(f"a generated product takes x of dtype {ACTS}; int8 or bfloat16 x only times weights "
                               f"of its own dtype read as stored rows, k a multiple of {ACT8_STEP}, one row of x "
                               f"(bfloat16: or more, where a weight row is not a multiple of 4 KB): {self}")
        if (self.layout == "kn") != bool(self.ldw) or self.ldw and self.ldw < self.panels * self.width:
            raise BackendError(f"a generated product reading a [k, n] matrix (layout 'kn', only it) needs the "
                               f"distance of its rows, ldw >= its columns: {self}")
        if self.form not in FORMS or self.form and (self.layout != "rows" or not 1 < self.rows <= DOTS_ROWS
                                                     or self.act != "float32"):
            raise BackendError(f"a generated product's form is one of {FORMS}; 'dots' reads a weight as stored rows "
                               f"for 2 to {DOTS_ROWS} rows of float32 x: {self}")
        viewed = self.batch != 1 or self.bstride or self.offset
        if self.batch < 1 or min(self.bstride, self.offset) < 0 or viewed and (
                self.dtype not in FLOATS or self.act != "float32"):
            raise BackendError(f"a batch of generated products, or one reading W at an offset, takes float weights "
                               f"({', '.join(FLOATS)}) and float32 x, batch >= 1, offsets >= 0: {self}")

    @property
    def weight_rows(self) -> int:
        """(layout "rows") the weight's rows, N (the output has ``panels * width`` columns, the last N..)."""
        return self.n or self.panels * self.width

    @property
    def jobs(self) -> int:
        """The units of work the product is shared out in: every panel of every product of the batch."""
        return self.batch * self.panels

    @property
    def name(self) -> str:
        tail = "" if self.layout == "panels" else f"_{self.layout}" + (f"_{self.n}" if self.n else "")
        tail += f"_g{self.group}" if self.group else ""
        tail += {"int8": "_a8", "bfloat16": "_a16"}.get(self.act, "")
        tail += f"_ld{self.ldw}" if self.ldw else ""
        tail += f"_b{self.batch}x{self.bstride}" if self.batch != 1 else ""
        tail += f"_o{self.offset}" if self.offset else ""
        tail += f"_{self.form}" if self.form else ""
        return f"egraft_stream_{self.dtype}_{self.rows}_{self.k}_{self.panels}_{self.width}{tail}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "KernelSpec":
        return cls(str(d["dtype"]), int(d["rows"]), int(d["k"]), int(d["panels"]), int(d["width"]),
                   str(d.get("layout", "panels")), int(d.get("n", 0)), int(d.get("group", 0)),
                   str(d.get("act", "float32")), int(d.get("batch", 1)), int(d.get("bstride", 0)),
                   int(d.get("offset", 0)), int(d.get("ldw", 0)), str(d.get("form", "")))


def tiles_alias(spec: KernelSpec) -> bool:
    """(layout "rows", more than one row of x) A tile's :data:`TILE` weight rows are ``k`` apart: when that stride
    is a multiple of 4 KB they all fall in one set of an L1 data cache (64 sets of 64 bytes on x86) and evict one
    another, so ``runtime.llvm_tiles`` takes its dots there.  Measured (bench/rows_layout_kernels.py, AVX-512
    host): k = 2048 and 8192 ran the tiles at 42-98 GF/s against the dots' 91-183; k = 896 and 4864 at 120-202
    against 86-195."""
    return (spec.k * ITEMSIZE[spec.dtype]) % 4096 == 0


def group_sizes(rows: int) -> list[int]:
    """The row-group sizes a product of `rows` rows calls its block with: :data:`ROW_GROUP`, and what is left."""
    full, rest = divmod(rows, ROW_GROUP)
    return sorted({ROW_GROUP if full else 0, rest} - {0})


def row_groups(block: str, rows: int, k: int, n: int, start: str, args: str, k_at: str = "0",
               x_elem: str = "float") -> str:
    """IR calling ``@<block><G>(x rows, args, out rows)`` on each full group of :data:`ROW_GROUP` rows of x (at
    ``%x``, `k_at` values along k, values of type `x_elem`) and of their output rows (at ``%oc``, `n` columns
    apart), then once on the rest; entered from label `start`, it ends in the block ``groups_done`` (the
    product's code goes on there)."""
    full, rest = divmod(rows, ROW_GROUP)
    text = "  br label %group\n" if full else "  br label %groups_done\n"
    if full:
        text += f"""group:
  %g = phi i64 [0, %{start}], [%g1, %group]
  %gxr = mul i64 %g, {ROW_GROUP * k}
  %gxo = add i64 %gxr, {k_at}
  %gx = getelementptr {x_elem}, ptr %x, i64 %gxo
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
                 f"  %rx = getelementptr {x_elem}, ptr %x, i64 %rxo\n"
                 f"  %ro = getelementptr float, ptr %oc, i64 {full * ROW_GROUP * n}\n"
                 f"  call void @{block}{rest}(ptr %rx, {args}, ptr %ro)\n")
    return text


@functools.lru_cache(maxsize=None)
def host_has(feature: str) -> bool:
    """Whether this host's CPU has `feature` (LLVM's name for it: ``"avx2"``, ``"avx512f"``, ``"avx512bf16"``),
    which some forms of the generated products are written for; False without llvmlite."""
    try:
        import llvmlite.binding as llvm
    except ImportError:
        return False
    return bool(llvm.get_host_cpu_features().get(feature))


def walk(spec: KernelSpec, prepared: int = 0) -> str:
    """``@product(x, panels, out, scales)``: every panel (of every product of a batch) in turn (whatever its
    layout; `scales`: int4's, null otherwise), then the shared job's code (``runtime.llvm_ffi.SHARED``).
    `prepared`: the form's ``@prepare(x, dst)`` makes that many floats of x once (on this stack), and the panels
    read them in place of x."""
    made, xp = ((f"  %xp = alloca float, i64 {prepared}, align 64\n  call void @prepare(ptr %x, ptr %xp)\n", "%xp")
                if prepared else ("", "%x"))
    return f"""
define void @product(ptr noalias %x, ptr noalias %panels, ptr noalias %out, ptr noalias %s) {{
entry:
{made}  br label %loop
loop:
  %p = phi i64 [0, %entry], [%p1, %loop]
  call void @panel(ptr {xp}, ptr %panels, ptr %out, ptr %s, i64 %p)
  %p1 = add i64 %p, 1
  %pd = icmp eq i64 %p1, {spec.jobs}
  br i1 %pd, label %done, label %loop
done:
  ret void
}}
""" + SHARED


__all__ = ["ACT16_ROWS", "ACT16_STEP", "ACT8_STEP", "ACTS", "DOTS_ROWS", "FLOATS", "FORMS", "GROUPS", "ITEMSIZE",
           "KernelSpec", "LAYOUTS", "ROW_GROUP", "TILE", "VEC", "WIDEN", "WIDTHS", "group_sizes", "host_has",
           "row_groups", "tiles_alias", "walk"]
