"""Python's cyclic garbage collector paused while an artifact loads.

A load imports torch and JAX's lowering code and builds each program's
jaxpr and MLIR objects: a great many allocations, over which the collector
runs its passes again and again, though almost nothing it finds then is
garbage.  Measured on a 2-core AMD Zen 3 (the 494 M-parameter model's saved
bfloat16 generation, a fresh process pinned to one core per load, rounds
interleaved): ``egraft.load`` took 8.61 s with the collector (quartiles
8.44-9.15) and 7.89 s with it paused (7.72-8.38) over 16 rounds; a second
run of 10 rounds, import included, 8.16 s (7.71-8.74) against 7.85 s
(7.73-8.36): less than a second a load, on a noisy host.

:func:`paused` pauses it for the outermost load and restores it as it was
(loads nested in a load, or running in other threads, count: the collector
runs again once the last of them ends, and only if it ran before the
first).  The cycles a load leaves are collected by the collector's next pass
after it.  ``EGRAFT_LOAD_GC=1`` leaves the collector running.
"""

from __future__ import annotations

import contextlib
import gc
import threading

from ..env import flag

ENV_VAR = "EGRAFT_LOAD_GC"

_lock = threading.Lock()
_depth = 0  # loads under way
_was_enabled = False  # the collector's state before the first of them


@contextlib.contextmanager
def paused():
    """The collector off inside (the module docstring)."""
    global _depth, _was_enabled
    if flag(ENV_VAR, False):
        yield
        return
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


__all__ = ["ENV_VAR", "paused"]
