"""What every benchmark's JSON file shares: the envelope (what ran, when, where, with which libraries) and timings.

bench/trace_time.py, bench/saturation.py, bench/call_overhead.py and
bench/search.py each write, with ``--out FILE``, one JSON object made of
:func:`envelope` plus their own keys:

* ``bench`` (the benchmark's name), ``date`` (``YYYY-MM-DD``), ``command``
  (``python3 bench/<script>.py`` and the exact arguments), ``quick``,
  ``device`` (``"cpu"`` or ``"cuda"``), ``threads`` (the threads the script
  ran its libraries with), ``cores`` (the CPUs this process may run on when
  the file is written, i.e. after the script pinned itself), ``versions``
  (python, torch, jax, jaxlib, numpy, egglog, deap, triton, transformers:
  the installed distributions' versions, read from their metadata without
  importing them; null for one that is not installed).
* Every timing is :func:`timing`: ``{"median", "spread", "n", "samples"}``
  in seconds, built by ``egraft.measure.summarize`` (median of the samples;
  spread = p10-p90, or the IQR under 10 samples, over the median).  A reader
  rebuilds the ``Timing`` with :func:`load_timing` and decides a speed-up
  between any two with ``egraft.measure.compare``, the project's one rule.

:func:`write` writes strict JSON (indent 1; NaN and infinities become null).
:func:`fill` gives the ``--quick`` mode its settings: an option left unset
takes the quick default under ``--quick`` and the full one otherwise, so an
explicit flag always wins.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

VERSIONS = ("torch", "jax", "jaxlib", "numpy", "egglog", "deap", "triton", "transformers")


def versions() -> dict:
    """python and each of :data:`VERSIONS` (its installed version, or None when it is not installed)."""
    out: dict[str, Any] = {"python": platform.python_version()}
    for name in VERSIONS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def envelope(bench: str, script: str, argv: Sequence[str], *, quick: bool, device: str, threads: int) -> dict:
    """The keys every benchmark file starts with (module docstring); `script` is the file name in bench/."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"envelope: device must be 'cpu' or 'cuda', got {device!r}")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {"bench": bench, "date": datetime.date.today().isoformat(),
            "command": shlex.join(["python3", f"bench/{script}", *argv]), "quick": bool(quick),
            "device": device, "threads": int(threads), "cores": cores, "versions": versions()}


def timing(t, device: str = "cpu") -> dict:
    """One timing record from an ``egraft.measure`` Timing or from raw seconds (summarized here)."""
    from egraft.measure import summarize

    if not hasattr(t, "samples"):
        t = summarize(list(t), device)
    return {"median": t.median, "spread": t.spread, "n": t.n, "samples": list(t.samples)}


def load_timing(record: Mapping[str, Any], device: str = "cpu"):
    """The ``egraft.measure`` Timing of a record written by :func:`timing` (for ``egraft.measure.compare``)."""
    from egraft.measure import summarize

    return summarize(record["samples"], device)


def fill(args, quick: Mapping[str, Any], full: Mapping[str, Any]) -> None:
    """Each option of `args` that is None (not given) takes its ``quick`` or ``full`` default."""
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def write(path: str, record: Mapping[str, Any]) -> None:
    """`record` as strict JSON at `path` (indent 1; non-finite floats as null; parent folders made)."""
    from egraft.search.result import jsonable

    text = json.dumps(jsonable(dict(record)), indent=1, allow_nan=False)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
