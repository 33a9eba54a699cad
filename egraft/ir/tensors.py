"""The one torch <-> numpy bridge: zero-copy where memory allows, a dtype without a numpy twin through its bits.

Every conversion between torch tensors and numpy arrays in egraft goes
through here.  A dtype whose row in :mod:`.dtypes` names ``bits`` (bfloat16:
int16) crosses as a reinterpreting view of an int tensor of its width, so
no value is rounded or widened on the way.

torch is never imported at module level: a function that takes a tensor is
only reached with one in hand, so ``sys.modules`` already holds torch, and
the IR (which must not import torch) can use this module.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np

from ..errors import InputError
from . import dtypes


def torch_module():
    return sys.modules.get("torch")


def _torch():
    """torch itself, which whoever hands this module a tensor (or asks for one) has loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        raise InputError("a torch tensor was asked for but torch is not imported; import torch first "
                         "(egraft's IR never imports it)")
    return torch


def is_tensor(x) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def torch_dtype(dtype: str):
    """The torch dtype of the IR dtype `dtype`."""
    torch = _torch()
    return getattr(torch, dtypes.row(dtype).torch)


def ir_dtypes() -> dict:
    """torch dtype -> IR dtype name, for every dtype of the table (the dtypes egraft compiles)."""
    if not _IR_OF_TORCH:
        _IR_OF_TORCH.update({torch_dtype(d): d for d in dtypes.DTYPES})
    return _IR_OF_TORCH


_IR_OF_TORCH: dict = {}  # filled on first use (torch is loaded by then)


def _bits_of_torch(torch, tdtype):
    """(torch int dtype, numpy dtype) a torch dtype without a numpy twin crosses through; None for the others."""
    if not _BITS_TORCH:
        _BITS_TORCH.update({getattr(torch, r.torch): (getattr(torch, r.bits), r.numpy)
                            for r in dtypes.ROWS.values() if r.bits})
    return _BITS_TORCH.get(tdtype)


_BITS_TORCH: dict = {}  # filled on first use, from the dtype table (torch is loaded by then)
_BITS_NUMPY = {r.numpy: (np.dtype(r.bits), r.name) for r in dtypes.ROWS.values() if r.bits}


def view_numpy(t) -> np.ndarray:
    """A numpy array sharing the CPU tensor `t`'s memory (no detach, no copy); bfloat16 as ml_dtypes' bfloat16."""
    bits = _bits_of_torch(_torch(), t.dtype)
    return t.view(bits[0]).numpy().view(bits[1]) if bits else t.numpy()


def view_torch(a: np.ndarray):
    """A CPU tensor sharing `a`'s memory (a copy only for negative strides); bfloat16 through an int16 view."""
    torch = _torch()
    try:
        with warnings.catch_warnings():  # read-only arrays: egraft never writes into an input or weight
            warnings.simplefilter("ignore", UserWarning)
            bits = _BITS_NUMPY.get(a.dtype)
            if bits:
                return torch.from_numpy(a.view(bits[0])).view(torch_dtype(bits[1]))
            return torch.from_numpy(a)
    except ValueError:  # negative strides, or a view whose itemsize change does not fit
        return view_torch(np.ascontiguousarray(a))


def to_numpy(t) -> np.ndarray:
    """A numpy array with `t`'s values: its own memory for a CPU tensor (bfloat16 as ml_dtypes' bfloat16)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    try:
        return view_numpy(t if _bits_of_torch(_torch(), t.dtype) is None else t.contiguous())
    except (RuntimeError, TypeError):  # conj / neg-bit views and the like
        return view_numpy(t.resolve_conj().resolve_neg().clone())


def as_numpy(x: Any, what: str = "input") -> np.ndarray:
    """A numpy array from a numpy array (itself), a torch tensor (:func:`to_numpy`), or a scalar/list."""
    if isinstance(x, np.ndarray):
        return x
    if is_tensor(x):
        return to_numpy(x)
    try:
        return np.asarray(x)
    except Exception as e:  # pragma: no cover - defensive
        raise InputError(f"{what} of type {type(x).__name__} is not an array or tensor") from e


def widened(x: Any) -> np.ndarray:
    """:func:`as_numpy`, with a dtype numpy has no arithmetic type for (bfloat16) widened exactly to its
    compute dtype, so numpy's float tests, printing and comparisons treat it as the float it is."""
    a = as_numpy(x)
    bits = _BITS_NUMPY.get(a.dtype)
    return a.astype(dtypes.compute_dtype(bits[1])) if bits else a


def to_torch(a: np.ndarray, device=None, copy: bool = True):
    """A tensor with `a`'s values on `device`; `copy=False` shares `a`'s memory on the CPU when it can."""
    torch = _torch()
    a = np.asarray(a)
    if copy or not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, order="C")
    t = view_torch(a)
    return t if device is None or t.device == torch.device(device) else t.to(device)


ALIGN = 64  # bytes: XLA's CPU client aliases host buffers aligned to this instead of copying them


def aligned_copy(arr: np.ndarray, align: int = ALIGN) -> np.ndarray:
    """A read-only C-contiguous copy of `arr` whose data starts on an `align`-byte boundary."""
    arr = np.asarray(arr)
    nbytes = arr.size * arr.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    out = raw[start:start + nbytes].view(arr.dtype).reshape(arr.shape)
    np.copyto(out, arr, casting="no")
    out.setflags(write=False)
    return out


__all__ = ["ALIGN", "aligned_copy", "as_numpy", "ir_dtypes", "is_tensor", "to_numpy", "to_torch", "torch_dtype", "torch_module", "view_numpy",
           "view_torch", "widened"]
