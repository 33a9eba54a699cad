"""Arrays derived from weights alone: made once per process, shared by every program, saved as recipes.

A compiled model binds one set of weight arrays.  What a backend computes
from weights alone when it builds a program (a folded value such as
concatenated QKV weights or an upcast copy, ``backends.fold``; a weight's
panel form, ``backends.jax.panels``) is a *derived* array.  Each is made by
a named **recipe** of :data:`RECIPES` from its **sources** (weight arrays,
or other derived arrays), and this module makes each one once:

* :func:`derived` returns the array made for the same recipe over the very
  same source arrays (by identity) if one is alive, else makes it.  An
  entry is dropped when a source is garbage-collected, so a reused ``id``
  never finds an old result, and new weight values get new derived arrays.
  The derived array itself is held weakly: it lives while a program binds
  it (an executable keeps its host arrays), so the forms a search tried and
  dropped do not stay in memory.  Derived arrays are read-only and 64-byte
  aligned, so XLA's CPU client aliases them instead of copying them.
* :func:`provenance` tells how a derived array was made (recipe, its
  parameters, its named sources), so a saved generation stores the weights
  once and each derived form as its recipe (``backends.artifact``), and
* :func:`build` remakes it at load from the stored tensors, once for all
  the programs that bind it (``runtime.load``).

A recipe is ``fn(params, *sources) -> array`` with JSON parameters.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import ArtifactError
from ..ir.tensors import aligned_copy


def _panels(params: dict, value: np.ndarray) -> np.ndarray:
    """A 2-D weight ``[K, N]`` (``[N, K]`` when ``transposed``) as panels ``[ceil(N / w), K, w]`` of ``w = width``
    columns, the last one padded with zero columns (``backends.jax.panels``)."""
    width, transposed = int(params["width"]), bool(params["transposed"])
    kn = value.T if transposed else value
    k, n = kn.shape
    j = -(-n // width)
    if j * width != n:
        kn = np.concatenate([kn, np.zeros((k, j * width - n), kn.dtype)], axis=1)
    return np.ascontiguousarray(kn.reshape(k, j, width).transpose(1, 0, 2))


def _fold(params: dict, *weights: np.ndarray) -> np.ndarray:
    """The one output of a weight-only graph (``backends.fold``) on its weights, by the reference interpreter."""
    from ..ir.evaluate import evaluate
    from ..ir.serialize import graph_from_dict

    graph = graph_from_dict(params["graph"], dict(zip(params["weights"], weights)))
    return evaluate(graph, [])[0]


def _contiguous(params: dict, value: np.ndarray) -> np.ndarray:
    """The weight in C order (a generated product reads a strided weight's rows in place only when they are)."""
    return np.ascontiguousarray(value)


RECIPES: dict[str, Callable[..., np.ndarray]] = {"panels": _panels, "fold": _fold, "contiguous": _contiguous}

_ENTRIES: dict[tuple, tuple] = {}  # key -> (weakrefs to the sources, weakref to the array, recipe, params, names)
_BY_ARRAY: dict[int, tuple] = {}  # id of a held derived array -> its key
_LOCK = threading.RLock()  # re-entrant: a weakref callback (drop) can run inside any block holding it
_MAKING: dict[tuple, threading.Lock] = {}  # key -> the lock of the thread making it now
_KEEP: dict[int, tuple] = {}  # id of a derived array -> its derived sources, held while it lives
_COUNTS = {"hits": 0, "misses": 0, "unshared": 0}


def derived(recipe: str, params: dict | Callable[[], dict], sources: Sequence[np.ndarray],
            names: Sequence[str] = (), key: object = None) -> np.ndarray:
    """The array ``RECIPES[recipe](params, *sources)``, made once while it and its sources live (module docstring).

    `params` may be a callable (made only when the array is: a fold's graph record is not small);
    `names` name the sources (for :func:`provenance`); `key` stands for the params in the cache key
    (default: their JSON)."""
    if key is None:
        key = json.dumps(params() if callable(params) else params, sort_keys=True)
    full = (recipe, key, tuple(id(s) for s in sources))
    with _LOCK:
        making = _MAKING.setdefault(full, threading.Lock())
    with making:  # one thread makes it; another asking for the same array meanwhile waits and shares it
        value = _lookup(full, sources)
        if value is None:
            value = _make(full, recipe, params, sources, names)
    with _LOCK:
        _MAKING.pop(full, None)
    return value


def _lookup(full: tuple, sources: Sequence[np.ndarray]) -> np.ndarray | None:
    with _LOCK:
        hit = _ENTRIES.get(full)
        value = hit[1]() if hit is not None else None
        if value is not None and all(r() is s for r, s in zip(hit[0], sources)):
            _COUNTS["hits"] += 1
            return value
    return None


def _make(full: tuple, recipe: str, params, sources: Sequence[np.ndarray], names: Sequence[str]) -> np.ndarray:
    p = params() if callable(params) else params
    value = aligned_copy(np.asarray(RECIPES[recipe](p, *sources)))

    def drop(ref, full=full, entries=_ENTRIES, by_array=_BY_ARRAY, keep=_KEEP, lock=_LOCK, vid=id(value)):
        with lock:  # (bound as defaults: module globals are gone at interpreter exit)
            if ref is mine:
                keep.pop(vid, None)
            e = entries.get(full)
            if e is not None and (e[1] is ref or any(r is ref for r in e[0])):
                del entries[full]
                if by_array.get(vid) == full:
                    del by_array[vid]

    try:
        refs = tuple(weakref.ref(s, drop) for s in sources)
        mine = weakref.ref(value, drop)
    except TypeError:  # a source that cannot be weakly referenced (a numpy scalar): not shared
        with _LOCK:
            _COUNTS["unshared"] += 1
        return value
    with _LOCK:
        _COUNTS["misses"] += 1
        _ENTRIES[full] = (refs, mine, recipe, p, tuple(names))
        _BY_ARRAY[id(value)] = full
        # a derived source (panels of a folded value) lives as long as this array: nothing else may hold it
        # (a loaded program binds the panels only), and its death would drop this entry
        inner = tuple(x for x in sources if id(x) in _BY_ARRAY)
        if inner:
            _KEEP[id(value)] = inner
    return value


def provenance(value: np.ndarray) -> tuple[str, dict, list[tuple[str, np.ndarray]]] | None:
    """(recipe, params, [(source name, source array)]) of a derived array this process made; None for any other."""
    with _LOCK:
        full = _BY_ARRAY.get(id(value))
        e = _ENTRIES.get(full) if full is not None else None
        if e is None or e[1]() is not value:
            return None
        sources = [r() for r in e[0]]
        if any(s is None for s in sources):
            return None
        names = e[4] if len(e[4]) == len(sources) else tuple(f"source{k}" for k in range(len(sources)))
        return e[2], e[3], list(zip(names, sources))


def build(tree: Mapping, tensor: Callable[[str], np.ndarray], where: str) -> np.ndarray:
    """Remake a derived array from its saved recipe `tree` (``{"recipe", "params": JSON text, "sources": [[name, tree]]}``,
    or ``{"tensor": key}`` read by `tensor(key)`), sharing it with every program that names the same recipe."""
    try:
        if "tensor" in tree:
            return tensor(str(tree["tensor"]))
        recipe, params = str(tree["recipe"]), dict(json.loads(tree["params"]))
        if recipe not in RECIPES:
            raise ArtifactError(f"{where}: a weight is made by recipe {recipe!r}, which this egraft does not know "
                                f"(it knows {', '.join(sorted(RECIPES))}): upgrade egraft or save the model again")
        names = [str(n) for n, _ in tree["sources"]]
        sources = [build(t, tensor, where) for _, t in tree["sources"]]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ArtifactError(f"{where}: a derived weight's recipe is malformed ({type(e).__name__}: {e}); "
                            "save the model again") from None
    try:
        return derived(recipe, params, sources, names)
    except ArtifactError:
        raise
    except Exception as e:  # a recipe that fails on these sources: the file does not hold what it says
        raise ArtifactError(f"{where}: remaking a weight by recipe {recipe!r} failed ({type(e).__name__}: {e}); "
                            "save the model again") from None


def stats() -> dict:
    """Hits and misses since the process started, and the derived arrays held now (count and bytes)."""
    with _LOCK:
        held = [v for v in (e[1]() for e in list(_ENTRIES.values())) if v is not None]
        return {**_COUNTS, "held": len(held), "held_bytes": int(sum(v.nbytes for v in held))}


__all__ = ["RECIPES", "build", "derived", "provenance", "stats"]
