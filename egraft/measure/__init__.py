"""Measuring candidates: devices, honest timings, validation against the reference, device peaks.

The search needs three answers about a candidate program: is it right
(:func:`validate`), how fast is it and can that be trusted (:func:`time`,
:func:`faster`, :func:`noisy`), and how far from the device's best is it
(:mod:`specs`, :func:`calibrate_cpu`).  The package sits on the backends'
layer: it imports ``ir`` and ``errors`` only, takes any callable (an
``Executable`` among them) without importing the backends, and holds the
comparison core (tolerances, random inputs) that ``egraft.testing``
re-exports.  torch, jax and triton are imported only inside the functions
that need them.
"""

from __future__ import annotations

from .calibrate import calibrate_cpu, spec_for
from .device import Device, available, parse, require
from .inputs import random_array, random_inputs
from .specs import TABLE, DeviceSpec, lookup
from .timing import (Timing, compare, faster, fix_threads, interleaved, median_interval, noisy, pin, summarize, time, time_cpu,
                     time_cuda, time_jax)
from .tolerances import TOLERANCE, eps, error_budgets, rel_err, tolerance, tolerance_for
from .validate import Validation, poison, validate

__all__ = [
    "TABLE", "TOLERANCE", "Device", "DeviceSpec", "Timing", "Validation", "available", "calibrate_cpu", "compare",
    "eps", "error_budgets", "faster", "fix_threads", "interleaved", "lookup", "median_interval", "noisy", "parse", "pin", "poison", "random_array", "random_inputs",
    "rel_err", "require", "spec_for", "summarize", "time", "time_cpu", "time_cuda", "time_jax", "tolerance",
    "tolerance_for", "validate",
]
