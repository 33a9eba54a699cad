"""A large file's SHA-256, remembered between processes by the file's identity and times.

``egraft.load`` checks a saved model's weights file against the SHA-256 its
artifact recorded.  Hashing reads every byte: 1.5 s for a 494 M-parameter
model's 2 GB in float32 on a 2-core Zen 3, 10 s or more at 8 B, paid again by
every restart of a server.  So, like git's index, a file whose hash was
computed once is remembered in ``<egraft cache dir>/hashed`` by what
``stat`` says of it (device, inode, size, modification and change times),
and a later load whose ``stat`` matches reuses the hash instead of reading
the file.  Any write to the file changes its change time (which, unlike the
modification time, no user call can set back), so the record no longer
matches and the file is hashed again.

A record is trusted only where the file had not changed in the
:data:`SETTLED` seconds before its hash began (git's "racily clean" rule):
file times come from a clock that ticks in milliseconds, so a write in the
same tick as the file's last one, while or after it was hashed, would leave
the times unchanged.  A file written just before its first load is
therefore hashed again by the next load, which then records it for good.

The one exception is a file egraft wrote itself (:func:`remember_written`):
a save hashes the bytes as it writes them, into a staging directory it has
just made under a random name, and moves that directory into place; the
record it makes then holds the hash of exactly those bytes, and the stat
taken when the writing ended (a rename of the directory leaves the file's
times as they were).  So the first load after a save reads no byte twice.

``EGRAFT_REHASH=1`` hashes every time (and records nothing); a cache
directory that cannot be written only costs the hash.  ``egraft inspect``
always hashes.  The records live beside egraft's compiled-code cache and
are trusted as that is: a process that can write there can also replace
the executables egraft loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from ..env import flag
from .xla_cache import cache_root

SETTLED = 2.0  # seconds a file must have been unchanged before its hash began for its record to count
ENV_VAR = "EGRAFT_REHASH"


def sha256_file(path: str) -> str:
    """The SHA-256 of the file at `path`, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def known_sha256(path: str) -> str:
    """The SHA-256 of `path`: the recorded one where the file is unchanged since a settled record, else
    computed (and recorded)."""
    if _rehash():
        return sha256_file(path)
    began = time.time_ns()  # (before the file is looked at: any write after this has a later change time than a
    st = os.stat(path)      # settled record's, so nothing written while it was read can hide behind it)
    where = _record_path(path, st)
    seen = _identity(st)
    got = _read(where, seen)
    if got is not None:
        return got
    digest = sha256_file(path)
    if _identity(os.stat(path)) == seen:  # (not written while it was read, as far as stat can tell)
        _write(where, {**seen, "sha256": digest, "hashed_from_ns": began})
    return digest


def remember_written(path: str, sha256: str, written: os.stat_result) -> None:
    """Record `sha256`, the hash of the bytes egraft wrote to `path` (in a staging directory it had just made,
    then moved here), as the file's: `written` is the file's ``stat`` when its writing ended, and nothing is
    recorded unless the file is still that one, unchanged since (the module docstring)."""
    if _rehash():
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    seen = _identity(st)
    if seen == _identity(written):
        _write(_record_path(path, st), {**seen, "sha256": sha256, "hashed_from_ns": time.time_ns(), "written": True})


def _rehash() -> bool:
    """``EGRAFT_REHASH`` set: every file hashed, nothing recorded."""
    return flag(ENV_VAR, False)


def _identity(st: os.stat_result) -> dict:
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _record_path(path: str, st: os.stat_result):
    key = hashlib.sha256(f"{os.path.realpath(path)}\0{st.st_dev}\0{st.st_ino}".encode()).hexdigest()[:32]
    return cache_root() / "hashed" / f"{key}.json"


def _read(where, seen: dict) -> str | None:
    try:
        rec = json.loads(where.read_text())
        settled = (rec.get("written") is True
                   or max(rec["mtime_ns"], rec["ctime_ns"]) < rec["hashed_from_ns"] - int(SETTLED * 1e9))
        same = all(rec.get(k) == v for k, v in seen.items())
        digest = rec["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return digest if settled and same and isinstance(digest, str) and len(digest) == 64 else None


def _write(where, rec: dict) -> None:
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = where.with_name(f"{where.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, where)
    except OSError:
        pass


__all__ = ["ENV_VAR", "SETTLED", "known_sha256", "remember_written", "sha256_file"]
