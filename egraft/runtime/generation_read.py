"""A saved generation's directory read before torch is imported, its step programs' loads started on threads.

``egraft.load`` of a generation (``runtime.generation_artifact``) runs in two
parts.  This one checks ``generation.json``'s format, maps the one weights
file and starts loading each step program (``runtime.load`` of its
directory) on worker threads; then the caller imports the runtime that will
run them (torch, about 2 s) while they load.  A JAX program's load is
mostly XLA rebuilding its executable, one C++ call that releases the GIL, so
on a host of two cores or more torch's import and the programs' compiles
overlap instead of following each other.  Programs of other backends load
after torch's import, one at a time, as they did (``torch.export.load`` is
not thread-safe, and their loaders import torch themselves).

Imports json, os and threads, and the artifact loaders on the threads: no torch.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from ..errors import ArtifactError
from .loaders import loader_of
from .manifest import GENERATION_FILE, MANIFEST_FILE

FORMAT = "egraft-generation"
FORMAT_VERSION = 3  # 3: one shared weights file; 2: one "programs" map of buckets (1: steps, decoders, row_programs)


@dataclass
class Started:
    """A generation whose programs are loading: ``programs()`` waits for them (``abandon()`` on an error)."""

    directory: str
    path: str  # its generation.json
    doc: dict
    device: str
    dirs: list[str]  # the program directories it lists (program_dirs)
    _load: Callable[[str], object]  # a program directory's name -> its loaded artifact
    _loads: dict[str, Future] = field(default_factory=dict)  # started on threads; empty: loaded by programs()
    _pool: ThreadPoolExecutor | None = None

    def programs(self) -> dict[str, object]:
        """Each program directory's loaded artifact, in the listed order; the first listed failure is raised."""
        if not self._loads:
            return {rel: self._load(rel) for rel in self.dirs}
        return {rel: f.result() for rel, f in self._loads.items()}

    def abandon(self) -> None:
        """Loads not begun are dropped and those running awaited, their threads ended, so none outlives the failed
        load that began them (their errors are not reported: the failure that abandons them is)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def start(directory: str, device: str, load_one) -> Started:
    """Read and check `directory`'s ``generation.json``, map its weights, and start each program's
    `load_one(path, device, shared=...)` (``runtime.load``): on threads when every program is JAX's."""
    path = os.path.join(directory, GENERATION_FILE)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path} is corrupt ({e}); save the model again with CompiledModel.save") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        fmt = doc.get("format") if isinstance(doc, dict) else None  # (a list or a number has no format)
        raise ArtifactError(f"{path} is not an egraft generation file (format {fmt!r}, expected "
                            f"{FORMAT!r} when it is a dict); save the model again")
    if not isinstance(doc.get("format_version"), int) or doc["format_version"] > FORMAT_VERSION:
        raise ArtifactError(f"{path} has format_version {doc.get('format_version')!r}; this egraft reads up to "
                            f"{FORMAT_VERSION}: upgrade egraft or save the model again")
    shared = _shared_weights(directory, doc, path, device) if doc["format_version"] >= 3 else None

    def load_sub(rel):
        if os.path.dirname(os.path.normpath(str(rel))) or str(rel).startswith("."):
            raise ArtifactError(f"{path}: step directory {rel!r} is not a plain name inside the artifact")
        return load_one(os.path.join(directory, str(rel)), device, shared=shared)

    listed = program_dirs(doc, path)
    started = Started(directory, path, doc, device, listed, load_sub)
    manifests = [_manifest(directory, rel) for rel in listed]
    if listed and all(m is not None and m["target"].get("backend") == "jax" for m in manifests):
        # the loader (jax) imported here, before the threads: an import on a thread racing this thread's later
        # import of torch could meet it halfway (a module each holds and the other needs)
        loader_of(manifests[0], os.path.join(directory, listed[0]))
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        pool = ThreadPoolExecutor(max(1, min(len(listed), cores)), thread_name_prefix="egraft-load")
        started._loads, started._pool = {rel: pool.submit(load_sub, rel) for rel in listed}, pool
        pool.shutdown(wait=False)  # its threads end once the loads are done
    return started


def program_dirs(doc: dict, path: str) -> list[str]:
    """The program directories `doc` lists, in its order (what each computes is ``generation_artifact``'s)."""
    try:
        if doc["format_version"] >= 2:
            return [str(rel) for rel in dict(doc["programs"])]
        keys = ("steps", "decoders", "row_programs")
        return list(dict.fromkeys(str(rel) for k in keys for rel in dict(doc.get(k) or {}).values()))
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: its program list is missing or malformed ({type(e).__name__}: {e}); "
                            "save the model again") from None


def _manifest(directory: str, rel: str) -> dict | None:
    try:
        with open(os.path.join(directory, str(rel), MANIFEST_FILE)) as f:
            m = json.load(f)
        return m if isinstance(m, dict) and isinstance(m.get("target"), dict) else None
    except (OSError, ValueError):
        return None  # the load itself says what is wrong


def _shared_weights(directory: str, doc: dict, path: str, device: str) -> dict:
    """The generation's one weights file, checked against its recorded SHA-256 and memory-mapped (on a CPU: read
    into huge pages where offered, ``runtime.huge_pages``)."""
    from .device import parse
    from .weights import WEIGHTS_FILE, map_weights

    entry = doc.get("weights")
    if not isinstance(entry, dict) or entry.get("file") != WEIGHTS_FILE or not isinstance(entry.get("sha256"), str):
        raise ArtifactError(f"{path}: its weights entry is missing or malformed ({entry!r:.200}); save the model again")
    return map_weights(os.path.join(directory, WEIGHTS_FILE), entry["sha256"], "save the model again",
                       huge_pages=parse(device, ArtifactError).kind == "cpu")


__all__ = ["FORMAT", "FORMAT_VERSION", "Started", "program_dirs", "start"]
