"""The XLA side of a generated CPU product: its typed FFI handler and the job it shares with helper threads.

``runtime.llvm_ir`` writes a product's ``@panel`` and ``@product``;
:func:`module` adds what XLA calls: ``@handler``, the typed XLA FFI entry
(the struct offsets of ``xla/ffi/api/c_api.h``, 64-bit), which answers XLA's
metadata query, reads the operand and result buffers and runs the product,
alone or shared with the process's helper threads (``@work``: panels
claimed one at a time from a job on the caller's stack; ``runtime.llvm_pool``).  The text uses two
shorthands, expanded here: ``{load:name:TYPE BASE OFFSET}`` and
``{fields:p:OFFSET TYPE VALUE|...}``.
"""

from __future__ import annotations

import os
import re

from ..errors import BackendError

MAX_THREADS = 8  # threads one product is shared among, the caller's included (at most one per panel; as many as
# XLA's CPU pool has, which XLA sizes from the process's CPU affinity)

# Sharing a product with the helper threads of ``runtime.llvm_pool``.  A job on the caller's stack holds {x, panels,
# out, next panel, scales}; ``@work`` claims panels one at a time until none is left, on the caller and on every
# helper that joins (``egraft_pool_share`` returns once every helper that joined has left: every panel is written).
SHARED = """
declare void @egraft_pool_share(ptr, ptr, i64)

define internal void @work(ptr %job) {
entry:
{load:x:ptr %job 0}
{load:w:ptr %job 8}
{load:o:ptr %job 16}
{load:sc:ptr %job 32}
  %nextp = getelementptr i8, ptr %job, i64 24
  br label %claim
claim:
  %p = atomicrmw add ptr %nextp, i64 1 seq_cst
  %left = icmp ult i64 %p, {panels}
  br i1 %left, label %run, label %out
run:
  call void @panel(ptr %x, ptr %w, ptr %o, ptr %sc, i64 %p)
  br label %claim
out:
  ret void
}
"""


