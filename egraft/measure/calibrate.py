"""This CPU's own peaks, measured: float32 GEMM FLOP/s and copy bandwidth.

No datasheet number is trustworthy for a CPU (clocks depend on the vector
width in use and on how many cores are busy; bandwidth on the DIMMs), so
the roofline for ``cpu`` is measured on the cores this process runs on
(pin first with ``timing.pin`` to calibrate the cores you will time on).
The result has the shape of a :class:`~egraft.measure.specs.DeviceSpec`
and is cached per process and affinity, since calibrating costs about
`seconds` each time.

Both numbers are best-of-repeats (a peak is the best observed, not the
typical): GEMM via numpy's BLAS on square float32 matrices; bandwidth via
``np.copyto`` of a large array, counting the bytes read plus written.
"""

from __future__ import annotations

import os
import time

import numpy as np

from .device import parse
from .specs import DeviceSpec, cuda_spec, lookup

_CACHE: dict[tuple, DeviceSpec] = {}


def _best_rate(work: float, fn, budget: float) -> float:
    """work / best time of `fn` over as many repeats as fit in `budget` seconds (at least two)."""
    best = float("inf")
    end = time.perf_counter() + budget
    runs = 0
    while runs < 2 or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return work / max(best, 1e-9)


def calibrate_cpu(seconds: float = 1.0, refresh: bool = False) -> DeviceSpec:
    """Measure float32 GEMM FLOP/s and memory bandwidth here, in about `seconds`; cached per process."""
    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    if not refresh and cores in _CACHE:
        return _CACHE[cores]
    rng = np.random.default_rng(0)
    small = seconds < 0.5
    n = 256 if small else 1024
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    flops = _best_rate(2.0 * n**3, lambda: np.matmul(a, b, out=c), seconds / 2)
    elems = (4 if small else 32) * 2**20  # 16 MiB or 128 MiB of float32: past the last-level cache
    src = np.ones(elems, dtype=np.float32)
    dst = np.empty_like(src)
    bandwidth = _best_rate(2.0 * src.nbytes, lambda: np.copyto(dst, src), seconds / 2)
    spec = DeviceSpec(f"cpu (cores {list(cores)})", {"float32": flops}, bandwidth, "measured by calibrate_cpu")
    _CACHE[cores] = spec
    return spec


def spec_for(device: str) -> DeviceSpec | None:
    """The spec of `device`: measured for ``cpu``, the datasheet table for CUDA and TPU (None if unknown)."""
    d = parse(device)
    if d.kind == "cpu":
        return calibrate_cpu()
    if d.kind == "cuda":
        return cuda_spec(d.index or 0)
    import jax

    return lookup(jax.devices("tpu")[0].device_kind)
