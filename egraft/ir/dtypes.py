"""The IR's dtypes: one table row per dtype, read by everything that asks about one.

A row holds a dtype's names in numpy, torch, Triton and safetensors, the
dtype its arithmetic runs in, its epsilon and model-level tolerance, its
promotion rank and whether weight-only values of it may be folded at build
time.  Adding a dtype is adding its row (and a backend rule where a backend
cannot run it).

bfloat16 has no numpy dtype of its own; ``ml_dtypes`` (a JAX dependency)
supplies one, and torch and numpy exchange it through an int16 view
(``bits``).  Half types are *stored* in their own dtype but *compute* in
float32 and round after each op, as GPU kernels and the reference
interpreter do.  The IR never imports torch: torch names are strings,
resolved by :mod:`egraft.ir.tensors` where torch is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..errors import IRError


@dataclass(frozen=True)
class DType:
    name: str  # the IR's name (and the key of ROWS)
    kind: str  # float | int | bool
    numpy: np.dtype  # how numpy (and JAX) store it
    torch: str  # torch.<torch>
    triton: str  # tl.<triton>, the element type in a kernel
    triton_ptr: str  # its pointer type in a kernel signature
    safetensors: str  # the dtype code in a safetensors header
    compute: str  # the dtype its arithmetic and accumulations run in (half types: float32)
    eps: float  # machine epsilon (0: compared exactly)
    tolerance: float | None  # max |a - b| / max |b| where no graph is at hand (model-level checks); None: exact
    rank: int  # promotion: the higher rank wins; two dtypes of one rank meet in their compute dtype
    fold: bool = True  # weight-only values of this dtype (or computed from it) may be folded at build time
    bits: str | None = None  # the int dtype of its width that torch <-> numpy reinterpret it through (no numpy twin)

    @property
    def half(self) -> bool:
        """Stored narrower than it computes (float16, bfloat16)."""
        return self.compute != self.name


def _f(name, npd, triton, ptr, st, compute, eps, tol, rank, **kw):
    return DType(name, "float", np.dtype(npd), name, triton, ptr, st, compute, eps, tol, rank, **kw)


def _i(name, npd, triton, ptr, st, rank):
    return DType(name, "bool" if name == "bool" else "int", np.dtype(npd), name, triton, ptr, st, name, 0.0, None, rank)


ROWS: dict[str, DType] = {r.name: r for r in (
    _f("float32", np.float32, "float32", "*fp32", "F32", "float32", 2.0**-23, 1e-4, 5),
    _f("float16", np.float16, "float16", "*fp16", "F16", "float32", 2.0**-10, 1e-2, 4),
    _f("bfloat16", ml_dtypes.bfloat16, "bfloat16", "*bf16", "BF16", "float32", 2.0**-7, 5e-2, 4, bits="int16"),
    _f("float64", np.float64, "float64", "*fp64", "F64", "float64", 2.0**-52, 1e-9, 6),
    _i("int8", np.int8, "int8", "*i8", "I8", 1),  # quantised weights' values (egraft.quantize)
    _i("int32", np.int32, "int32", "*i32", "I32", 2),
    _i("int64", np.int64, "int64", "*i64", "I64", 3),
    _i("bool", np.bool_, "int1", "*i1", "BOOL", 0),
)}

DTYPES = tuple(ROWS)
FLOAT_DTYPES = tuple(d for d, r in ROWS.items() if r.kind == "float")
INT_DTYPES = tuple(d for d, r in ROWS.items() if r.kind == "int")
HALF_DTYPES = tuple(d for d, r in ROWS.items() if r.half)
# the norm-relative error allowed after a value is rounded to int8 (a quantiser: lossy quantize="w8a8"), where two
# float orders may round a near-half to different integers (egraft.measure.tolerances explains and applies it)
LOSSY_BOUND = 2.0 ** -4


def check(dtype: str, op: str | None = None) -> str:
    """`dtype` if egraft knows it; IRError otherwise (naming `op`, the op that asked, when given)."""
    if dtype not in ROWS:
        where = f"{op}: " if op else ""
        raise IRError(f"{where}unknown dtype {dtype!r}; egraft supports {', '.join(DTYPES)}")
    return dtype


def row(dtype: str) -> DType:
    """The table row of `dtype` (IRError naming the known dtypes when there is none)."""
    return ROWS[check(dtype)]


def is_float(dtype: str) -> bool:
    return dtype in ROWS and ROWS[dtype].kind == "float"


def is_int(dtype: str) -> bool:
    return dtype in ROWS and ROWS[dtype].kind == "int"


def is_half(dtype: str) -> bool:
    """Stored narrower than it computes: arithmetic on it runs in its row's ``compute`` dtype."""
    return dtype in ROWS and ROWS[dtype].half


def compute_name(dtype: str) -> str:
    """The dtype arithmetic on `dtype` runs in (float32 for half types; unknown names pass through)."""
    return ROWS[dtype].compute if dtype in ROWS else dtype


def to_numpy(dtype: str) -> np.dtype:
    return row(dtype).numpy


_FROM_NUMPY = {r.numpy: d for d, r in ROWS.items()}
_FROM_TORCH = {r.torch: d for d, r in ROWS.items()}


def from_numpy(dt) -> str:
    dt = np.dtype(dt)
    if dt not in _FROM_NUMPY:
        raise IRError(f"numpy dtype {dt} has no egraft counterpart; use one of {', '.join(DTYPES)}")
    return _FROM_NUMPY[dt]


def compute_dtype(dtype: str) -> np.dtype:
    """The numpy dtype the reference interpreter computes a value of `dtype` in."""
    return ROWS[row(dtype).compute].numpy


def promote(a: str, b: str) -> str:
    """The dtype two operands meet in, as numpy/torch promote (float16 with bfloat16 meet in float32)."""
    if a == b:
        return a
    ra, rb = row(a), row(b)
    if ra.rank == rb.rank:
        return ra.compute
    return a if ra.rank > rb.rank else b


def from_torch(tdtype) -> str:
    name = str(tdtype).removeprefix("torch.")
    if name not in _FROM_TORCH:
        raise IRError(f"torch dtype {tdtype} is not supported; egraft supports {', '.join(DTYPES)}")
    return _FROM_TORCH[name]
