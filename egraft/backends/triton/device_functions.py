"""Device functions a generated kernel may call, written into its source only when it calls them.

One table: name -> source.  A rule that needs one calls ``w.use(name)``
(:class:`~egraft.backends.triton.emitter.KernelWriter`) and writes a call to
`name` in its expression; the kernel's source then carries the definition
(``kernel._spec``), so a saved kernel file stands alone.

``fmod``: the truncated remainder of two floats, exact.  Triton's ``%`` on
floats is LLVM's ``frem``, which the GPU computes as ``x - trunc(x / y) * y``:
not exact (off by 1.4e-4 on ordinary float32 values, seen on an H200 with
Triton 3.6) and inf for an infinite ``x``.  On the GPU the kernel calls
CUDA's ``fmod`` (libdevice, exact, C's special values); under Triton's
interpreter ``%`` is numpy's ``fmod``, which is already exact (the interpreter
has no libdevice).
"""

from __future__ import annotations

FUNCTIONS = {
    "fmod": '''\
from triton.language.extra import libdevice as _libdevice
from triton.runtime.interpreter import InterpretedFunction as _Interpreted


@triton.jit
def _fmod_device(x, y):
    return _libdevice.fmod(x, y)


@triton.jit
def _fmod_interpreted(x, y):
    return x % y


fmod = _fmod_interpreted if isinstance(tl.sum, _Interpreted) else _fmod_device
''',
}


def definitions(names) -> list[str]:
    """The source lines defining `names` (in the table's order)."""
    out = []
    for name in FUNCTIONS:
        if name in names:
            out += ["", "", *FUNCTIONS[name].rstrip("\n").split("\n")]
    return out


__all__ = ["FUNCTIONS", "definitions"]
