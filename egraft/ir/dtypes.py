"""The IR's dtypes and their numpy counterparts.

bfloat16 has no numpy dtype of its own; ``ml_dtypes`` (a JAX dependency)
supplies one.  Half types are *stored* in their own dtype but the reference
interpreter *computes* in float32 and rounds after each op, as GPU kernels do.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import IRError

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
INT_DTYPES = ("int32", "int64")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "bool")

_NUMPY = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}


def check(dtype: str, op: str | None = None) -> str:
    """`dtype` if egraft knows it; IRError otherwise (naming `op`, the op that asked, when given)."""
    if dtype not in _NUMPY:
        where = f"{op}: " if op else ""
        raise IRError(f"{where}unknown dtype {dtype!r}; egraft supports {', '.join(DTYPES)}")
    return dtype


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def to_numpy(dtype: str) -> np.dtype:
    return _NUMPY[check(dtype)]


def from_numpy(dt) -> str:
    dt = np.dtype(dt)
    if dt not in _FROM_NUMPY:
        raise IRError(f"numpy dtype {dt} has no egraft counterpart; use one of {', '.join(DTYPES)}")
    return _FROM_NUMPY[dt]


def compute_dtype(dtype: str) -> np.dtype:
    """The numpy dtype the reference interpreter computes a value of `dtype` in."""
    if dtype in ("float16", "bfloat16"):
        return np.dtype(np.float32)
    return to_numpy(dtype)


def from_torch(tdtype) -> str:
    name = str(tdtype).replace("torch.", "")
    if name not in _NUMPY:
        raise IRError(f"torch dtype {tdtype} is not supported; egraft supports {', '.join(DTYPES)}")
    return name
