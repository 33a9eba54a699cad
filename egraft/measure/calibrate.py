"""This CPU's own peaks, measured: float32 GEMM FLOP/s and copy bandwidth.

No datasheet number is trustworthy for a CPU (clocks depend on the vector
width in use and on how many cores are busy; bandwidth on the DIMMs), so
the roofline for ``cpu`` is measured on the cores this process runs on
(pin first with ``timing.pin`` to calibrate the cores you will time on).
The result has the shape of a :class:`~egraft.measure.specs.DeviceSpec`
and is cached per process and affinity, since calibrating costs about
`seconds` each time.

Both numbers are best-of-repeats (a peak is the best observed, not the
typical): GEMM on square float32 matrices through numpy's BLAS and through
XLA's dot (``jax.jit``), the faster of the two, since the programs priced
against this peak run on either (on this project's AMD EPYC machine XLA's
dot reached about 2x numpy's: a numpy-only peak put measured programs above
their "bound"); bandwidth via ``np.copyto`` of a large array, counting the
bytes read plus written.
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


def _xla_gemm(a: np.ndarray, b: np.ndarray):
    """A call of XLA's float32 GEMM on `a` @ `b` (compiled, waited on), or None where jax is missing."""
    try:
        import jax
    except ImportError:
        return None
    f = jax.jit(lambda x, y: x @ y)
    x, y = jax.device_put(a), jax.device_put(b)
    f(x, y).block_until_ready()  # compiled outside the timed calls
    return lambda: f(x, y).block_until_ready()


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
    rates = {"numpy": _best_rate(2.0 * n**3, lambda: np.matmul(a, b, out=c), seconds / 4)}
    xla = _xla_gemm(a, b)
    if xla is not None:
        rates["xla"] = _best_rate(2.0 * n**3, xla, seconds / 4)
    best = max(rates, key=rates.get)
    flops = rates[best]
    elems = (4 if small else 32) * 2**20  # 16 MiB or 128 MiB of float32: past the last-level cache
    src = np.ones(elems, dtype=np.float32)
    dst = np.empty_like(src)
    bandwidth = _best_rate(2.0 * src.nbytes, lambda: np.copyto(dst, src), seconds / 2)
    spec = DeviceSpec(f"cpu (cores {list(cores)})", {"float32": flops}, bandwidth,
                      f"measured by calibrate_cpu (GEMM peak: {best}; "
                      + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in rates.items()) + ")")
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