def _ffi_version() -> tuple[int, int]:
    """The XLA FFI API version of the header jaxlib ships (what the handler answers XLA's metadata query with)."""
    import jax.ffi

    with open(os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")) as f:
        text = f.read()
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    if not (major and minor):
        raise BackendError("jaxlib's xla/ffi/api/c_api.h has no XLA_FFI_API_MAJOR/MINOR; the generated CPU kernels "
                           "cannot answer XLA's FFI version query (set EGRAFT_LLVM_KERNELS=0)")
    return int(major.group(1)), int(minor.group(1))


# Offsets into XLA's FFI structs (xla/ffi/api/c_api.h, 64-bit): XLA_FFI_CallFrame {struct_size 0,
# extension_start 8, api 16, ctx 24, stage 32, args {struct_size 40, extension_start 48, size 56, types 64,
# args 72}, rets {.. rets 112}, ..}; XLA_FFI_Buffer {.., data 24, ..}; XLA_FFI_Extension_Base {struct_size 0,
# type 8, next 16}; XLA_FFI_Metadata_Extension {base, metadata 24}; XLA_FFI_Metadata {struct_size 0,
# api_version {struct_size 8, extension_start 16, major 24, minor 28}, traits 32}.
HANDLER = """
define ptr @handler(ptr %frame) {
entry:
{load:ext:ptr %frame 8}
  %hasext = icmp ne ptr %ext, null
  br i1 %hasext, label %ext_type, label %stage
ext_type:
{load:ty:i32 %ext 8}
  %ismeta = icmp eq i32 %ty, 1
  br i1 %ismeta, label %metadata, label %stage
metadata:
{load:md:ptr %ext 24}
{fields:md:8 i64 24|16 ptr null|24 i32 {major}|28 i32 {minor}|32 i32 0}
  ret ptr null
stage:
{load:st:i32 %frame 32}
  %execute = icmp eq i32 %st, 3
  br i1 %execute, label %run, label %skip
skip:
  ret ptr null
run:
  %frame_api = getelementptr i8, ptr %frame, i64 16
{load:args:ptr %frame 72}
  %b0 = load ptr, ptr %args
  %b1p = getelementptr ptr, ptr %args, i64 1
  %b1 = load ptr, ptr %b1p
{load:rets:ptr %frame 112}
  %r0 = load ptr, ptr %rets
{load:x:ptr %b0 24}
{load:w:ptr %b1 24}
{load:o:ptr %r0 24}
{scales}
  %api = load ptr, ptr %frame_api
{load:ctx:ptr %frame 24}
  %apisize = load i64, ptr %api
  %hasPool = icmp uge i64 %apisize, 152
  br i1 %hasPool, label %count, label %direct
count:
  %nt = alloca i64
  store i64 1, ptr %nt
  %nta = alloca [4 x i64]
{fields:nta:0 i64 32|8 ptr null|16 ptr %ctx|24 ptr %nt}
{load:ntf:ptr %api 144}
  %nterr = call ptr %ntf(ptr %nta)
  %ntok = icmp eq ptr %nterr, null
  br i1 %ntok, label %threads, label %count_failed
count_failed:
  call void @destroy(ptr %api, ptr %nterr)
  br label %direct
threads:
  %n0 = load i64, ptr %nt
  %n1 = call i64 @llvm.umin.i64(i64 %n0, i64 {max_threads})
  %n = call i64 @llvm.umin.i64(i64 %n1, i64 {panels})
  %par = icmp ugt i64 %n, 1
  br i1 %par, label %shared, label %direct
direct:
  call void @product(ptr %x, ptr %w, ptr %o, ptr %s)
  ret ptr null
shared:
{prepare}  %job = alloca [5 x i64], align 8
{fields:job:0 ptr {xp}|8 ptr %w|16 ptr %o|24 i64 0|32 ptr %s}
  call void @egraft_pool_share(ptr @work, ptr %job, i64 %n)
  ret ptr null
}

declare i64 @llvm.umin.i64(i64, i64)

; XLA_FFI_Error_Destroy (XLA_FFI_Api offset 64) of an error XLA's FFI returned (its thread count query)
define internal void @destroy(ptr %api, ptr %err) {
entry:
  %args = alloca [3 x i64]
{fields:args:0 i64 24|8 ptr null|16 ptr %err}
{load:f:ptr %api 64}
  call void %f(ptr %args)
  ret void
}
"""


def _load(match: re.Match) -> str:
    """``{load:name:TYPE BASE OFFSET}`` in the handler's text: ``%name``, the TYPE value at BASE + OFFSET bytes."""
    name, (ty, base, offset) = match.group(1), match.group(2).split(" ")
    return f"  %{name}.at = getelementptr i8, ptr {base}, i64 {offset}\n  %{name} = load {ty}, ptr %{name}.at"


def _fields(match: re.Match) -> str:
    """``{fields:p:OFFSET TYPE VALUE|...}`` in the handler's text: stores into the struct at ``%p``."""
    name, spec = match.group(1), match.group(2)
    out = []
    for k, field in enumerate(spec.split("|")):
        offset, ty, value = field.split(" ", 2)
        where = f"%{name}" if offset == "0" else f"%{name}.f{k}"
        if offset != "0":
            out.append(f"  {where} = getelementptr i8, ptr %{name}, i64 {offset}")
        out.append(f"  store {ty} {value}, ptr {where}")
    return "\n".join(out)


# the third operand's data (int4 scales), or none
SCALES = """  %b2p = getelementptr ptr, ptr %args, i64 2
  %b2 = load ptr, ptr %b2p
{load:s:ptr %b2 24}"""
NO_SCALES = "  %s = getelementptr i8, ptr null, i64 0"


def module(product: str, panels: int, scales: bool = False, prepared: int = 0) -> str:
    """The whole LLVM module: `product` (which ends with :data:`SHARED`) and the XLA FFI handler of a product
    of `panels` panels (taking a third operand, int4 scales, when `scales`), the shorthands expanded.
    `prepared`: floats `product`'s ``@prepare(x, dst)`` makes of x once a call, which a shared job's panels then
    read in place of x (``@product``, the unshared path, makes them itself)."""
    major, minor = _ffi_version()
    text = product + HANDLER.replace("{major}", str(major)).replace("{minor}", str(minor))
    text = text.replace("{scales}", SCALES if scales else NO_SCALES)
    text = text.replace("{prepare}", f"  %xp = alloca float, i64 {prepared}, align 64\n"
                                     "  call void @prepare(ptr %x, ptr %xp)\n" if prepared else "")
    text = text.replace("{xp}", "%xp" if prepared else "%x")
    text = re.sub(r"\{fields:(\w+):([^}]*)\}", _fields, text)
    text = re.sub(r"\{load:(\w+):([^}]*)\}", _load, text)
    return text.replace("{panels}", str(panels)).replace("{max_threads}", str(MAX_THREADS))


__all__ = ["HANDLER", "MAX_THREADS", "SHARED", "module"]
