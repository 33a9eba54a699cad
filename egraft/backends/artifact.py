"""Save an executable as an artifact directory that ``egraft.load`` (the runtime) runs.

``save_artifact(executable, directory, *, meta)`` hands the executable to the
writer its backend's record names (``Backend.writer``: a module with
``write(executable, directory, **options) -> WrittenProgram``) in a fresh
staging directory next to the target, writes the weights
(``weights.safetensors``) and then the manifest, last, with every file's hash
(``egraft.runtime.manifest``).  The manifest's ``target`` records the
record's loader module (``Backend.loader``), which ``egraft.load`` imports:
the runtime never imports the compiler to find it.  Only a finished
staging directory replaces the target, so a failed save leaves the target as
it was.

Overwriting: a missing or empty target is created; a target holding an
artifact (any egraft manifest) is replaced by two renames (old -> aside,
staged -> target) and the old one deleted; a non-empty directory that is not
an artifact is refused, so a typo cannot wipe someone's files.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field

import numpy as np

from ..errors import ArtifactError, BackendError
from ..ir import dtypes
from ..runtime import outputs
from ..runtime.derived import provenance
from ..runtime.hashed import remember_written
from ..runtime.manifest import is_artifact, write_manifest
from ..runtime.weights import WEIGHTS_FILE, write_weights
from . import get_backend, registered
from .base import Backend

META_KEYS = ("input_names", "output_tree", "model", "report", "source", "quantization")


class WeightStore:
    """The tensors of several programs, each stored once: one ``weights.safetensors`` for a saved generation.

    What a program binds is either a weight or an array derived from weights
    (folded, relaid as panels: ``runtime.derived``); derived arrays are not
    stored, their recipes are (:meth:`entry`), so the file holds the model's
    weights about once.  Programs of one compiled model bind the same weight
    arrays, so a tensor is recognised by
    identity; an equal array under the same name (a per-program conversion,
    say) is stored once too.  A different array under a name already taken
    (a folded value ``__folded_0`` means what its own program folded) gets
    a key of its own.  :meth:`add` returns the key a program's manifest names.
    """

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}  # key -> array
        self._by_id: dict[int, str] = {}
        self._seen: list[np.ndarray] = []  # every array added, held so that no id in _by_id is reused

    def entry(self, name: str, array: np.ndarray) -> dict:
        """A program's weight as its manifest names it: ``{"tensor": key}`` in this store, or, for an array derived
        from weights (``runtime.derived``), ``{"derived": recipe}`` whose sources are stored instead."""
        made = provenance(array)
        if made is None:
            return {"tensor": self.add(name, array)}
        return {"derived": self._recipe(made)}

    def _recipe(self, made) -> dict:
        recipe, params, sources = made
        out = []
        for n, a in sources:
            inner = provenance(a)
            out.append([n, {"tensor": self.add(n, a)} if inner is None else self._recipe(inner)])
        # the parameters as a JSON string of their own: a fold's graph holds -inf and nan constants, which the
        # manifest (strict JSON) refuses, and Python's json writes and reads back exactly
        return {"recipe": recipe, "params": json.dumps(params, sort_keys=True), "sources": out}

    def add(self, name: str, array: np.ndarray) -> str:
        key = self._by_id.get(id(array))
        if key is not None:
            return key
        k, key = 0, name
        while key in self.arrays:
            held = self.arrays[key]
            if held.shape == array.shape and held.dtype == array.dtype and np.array_equal(held, array):
                break
            k += 1
            key = f"{name}~{k}"
        self.arrays.setdefault(key, array)
        self._by_id[id(array)] = key
        self._seen.append(array)
        return key

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays.values()))

    def write(self, path: str) -> str:
        """Write the weights file; its SHA-256."""
        return write_weights(path, self.arrays)


@dataclass
class WrittenProgram:
    """What a backend writer produced: the per-call weights, in the program's order, and its manifest fields.

    ``fields`` holds ``target`` (device, backend, ...), ``backend_versions``
    and ``kernels``; the writer has written the files its kernels name.
    """

    weights: dict[str, np.ndarray]
    fields: dict = field(default_factory=dict)


def _check_meta(meta: dict, ex) -> dict:
    unknown = sorted(set(meta) - set(META_KEYS))
    if unknown:
        raise ArtifactError(f"unknown meta key(s) {unknown}; save_artifact takes {', '.join(META_KEYS)}")
    names = list(meta.get("input_names") or ex.graph.input_names())
    if len(names) != len(ex.graph.input_ids):
        raise ArtifactError(f"meta['input_names'] has {len(names)} name(s), the program takes "
                            f"{len(ex.graph.input_ids)} input(s)")
    n_out = len(ex.graph.outputs)
    tree = meta.get("output_tree") or outputs.flat_tree(n_out)
    outputs.check(tree, "meta['output_tree']")
    if outputs.count(tree) != n_out:
        raise ArtifactError(f"meta['output_tree'] takes {outputs.count(tree)} tensor(s), the program returns {n_out}")
    try:
        json.dumps(meta.get("report") or {}, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"meta['report'] is not plain JSON ({e}); pass SearchResult.summary(), "
                            "which is cleaned for JSON") from None
    return {"input_names": names, "output_tree": tree}


def _record(executable) -> Backend:
    """The record of `executable`'s backend, which must name an artifact writer."""
    name = getattr(executable, "backend", None)
    if not isinstance(name, str):
        raise BackendError(f"cannot save {type(executable).__name__}: save_artifact takes an executable "
                           "(egraft.backends.lower's result)")
    rec = get_backend(name)
    if rec.writer is None:
        savable = sorted(n for n, b in registered().items() if b.writer)
        raise BackendError(f"cannot save an executable of backend {name!r}: its record names no artifact writer "
                           f"(Backend.writer / loader); backends that save: {', '.join(savable)}")
    return rec


