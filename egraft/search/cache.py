"""The search-result cache: results on disk, so a second search of the same program is instant.

An entry is one JSON file, ``<root>/<digest>.json``, where the digest is the
sha256 of a :class:`CacheKey`'s canonical JSON: the program's structural hash,
the device, the backend, the knobs and the versions of the libraries that
shape the result.  A new version of any of them is a different key, so stale
entries are never read (``Cache.clear`` removes them).

The cache never makes a compile fail:

* a write goes to a temporary file in the same directory, is fsynced and then
  ``os.replace``-d into place, under a ``filelock.FileLock`` on
  ``<digest>.lock``, so concurrent writers of one key cannot interleave and a
  reader sees either the old complete file or the new complete file;
* a corrupt entry (bad JSON, truncated, another key inside, another format
  version) is a miss with a :class:`CacheWarning` naming the file, and the next
  ``put`` rewrites it;
* a cache directory that cannot be written gives one warning and the cache
  then works as a no-op.

The root is ``$EGRAFT_CACHE_DIR`` if set, else ``platformdirs.user_cache_dir("egraft")``.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock

__all__ = [
    "ENV_VAR",
    "FORMAT",
    "VERSIONED_LIBRARIES",
    "Cache",
    "CacheKey",
    "CacheWarning",
    "Entry",
    "cache_root",
    "default_cache",
    "device_id",
    "library_versions",
]

from ..runtime.xla_cache import ENV_VAR, cache_root  # noqa: E402 - the one cache root
FORMAT = 1  # the entry file layout; bump it when the layout changes (old entries become misses)
VERSIONED_LIBRARIES = ("egraft", "torch", "jax", "jaxlib", "triton", "egglog")
LOCK_TIMEOUT_S = 60.0

_SUFFIX = ".json"
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR}


class CacheWarning(UserWarning):
    """The result cache skipped something (a corrupt entry, an unwritable directory); the compile goes on."""


@functools.cache
def library_versions() -> tuple[tuple[str, str | None], ...]:
    """``(name, version)`` of each library in ``VERSIONED_LIBRARIES``; None where it is not installed.

    Read once per process from the installed distributions' metadata (nothing is imported).
    """
    out = []
    for name in VERSIONED_LIBRARIES:
        try:
            out.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            out.append((name, None))
    return tuple(out)


def device_id(device: str, name: str | None = None) -> str:
    """A device as it goes into a key: its kind plus the hardware name, without the index.

    ``device_id("cuda:0", "NVIDIA H200") == "cuda/NVIDIA H200"``; ``device_id("cpu") == "cpu"``.
    Two GPUs of one model share entries; different models do not.
    """
    kind = str(device).split(":", 1)[0].strip().lower()
    return f"{kind}/{name.strip()}" if name else kind


def _canonical(obj: Any, allow_nan: bool = False) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=allow_nan)


@dataclass(frozen=True)
class CacheKey:
    """What a cached result depends on.  Any field that differs is a different entry.

    ``knobs`` may be a mapping or an already canonical JSON string; it is stored
    as canonical JSON (sorted keys), so ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}``
    are one key.  ``versions`` defaults to :func:`library_versions`.
    """

    program: str
    device: str
    backend: str
    knobs: str | Mapping[str, Any] | None = None
    versions: tuple[tuple[str, str | None], ...] = field(default_factory=library_versions)

    def __post_init__(self) -> None:
        for name in ("program", "device", "backend"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise TypeError(f"CacheKey.{name} must be a non-empty string, got {getattr(self, name)!r}")
        knobs = self.knobs
        if knobs is not None:
            if isinstance(knobs, str):
                knobs = json.loads(knobs)
            object.__setattr__(self, "knobs", _canonical(knobs))
        object.__setattr__(self, "versions", tuple(sorted((str(k), v) for k, v in dict(self.versions).items())))

    def fields(self) -> dict[str, Any]:
        """The key as plain JSON values (what an entry file stores and is checked against)."""
        return {
            "program": self.program,
            "device": self.device,
            "backend": self.backend,
            "knobs": self.knobs,
            "versions": {k: v for k, v in self.versions},
        }

    def canonical(self) -> str:
        return _canonical(self.fields())

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One readable entry in a cache directory (``Cache.entries``)."""

    path: Path
    digest: str
    created: float
    key: dict[str, Any]


# roots already warned about as unwritable, so each gets one warning per process
_warned_roots: set[str] = set()
_warned_lock = threading.Lock()


