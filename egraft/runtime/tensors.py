"""numpy <-> torch for the runtime: zero-copy where memory allows, bfloat16 through an int16 view.

torch is never imported here; a function that needs it is only reached with
a torch tensor in hand, so ``sys.modules`` already holds it.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from ..errors import InputError
from ..ir import dtypes

BF16 = dtypes.to_numpy("bfloat16")


def torch_module():
    return sys.modules.get("torch")


def is_tensor(x) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def to_numpy(t) -> np.ndarray:
    """A numpy array with `t`'s values: its own memory for a CPU tensor (bfloat16 as ml_dtypes' bfloat16)."""
    torch = torch_module()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(BF16)
    try:
        return t.numpy()
    except (RuntimeError, TypeError):  # conj / neg-bit views and the like
        return t.resolve_conj().resolve_neg().clone().numpy()


def to_torch(a: np.ndarray, device=None, copy: bool = True):
    """A tensor with `a`'s values on `device`; `copy=False` shares `a`'s memory on the CPU when it can."""
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    a = np.asarray(a)
    if copy or not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, order="C")
    t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == BF16 else torch.from_numpy(a)
    return t if device is None or t.device == torch.device(device) else t.to(device)


def torch_signature(types) -> tuple:
    """Per input (shape, IR dtype name) in `types`: (shape tuple, torch dtype), what ``checked_tensors`` compares."""
    torch = torch_module()
    return tuple((tuple(s), getattr(torch, d)) for s, d in types)


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


__all__ = ["BF16", "checked_tensors", "is_tensor", "to_numpy", "to_torch", "torch_module",
           "torch_signature"]