def _manifest(ex, meta: dict, checked: dict, written: WrittenProgram, loader: str, keys: dict | None) -> dict:
    g = ex.graph
    m = {"model": str(meta.get("model") or "model")}
    if meta.get("source"):
        m["source"] = str(meta["source"])
    m.update(written.fields)
    m["target"] = {**m.get("target", {}), "loader": loader}
    m["knobs"] = {k: list(v) if isinstance(v, tuple) else v for k, v in ex.knobs.items()}
    m["graph_hash"] = g.structural_hash()
    sig = g.signature  # the manifest's inputs and aliases are the program's signature (runtime.manifest_signature)
    rename = dict(zip([s.name for s in sig.call_inputs], checked["input_names"]))
    m["inputs"] = [{"name": rename.get(s.name, s.name), "role": s.role, "shape": list(s.shape), "dtype": s.dtype,
                    **({"source": s.source} if s.source else {})} for s in sig.run_inputs]  # the state last
    m["aliases"] = [{"output": k, "input": rename.get(n, n)} for k, n in sig.aliases]
    m["outputs"] = [{"shape": list(s), "dtype": d} for s, d in g.output_types()]
    m["output_tree"] = checked["output_tree"]
    m["weights"] = [{"name": n, "shape": list(a.shape), "dtype": dtypes.from_numpy(a.dtype),
                     **(keys[n] if keys is not None else {})} for n, a in written.weights.items()]
    if keys is not None:  # the tensors live in the enclosing directory's shared file (runtime.load's `shared`)
        m["weights_store"] = "shared"
    m["report"] = meta.get("report") or {}
    if meta.get("quantization"):  # what egraft.compile(quantize=...) did to the model (frontend.quantize's report)
        m["quantization"] = dict(meta["quantization"])
    return m


def _prepare_target(directory: str) -> None:
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ArtifactError(f"{directory!r} is a file; an artifact is saved as a directory: choose another path")
    if os.path.isdir(directory) and os.listdir(directory) and not is_artifact(directory):
        raise ArtifactError(f"{directory!r} is a non-empty directory that does not hold an egraft artifact; "
                            "egraft will not overwrite it: choose a new or empty directory")


def commit_staged(staging: str, directory: str) -> None:
    """Move the finished `staging` directory to `directory`, replacing an artifact there: the old one is moved
    aside, put back if the second rename fails, and deleted once the new one is in place (every artifact writer's
    last step: a program's here, a generation's in ``api.generation_artifact``)."""
    if not os.path.exists(directory):
        os.rename(staging, directory)
        return
    if not os.listdir(directory):
        os.rmdir(directory)
        os.rename(staging, directory)
        return
    aside = tempfile.mkdtemp(dir=os.path.dirname(directory), prefix=f".{os.path.basename(directory)}.old-")
    os.rmdir(aside)
    os.rename(directory, aside)
    try:
        os.rename(staging, directory)
    except BaseException:
        os.rename(aside, directory)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def save_artifact(executable, directory: str | os.PathLike, *, meta: dict | None = None,
                  store: WeightStore | None = None, **options) -> str:
    """Write `executable` to `directory` (see the module docstring); returns the directory's path.

    `meta` keys: ``input_names``, ``output_tree`` (from
    ``egraft.runtime.outputs.describe(model_output)``; default: a list of the
    outputs), ``model`` (a display name), ``report`` (JSON-able), ``source``.
    `options` go to the backend's writer (JAX: ``platforms``; Triton: ``ptx_archs``).
    With a `store`, the weights go to it (the caller writes it once for several programs) and the
    manifest names each weight's tensor there, or the recipe of a derived one (``weights_store:
    "shared"``), instead of writing ``weights.safetensors`` in `directory`.
    """
    rec = _record(executable)
    checked = _check_meta(dict(meta or {}), executable)
    directory = os.path.abspath(os.fspath(directory))
    _prepare_target(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(directory)}.tmp-")
    try:
        written = importlib.import_module(rec.writer).write(executable, staging, **options)
        known, keys = {}, None
        if store is None:
            known[WEIGHTS_FILE] = write_weights(os.path.join(staging, WEIGHTS_FILE), written.weights)
            weights_stat = os.stat(os.path.join(staging, WEIGHTS_FILE))
        else:
            keys = {n: store.entry(n, a) for n, a in written.weights.items()}
        write_manifest(staging, _manifest(executable, dict(meta or {}), checked, written, rec.loader, keys), known)
        os.chmod(staging, 0o755)  # mkdtemp makes it private; an artifact is as readable as any directory
        commit_staged(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if store is None:  # the first load reads the hash the write computed (runtime.hashed)
        remember_written(os.path.join(directory, WEIGHTS_FILE), known[WEIGHTS_FILE], weights_stat)
    return directory


__all__ = ["META_KEYS", "WeightStore", "WrittenProgram", "commit_staged", "save_artifact"]