class Cache:
    """Search results on disk, one JSON file per :class:`CacheKey`."""

    def __init__(self, root: str | os.PathLike[str] | None = None):
        self.root = Path(root).expanduser() if root is not None else cache_root()
        self.disabled = False  # set once the directory proved unwritable

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r}{', disabled' if self.disabled else ''})"

    def path(self, key: CacheKey) -> Path:
        """Where the entry of ``key`` lives (whether or not it exists)."""
        return self.root / f"{key.digest}{_SUFFIX}"

    # -- reading ---------------------------------------------------------------------------------

    def get(self, key: CacheKey) -> dict[str, Any] | None:
        """The value stored for ``key``, or None on a miss (absent, corrupt, another key, old format)."""
        path = self.path(key)
        doc = self._load(path, warn=True)
        if doc is None:
            return None
        if doc["key"] != json.loads(key.canonical()) or doc["digest"] != key.digest:
            _warn(f"egraft cache entry {path} holds another key than the one asked for; treated as a miss "
                  "and rewritten by the next put")
            return None
        return doc["value"]

    def _load(self, path: Path, *, warn: bool) -> dict[str, Any] | None:
        try:
            text = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if warn:
                _warn(f"egraft cache entry {path} cannot be read ({exc}); treated as a miss")
            return None
        problem = None
        try:
            doc = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            doc, problem = None, f"not valid JSON ({exc.__class__.__name__}: {exc})"
        if problem is None:
            problem = _shape_problem(doc)
        if problem is not None:
            if warn:
                _warn(f"egraft cache entry {path} is corrupt ({problem}); treated as a miss and rewritten "
                      "by the next put")
            return None
        return doc

    def entries(self) -> list[Entry]:
        """The readable entries, oldest first (corrupt or foreign files are left out)."""
        out = []
        try:
            paths = sorted(self.root.glob(f"*{_SUFFIX}"))
        except OSError:
            return []
        for path in paths:
            doc = self._load(path, warn=False)
            if doc is not None and path.stem == doc["digest"]:
                out.append(Entry(path=path, digest=doc["digest"], created=doc["created"], key=doc["key"]))
        return sorted(out, key=lambda e: (e.created, e.digest))

    # -- writing ---------------------------------------------------------------------------------

    def put(self, key: CacheKey, value: Mapping[str, Any]) -> Path:
        """Store ``value`` (a JSON-serialisable dict) under ``key``; returns the entry's path.

        Raises TypeError/ValueError only for a value that is not JSON (a caller bug).  Any
        failure to write (unwritable directory, full disk, lock timeout) warns and leaves the
        cache as it was; an unwritable directory turns this cache into a no-op.
        """
        if not isinstance(value, Mapping):
            raise TypeError(f"a cache value must be a dict, got {type(value).__name__}")
        path = self.path(key)
        doc = {
            "format": FORMAT,
            "digest": key.digest,
            "created": time.time(),
            "key": key.fields(),
            "value": dict(value),
        }
        # a non-JSON value raises here, before anything is touched; non-finite floats are kept as Python's
        # json writes them, because a program record holds inf/nan constants that way (egraft.ir.serialize)
        data = _canonical(doc, allow_nan=True).encode()
        if self.disabled:
            return path
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._disable(exc)
            return path
        try:
            with filelock.FileLock(str(self.root / f"{key.digest}.lock"), timeout=LOCK_TIMEOUT_S):
                _atomic_write(path, data)
        except filelock.Timeout:
            _warn(f"egraft cache: the lock on {path} was held for over {LOCK_TIMEOUT_S:.0f} s; result not cached")
        except OSError as exc:
            if exc.errno in _UNWRITABLE or not os.access(self.root, os.W_OK):
                self._disable(exc)
            else:  # a passing failure (full disk, a file held open elsewhere): this result is not cached
                _warn(f"egraft cache: could not write {path} ({exc}); result not cached")
        return path

    def _disable(self, exc: BaseException) -> None:
        self.disabled = True
        root = str(self.root)
        with _warned_lock:
            if root in _warned_roots:
                return
            _warned_roots.add(root)
        _warn(f"egraft cache directory {root} cannot be written ({exc}); search results will not be cached. "
              f"Set {ENV_VAR} to a writable directory to cache them.")

    def clear(self) -> int:
        """Remove every entry, lock and leftover temporary file of this cache; returns how many files."""
        removed = 0
        try:
            paths = [*self.root.glob(f"*{_SUFFIX}"), *self.root.glob("*.lock"), *self.root.glob(".*.tmp")]
        except OSError:
            return 0
        for p in paths:
            try:
                p.unlink()
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                _warn(f"egraft cache: could not remove {p} ({exc})")
        return removed


def _shape_problem(doc: Any) -> str | None:
    """Why ``doc`` is not an entry of this format, or None when it is one."""
    if not isinstance(doc, dict):
        return f"top level is {type(doc).__name__}, not an object"
    if doc.get("format") != FORMAT:
        return f"format {doc.get('format')!r}, this egraft reads format {FORMAT}"
    for name, typ in (("digest", str), ("created", (int, float)), ("key", dict), ("value", dict)):
        if not isinstance(doc.get(name), typ):
            return f"field {name!r} missing or of the wrong type"
    return None


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable; not possible everywhere, and not needed for correctness
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=3)


_default: dict[Path, Cache] = {}


def default_cache() -> Cache:
    """The cache at :func:`cache_root` (one object per root, so an unwritable root warns once)."""
    root = cache_root()
    cache = _default.get(root)
    if cache is None:
        cache = _default.setdefault(root, Cache(root))
    return cache
