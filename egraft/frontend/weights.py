"""The traced graph's weight arrays: one read-only host copy per parameter, shared by every trace that asks.

A traced graph binds each parameter and buffer as a numpy array of its own
(the graph must not change when the model's parameters later do), so the
tracer copies them.  Two things keep that copy cheap:

* **One copy per parameter, not per trace.**  A :class:`WeightCopies` hands
  out the same array for the same tensor bytes (same storage, offset,
  shape, strides, dtype, device and version counter, so an in-place update
  of the parameter in between gets a fresh copy).  ``egraft.compile`` of a
  causal LM traces one step program per chunk size; passing one
  ``WeightCopies`` to each trace makes every chunk program bind the same
  arrays (a model's weights once in memory, not once per chunk size).
* **Or no copy at all** (``WeightCopies(views=True)``, what ``egraft.compile``
  of a causal LM uses): a contiguous CPU parameter whose data is aligned is
  bound as a read-only numpy *view* of the parameter's own memory, so the
  compiled programs hold the model's weights once, not the model plus a
  copy.  The graph then changes when the parameter does, so
  :meth:`WeightCopies.changed` names every parameter updated in place since
  it was viewed, and the caller refuses to run on a mix of old folded values
  and new weights (``api.generation.Generation.generate``).
* **Aligned to** :data:`ALIGN` **bytes.**  The JAX backend places weights
  with ``jax.device_put``; on the CPU, XLA aliases a read-only host array
  instead of copying it when its data is 64-byte aligned (numpy's own
  allocations are 16-byte aligned, so they were copied: one more copy of
  the weights per JAX executable, each search candidate included).
"""

from __future__ import annotations

import numpy as np

from ..ir.tensors import ALIGN, aligned_copy, to_numpy, view_numpy  # noqa: F401 - ALIGN and aligned_copy are used from here too


class WeightCopies:
    """Read-only aligned numpy copies of tensors, one per distinct tensor contents (the module docstring).

    The tensors are held with their copies, so a key's storage pointer is
    never reused by another tensor while the copy is handed out.
    """

    def __init__(self, views: bool = False):
        self.views = views
        self._copies: dict[tuple, tuple[object, np.ndarray]] = {}

    @staticmethod
    def _key(t) -> tuple:
        return (str(t.device), t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                tuple(t.stride()), t.dtype, t._version)

    def __len__(self) -> int:
        return len(self._copies)

    def get(self, t) -> np.ndarray:
        """The copy of tensor `t` (made on first use; every time for an inference tensor, which has no version
        counter to tell an in-place update from the same contents)."""
        if getattr(t, "is_inference", lambda: False)():
            return aligned_copy(to_numpy(t))
        key = self._key(t)
        hit = self._copies.get(key)
        if hit is None:
            hit = self._copies[key] = (t, self._view(t) if self.views else None)
            if hit[1] is None:
                hit = self._copies[key] = (t, aligned_copy(to_numpy(t)))
        return hit[1]

    @staticmethod
    def _view(t) -> np.ndarray | None:
        """A read-only view of `t`'s memory when XLA can alias it (contiguous, on the CPU, aligned); else None."""
        if t.device.type != "cpu" or not t.is_contiguous() or t.requires_grad:
            return None
        try:
            a = view_numpy(t).view()
        except (TypeError, RuntimeError):  # a dtype with no numpy twin and no bit view
            return None
        if a.ctypes.data % ALIGN:
            return None
        a.setflags(write=False)
        return a

    def counts(self) -> dict:
        """How many tensors are bound as views of the model's memory, and how many as copies."""
        views = sum(1 for t, a in self._copies.values() if a is not None and a.ctypes.data == t.data_ptr())
        return {"views": views, "copies": len(self._copies) - views}

    def changed(self) -> list[str]:
        """Where a viewed parameter was updated in place since it was viewed: its shape, for the error message."""
        if not self.views:
            return []
        return [f"a {tuple(t.shape)} {t.dtype} tensor" for key, (t, _) in self._copies.items() if t._version != key[-1]]


__all__ = ["ALIGN", "WeightCopies", "aligned_copy"]
