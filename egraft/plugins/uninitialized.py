"""Allocations whose values are unspecified (``torch.empty`` and kin): what stays PyTorch's, and the check's fill.

An out= buffer a custom op fills (vLLM's linears and attention write into
one) has nothing to compile and no value a compiled piece could be checked
against, so the partitioner leaves it, and any value computed from it, to
PyTorch (``partition._Support``).  A graph may also return such a buffer, or
a part no op wrote, for a later graph to fill: for the check of a split
graph against PyTorch, :func:`filled_allocations` zeroes every such
allocation in both runs, and in the run that records each piece's example
inputs (so none holds whatever the memory held).
"""

from __future__ import annotations

import torch
import torch.utils._python_dispatch

# allocations whose values are unspecified (an out= buffer a custom op fills, as vLLM's linears and attention do):
# nothing to compile, and no value a compiled piece could be checked against, so they stay PyTorch's
UNINITIALIZED = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


class _FilledAllocations(torch.utils._python_dispatch.TorchDispatchMode):
    supports_higher_order_operators = True  # a custom op writing into a buffer comes as auto_functionalized: run it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "overloadpacket", None) is not None and func.overloadpacket.__name__ in UNINITIALIZED:
            out.zero_()  # (the mode is off inside its own handler)
        return out


def filled_allocations() -> _FilledAllocations:
    """While active, every allocation with unspecified values (:data:`UNINITIALIZED`) comes back zeroed.

    For the check of a split graph against PyTorch, both runs inside it: an out= buffer is uninitialised memory,
    and a graph may return it (or a part no op wrote) for a later graph to fill, as vLLM's hand their attention
    its output buffer: compared as they were, those outputs held whatever the memory held, in each run its own
    (the graph then ran in PyTorch: 'relative error inf').  The buffers stay PyTorch's in the compiled graph too
    (``partition._Support``), so both runs see the same zeros where nothing wrote.
    """
    return _FilledAllocations()


__all__ = ["UNINITIALIZED", "filled_allocations"]
