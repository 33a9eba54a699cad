"""What the egraft Dynamo backend did in this process, as counts: :func:`stats`, and a file for other processes.

A serving engine runs the model in a process of its own (vLLM spawns its
engine core and workers), so a caller that wants to know whether egraft
compiled anything cannot inspect the backend's objects.  The backend counts
each event here; :func:`stats` returns a snapshot, and when
``$EGRAFT_STATS_FILE`` names a file the snapshot is written there (as JSON,
replaced atomically) after every compile, on the 1st, 2nd, 4th, 8th ... call
of each kind and otherwise at most once a second, and once more at exit (a
serving engine may kill its workers, so the last second of calls can be
missing from the file).  ``{pid}`` in the name is replaced by
the process id, so that several processes write files of their own
(:func:`read_files` merges them).

The counts:

* ``graphs``: graphs Dynamo (or a compile cache) handed to the backend;
* ``symbolic_graphs``: those with a symbolic size among their inputs;
* ``compiled``: input signatures egraft compiled as one whole program;
* ``split``: signatures compiled in pieces around ops left to PyTorch, and
  ``pieces``: the pieces egraft compiled for them;
* ``split_reused``: signatures of a split graph with a dynamic size whose pieces all run programs
  compiled for other sizes (padded to a bucket size; nothing compiled);
* ``eager``: signatures that run wholly in PyTorch, by reason in ``eager_reasons``;
* ``fallback_ops``: the ops split graphs left to PyTorch, with how many signatures left each;
* ``calls``: graph calls run by egraft programs (``egraft``) and wholly in PyTorch (``pytorch``);
* ``serialized`` / ``deserialized``: compiled graphs written to and read back
  from a compile cache (vLLM's, :mod:`egraft.plugins.serialize`).
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import tempfile
import threading
import time

ENV_VAR = "EGRAFT_STATS_FILE"
_WRITE_EVERY_S = 1.0

_LOCK = threading.Lock()
_COUNTS: dict = {}
_LAST_WRITE = [0.0]
_AT_EXIT = [False]


def _empty() -> dict:
    return {"graphs": 0, "symbolic_graphs": 0, "compiled": 0, "split": 0, "pieces": 0, "split_reused": 0,
            "eager": 0,
            "eager_reasons": {}, "fallback_ops": {}, "calls": {"egraft": 0, "pytorch": 0},
            "serialized": 0, "deserialized": 0}


_COUNTS.update(_empty())


def stats() -> dict:
    """A snapshot of this process's counts (a fresh dict; see the module docstring)."""
    with _LOCK:
        return json.loads(json.dumps(_COUNTS))


def reset() -> None:
    """Zero every count (tests; a fresh measurement in one process)."""
    with _LOCK:
        _COUNTS.clear()
        _COUNTS.update(_empty())


def graph_received(symbolic: bool) -> None:
    _bump("graphs", symbolic_graphs=int(symbolic))


def compiled() -> None:
    _bump("compiled")


def split(pieces: int, fallback_ops) -> None:
    with _LOCK:
        _COUNTS["split"] += 1
        _COUNTS["pieces"] += pieces
        for op in fallback_ops:
            _COUNTS["fallback_ops"][str(op)] = _COUNTS["fallback_ops"].get(str(op), 0) + 1
    _write(force=True)


def split_reused() -> None:
    _bump("split_reused")


def eager(reason: str) -> None:
    with _LOCK:
        _COUNTS["eager"] += 1
        _COUNTS["eager_reasons"][reason] = _COUNTS["eager_reasons"].get(reason, 0) + 1
    _write(force=True)


def called(by_egraft: bool) -> None:
    """One graph call (the hot path: a count; a file write on the 1st, 2nd, 4th, 8th ... call, else once a second)."""
    with _LOCK:
        kind = "egraft" if by_egraft else "pytorch"
        _COUNTS["calls"][kind] += 1
        n = _COUNTS["calls"][kind]
    _write(force=n & (n - 1) == 0)


def serialized() -> None:
    _bump("serialized")


def deserialized() -> None:
    _bump("deserialized")


def _bump(key: str, **more: int) -> None:
    with _LOCK:
        _COUNTS[key] += 1
        for k, v in more.items():
            _COUNTS[k] += v
    _write(force=True)


def path() -> str | None:
    """The file ``$EGRAFT_STATS_FILE`` names for this process, or None."""
    name = os.environ.get(ENV_VAR, "").strip()
    return name.replace("{pid}", str(os.getpid())) if name else None


def _write(force: bool) -> None:
    target = path()
    if target is None:
        return
    now = time.monotonic()
    if not force and now - _LAST_WRITE[0] < _WRITE_EVERY_S:
        return
    _LAST_WRITE[0] = now
    if not _AT_EXIT[0]:
        _AT_EXIT[0] = True
        atexit.register(_write, True)
    snapshot = {**stats(), "pid": os.getpid()}
    folder = os.path.dirname(os.path.abspath(target))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".egraft-stats-")
    with os.fdopen(fd, "w") as f:
        json.dump(snapshot, f, indent=1, sort_keys=True)
    os.replace(tmp, target)


def read_files(pattern: str) -> dict:
    """The counts of every file matching ``pattern`` (``{pid}`` matches any process), summed; ``pids`` lists them."""
    total, pids = _empty(), []
    for name in sorted(glob.glob(pattern.replace("{pid}", "*"))):
        with open(name) as f:
            one = json.load(f)
        pids.append(one.pop("pid", None))
        _add(total, one)
    total["pids"] = pids
    return total


def _add(into: dict, more: dict) -> None:
    for k, v in more.items():
        if isinstance(v, dict):
            _add(into.setdefault(k, {}), v)
        else:
            into[k] = into.get(k, 0) + v
