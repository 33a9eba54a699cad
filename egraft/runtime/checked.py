"""The checked torch-input step every runner's caller shares (the backends' executables, a loaded artifact).

Conversions between torch and numpy are the IR's one bridge (:mod:`egraft.ir.tensors`); this module only
checks a call's tensors against the (shape, dtype) list a program takes.  torch is never imported here.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import InputError
from ..ir.tensors import to_torch, torch_dtype, torch_module


def torch_signature(types) -> tuple:
    """Per input (shape, IR dtype name) in `types`: (shape tuple, torch dtype), what ``checked_tensors`` compares."""
    return tuple((tuple(s), torch_dtype(d)) for s, d in types)


def checked_tensors(inputs, sig: tuple, explain: Callable[[], Any]) -> list:
    """`inputs` as tensors, each of the (shape, torch dtype) `sig` lists for it, detached; numpy arrays converted.

    The checking torch path of every runner's caller (the backends'
    executables and a loaded artifact): a numpy array or list among the
    tensors becomes a tensor on the first tensor's device.  When the count,
    a shape or a dtype does not fit, ``explain()`` raises the caller's
    ``InputError``, worded for what the caller knows (a graph, a manifest).
    """
    torch = torch_module()
    if len(inputs) != len(sig):
        explain()
        raise InputError(f"the program takes {len(sig)} input(s), got {len(inputs)}")  # explain() raises first
    dev = next((x.device for x in inputs if isinstance(x, torch.Tensor)), None)
    xs = []
    for (shape, dt), x in zip(sig, inputs):
        if not isinstance(x, torch.Tensor):
            a = np.asarray(x)
            x = to_torch(a, dev) if a.dtype != object else None
        if x is None or tuple(x.shape) != shape or x.dtype != dt:
            explain()
            raise InputError(f"an input does not fit the program's {list(shape)}:{dt}")  # explain() raises first
        xs.append(x.detach() if x.requires_grad else x)
    return xs


__all__ = ["checked_tensors", "torch_signature"]
