"""Fixed conditions for a measurement: which cores, how many threads.  The one pinning context.

Two timings compare only when taken under the same conditions, so every
measurement egraft makes or reports runs inside :func:`pinned` (the
comparison of a compiled model with eager PyTorch and torch.compile,
``egraft bench``), and a script that measures calls :func:`fix_threads`
once, before torch or JAX start their thread pools:

* the process is pinned to `threads` cores (``os.sched_setaffinity``);
* OpenMP/MKL are told `threads` threads and torch runs that many;
* at one thread XLA's Eigen pool is turned off
  (``--xla_cpu_multi_thread_eigen=false``; read when XLA starts).

:func:`pinned` undoes the affinity, torch's thread count and the environment
variables on exit (they only matter to pools not started yet, but a process
started after the measurement must not inherit them).
On a GPU nothing is pinned: ``do_bench`` times with CUDA events.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator, Sequence

from ..errors import BackendError
from .device import parse


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "XLA_FLAGS")


def _set(n: int, cores: Sequence[int]) -> None:
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = str(n)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    if n == 1 and "--xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    if cores:
        os.sched_setaffinity(0, cores)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)


def _chosen(threads: int) -> list[int]:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise BackendError(f"a measurement needs at least 1 thread, got {threads!r}")
    cores = _cores()
    if cores and threads > len(cores):
        raise BackendError(f"cannot measure on {threads} cores: this process may use {len(cores)} ({cores})")
    return cores[len(cores) - threads:] if cores else []  # the last cores: core 0 takes most interrupts


def fix_threads(n: int) -> tuple[int, ...]:
    """Run this process on `n` cores with `n` threads everywhere, for good; call it before torch or jax start.

    XLA sizes its pools (YNNPACK's dots included, which the Eigen flag does
    not reach) from the cores it may use when it starts; pinned later, a
    two-thread XLA pool time-shares one core and a program's spread swells
    (seen: 58 % against eager's 17 %).  Returns the cores.
    """
    _set(n, _chosen(n))
    return tuple(_cores())


@contextmanager
def pinned(device: str = "cpu", threads: int = 1) -> Iterator[dict]:
    """Measure under fixed conditions inside the block; yields what they are (``device``, ``pinned``, ``torch_threads``).

    On the CPU: `threads` cores and threads (module docstring), restored on
    exit.  On a GPU: nothing to fix.
    """
    torch = sys.modules.get("torch")
    info = {"device": str(device), "pinned": [], "torch_threads": torch.get_num_threads() if torch else None}
    if parse(device).kind != "cpu":
        yield info
        return
    before, threads_before = _cores(), info["torch_threads"]
    env_before = {k: os.environ.get(k) for k in _ENV}
    chosen = _chosen(threads)
    _set(threads, chosen)
    info.update(pinned=_cores(), torch_threads=threads)
    try:
        yield info
    finally:
        if before:
            os.sched_setaffinity(0, before)
        torch = sys.modules.get("torch")
        if torch is not None and threads_before is not None:
            torch.set_num_threads(threads_before)
        for k, v in env_before.items():  # child processes started later must not inherit the measurement's
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def xla_started_wider() -> bool:
    """True when JAX's CPU backend is already up and this process may now use fewer cores than it could then.

    Then XLA's thread pools are wider than the cores a measurement pins to;
    the report says so (see :func:`fix_threads`).
    """
    jax = sys.modules.get("jax")
    if jax is None or not hasattr(os, "sched_getaffinity"):
        return False
    try:
        from jax._src import xla_bridge  # the only place that knows whether a backend exists yet

        started = bool(getattr(xla_bridge, "_backends", None))
    except Exception:  # noqa: BLE001 - a jax without that module: assume it started
        started = True
    return started and len(os.sched_getaffinity(0)) < (os.cpu_count() or 1) and \
        "--xla_cpu_multi_thread_eigen=false" not in os.environ.get("XLA_FLAGS", "")


class pin:  # noqa: N801 - used like a function: pin([0]) or `with pin([0]) as p:`
    """Pin this process to `cores` (``os.sched_setaffinity``); restores the old set on exit or :meth:`restore`.

    The affinity step of :func:`pinned`, for callers that choose the cores
    themselves; ``before`` and ``after`` report what was done.
    """

    def __init__(self, cores: Sequence[int]):
        if not hasattr(os, "sched_setaffinity"):
            raise BackendError("this platform cannot pin a process to cores (no os.sched_setaffinity)")
        self.before = tuple(sorted(os.sched_getaffinity(0)))
        want = tuple(sorted(set(int(c) for c in cores)))
        if not want or not set(want) <= set(self.before):
            raise BackendError(f"cannot pin to cores {list(want)}; this process may use cores {list(self.before)}")
        os.sched_setaffinity(0, want)
        self.after = tuple(sorted(os.sched_getaffinity(0)))

    def restore(self) -> None:
        os.sched_setaffinity(0, self.before)

    def __enter__(self) -> "pin":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"pin(before={list(self.before)}, after={list(self.after)})"
