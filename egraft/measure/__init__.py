"""Measuring programs: is it right, how fast is it, can the difference be trusted.

One of each mechanism, used by every part of egraft:

* the correctness check: :func:`check.outputs` (the search's candidate
  validation against the float64 reference, :func:`validate`; the check of
  a compiled signature against the model; ``egraft run --check``), with the
  tolerance rule of :mod:`.tolerances`;
* the random-input policy: :mod:`.inputs` (:func:`random_inputs` for a
  graph, :func:`like` for an example input set, :func:`from_specs` for
  shapes and dtypes);
* the timings: :func:`time`, :func:`interleaved` (:mod:`.timing`), and the
  speed-up verdict :func:`compare` (the medians' ~95 % intervals);
* the fixed conditions: :func:`pinned` and :func:`fix_threads` (:mod:`.pinning`);
* the device strings: :func:`parse` (:mod:`.device`) and device peaks
  (:mod:`.specs`, :func:`calibrate_cpu`);
* a compiled model against eager PyTorch and torch.compile: :func:`compare_model`;
* which compile stage set the process's peak memory: :mod:`.memory`.

The package sits on the backends' layer: it imports ``ir`` and ``errors``
only, takes any callable (an ``Executable`` among them) without importing
the backends, and holds the comparison core (tolerances, random inputs)
that ``egraft.testing`` re-exports.  torch, jax and triton are imported only
inside the functions that need them.
"""

from __future__ import annotations

from .calibrate import calibrate_cpu, spec_for
from .check import outputs
from .device import Device, available, parse, require
from .inputs import from_specs, like, random_inputs
from .model import compare_model
from .pinning import fix_threads, pin, pinned
from .specs import TABLE, DeviceSpec, lookup
from .timing import COLLAPSE, compare, interleaved, median_interval, summarize, time, time_cpu, time_cuda, time_jax
from .tolerances import TOLERANCE, output_tolerances, rel_err, tolerance, tolerance_for
from .validate import Validation, validate

__all__ = [
    "COLLAPSE", "TABLE", "TOLERANCE", "Device", "DeviceSpec", "Validation", "available",
    "calibrate_cpu", "compare", "compare_model", "fix_threads", "from_specs", "interleaved", "like", "lookup",
    "median_interval", "output_tolerances", "outputs", "parse", "pin", "pinned", "random_inputs", "rel_err", "require",
    "spec_for", "summarize", "time", "time_cpu", "time_cuda", "time_jax", "tolerance", "tolerance_for",
    "validate",
]
