"""A file read into memory that the kernel may back with transparent huge pages (Linux), for weights a CPU reads.

A decode step streams every weight once, about 0.3-2.5 GB a step for the
models egraft serves, and a CPU translates each address it reads through
its TLB.  By default a loaded artifact's weights are the safetensors file
memory-mapped: 4 KiB pages wherever the page cache did not happen to hold
the file in 2 MiB folios (how much of it did depends on how the file was
written and read), so a step's reads missed the TLB on every new page, and
in a virtual machine each miss is a nested page walk.  Read instead into
one anonymous private mapping advised ``MADV_HUGEPAGE`` and aligned to
2 MiB, the same bytes sit in huge pages.  Measured on a 2-core Intel Xeon
VM (135 M model, one core, the same artifact loaded both ways in one
process, decode interleaved): bfloat16 1.10-1.11x in two runs, float32
1.08x in one run and 0.87x in another (likely: in a VM a guest's huge page
saves a TLB walk only where the host backs it with one too); a single
weight product read 13-16 GB/s from huge pages against 10-11 from 4 KiB
anonymous pages.

What it costs: the weights' size in resident memory, as the mapping did,
but private to the process (two processes loading one artifact no longer
share the page cache's copy), and a copy from the page cache at load
(about 0.1 s per 269 MB).  In a virtual machine the first process that
touches memory the host never backed pays the host's faults too: the
first such load there took 6.5 s against 3.9 (269 MB), the next ones 3.8-3.9
like the mapped file.  It is asked for, not the default
(``EGRAFT_HUGE_PAGES=1``): in the benchmark's fresh processes the loads
took 5.9-9.1 s against 3.0-4.0 mapped (the 5 s load target).  :func:`offered`
says whether it applies: asked for, on Linux with transparent huge pages
``always`` or ``madvise``.
"""

from __future__ import annotations

import hashlib
import mmap
import os

import numpy as np

from ..env import flag

HUGE_PAGE = 2 << 20  # x86-64's and arm64's (4 KiB granule) transparent huge page
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def host_offers() -> bool:
    """Whether this host's kernel gives transparent huge pages to memory that asks (Linux, ``always`` or
    ``madvise``)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(_THP) as f:
            mode = f.read()
    except OSError:  # not Linux, or no transparent huge pages
        return False
    return "[always]" in mode or "[madvise]" in mode


def offered() -> bool:
    """Whether files are read into huge pages here: asked for (``EGRAFT_HUGE_PAGES=1``) and :func:`host_offers`."""
    return flag("EGRAFT_HUGE_PAGES", False) and host_offers()


def read_file(path: str) -> tuple[np.ndarray, str] | None:
    """The bytes of `path` as a read-only ``uint8`` array in a 2 MiB-aligned anonymous mapping advised for huge
    pages, and their SHA-256 (hex); None when a mapping cannot be made or advised (the caller maps the file)."""
    size = os.path.getsize(path)
    try:
        m = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return None
    whole = np.frombuffer(m, np.uint8)
    start = (-whole.ctypes.data) % HUGE_PAGE
    data = whole[start:start + size]
    view = memoryview(data)
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < size:
            n = f.readinto(view[done:])
            if not n:
                raise OSError(f"{path} ended after {done} of its {size} bytes while it was read")
            done += n
    digest = hashlib.sha256(view).hexdigest()
    data.flags.writeable = False
    return data, digest


__all__ = ["HUGE_PAGE", "host_offers", "offered", "read_file"]
