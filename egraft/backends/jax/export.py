"""Serialise a JAX executable as StableHLO (cpu / cuda / tpu) plus its weights, and load it back.

Directory layout written by :func:`export_executable`::

    manifest.json        format, version, platforms, x64, input/output/weight types, file hashes
    program.stablehlo    jax.export serialisation of fn(weights, *inputs)
    weights.npz          the per-call weights (folded values included), keys w0, w1, ...

The program takes the weights as arguments (whatever the executable's
``weights`` knob), so one serialised program fits any weight values and the
artifact stays small.  Lowering for a platform needs no device of that kind,
so a CPU-only machine writes artifacts for GPUs and TPUs.

Loading (:func:`load_exported`) needs only jax, numpy and ``egraft.errors``
(no tracing, egglog or deap): the runtime builds on it.  Every file is
checked against the manifest's SHA-256; a missing or corrupt file is an
``ArtifactError`` naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Sequence

import jax
import numpy as np

from ...errors import ArtifactError, InputError

FORMAT = "egraft-jax-export"
VERSION = 1
PROGRAM_FILE = "program.stablehlo"
WEIGHTS_FILE = "weights.npz"
MANIFEST_FILE = "manifest.json"
DEFAULT_PLATFORMS = ("cpu", "cuda", "tpu")

# dtypes numpy's .npz cannot name: stored as raw unsigned ints of the same width
_RAW = {"bfloat16": np.uint16}


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _scope(x64: bool):
    return jax.enable_x64(True) if x64 else contextlib.nullcontext()


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export_executable(ex, directory: str, platforms: Sequence[str] = DEFAULT_PLATFORMS) -> str:
    """Write `ex` (a JaxExecutable) to `directory` as StableHLO for `platforms`; returns the directory."""
    from ...errors import BackendError

    bad = [p for p in platforms if p not in DEFAULT_PLATFORMS]
    if bad or not platforms:
        raise BackendError(f"cannot export for platform(s) {bad or platforms}; choose from {', '.join(DEFAULT_PLATFORMS)}")
    prog = ex.program
    os.makedirs(directory, exist_ok=True)
    with _scope(prog.x64):
        host = prog.host_weights()
        wspecs = tuple(jax.ShapeDtypeStruct(w.shape, w.dtype) for w in host)
        specs = [jax.ShapeDtypeStruct(s, d) for s, d in ex._in_types]
        try:
            exported = jax.export.export(jax.jit(prog.fn), platforms=list(platforms))(wspecs, *specs)
            blob = exported.serialize()
        except Exception as e:
            raise BackendError(f"jax.export failed for platforms {list(platforms)}: {type(e).__name__}: {e}") from e
    with open(os.path.join(directory, PROGRAM_FILE), "wb") as f:
        f.write(blob)
    arrays = {}
    for k, w in enumerate(host):
        name = w.dtype.name
        arrays[f"w{k}"] = np.ascontiguousarray(w).view(_RAW[name]) if name in _RAW else w
    np.savez(os.path.join(directory, WEIGHTS_FILE), **arrays)
    main = prog.graph
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "platforms": list(platforms),
        "x64": prog.x64,
        "inputs": [{"name": n, "shape": list(s), "dtype": d, "program_dtype": np.dtype(pd).name}
                   for n, (s, d), (_, pd) in zip(main.input_names(), main.input_types(), ex._in_types)],
        "outputs": [{"shape": list(s), "dtype": d} for s, d in main.output_types()],
        "weights": [{"name": n, "shape": list(w.shape), "dtype": w.dtype.name} for n, w in zip(prog.weight_names, host)],
        "knobs": {k: v for k, v in ex.knobs.items()},
        "graph_hash": ex.graph.structural_hash(),
        "sha256": {f: _sha256(os.path.join(directory, f)) for f in (PROGRAM_FILE, WEIGHTS_FILE)},
    }
    with open(os.path.join(directory, MANIFEST_FILE), "w") as f:
        json.dump(manifest, f, indent=1)
    return directory


class ExportedProgram:
    """A loaded export: call it on numpy arrays (numpy out) or use ``run_jax`` on jax arrays."""

    def __init__(self, directory: str, manifest: dict, exported, weights: list, device):
        self.directory = directory
        self.manifest = manifest
        self.exported = exported
        self.device = device
        self.x64 = bool(manifest["x64"])
        with _scope(self.x64):
            self.weights = tuple(jax.device_put(w, device) for w in weights)
            self._call = jax.jit(exported.call)

    def input_names(self) -> list[str]:
        return [i["name"] for i in self.manifest["inputs"]]

    def run_jax(self, inputs: Sequence) -> list:
        with _scope(self.x64):
            return list(self._call(self.weights, *inputs))

    def __call__(self, *inputs) -> list[np.ndarray]:
        spec = self.manifest["inputs"]
        if len(inputs) != len(spec):
            raise InputError(f"the exported program takes {len(spec)} input(s) "
                             f"({', '.join(self.input_names())}), got {len(inputs)}")
        xs = []
        for s, x in zip(spec, inputs):
            a = np.asarray(x)
            if list(a.shape) != s["shape"]:
                raise InputError(f"input {s['name']!r} has shape {tuple(a.shape)}, expected {tuple(s['shape'])}")
            if a.dtype != _np_dtype(s["dtype"]):
                raise InputError(f"input {s['name']!r} has dtype {a.dtype}, expected {s['dtype']}")
            if s["program_dtype"] != s["dtype"]:  # int64 held as int32
                if a.size and (a.min() < -(2**31) or a.max() > 2**31 - 1):
                    raise InputError(f"input {s['name']!r} holds values outside the int32 range")
                a = a.astype(s["program_dtype"])
            xs.append(a)
        with _scope(self.x64):
            outs = self._call(self.weights, *[jax.device_put(a, self.device) for a in xs])
            res = []
            for o, s in zip(outs, self.manifest["outputs"]):
                a = np.asarray(o)
                want = _np_dtype(s["dtype"])
                res.append(a if a.dtype == want else a.astype(want))
            return res


def _read_manifest(directory: str) -> dict:
    path = os.path.join(directory, MANIFEST_FILE)
    if not os.path.isfile(path):
        raise ArtifactError(f"{path} is missing: {directory!r} is not an exported JAX program "
                            "(write one with egraft.backends.jax.export.export_executable)")
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path} is corrupt ({e}); export the program again") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not an egraft JAX export manifest (format {m.get('format') if isinstance(m, dict) else None!r})")
    if m.get("version") != VERSION:
        raise ArtifactError(f"{path} has format version {m.get('version')!r}; this egraft reads version {VERSION}. "
                            "Export the program again with this version")
    for key in ("platforms", "x64", "inputs", "outputs", "weights", "sha256"):
        if key not in m:
            raise ArtifactError(f"{path} lacks the field {key!r}; export the program again")
    return m


def _checked_file(directory: str, name: str, manifest: dict) -> str:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise ArtifactError(f"{path} is missing from the exported program; copy the whole directory")
    want = manifest["sha256"].get(name)
    if want is None or _sha256(path) != want:
        raise ArtifactError(f"{path} is corrupt (its SHA-256 differs from the manifest's); export the program again")
    return path


def load_exported(directory: str, device: str = "cpu") -> ExportedProgram:
    """Deserialise an export written by :func:`export_executable` and bind its weights on `device`."""
    m = _read_manifest(directory)
    kind = str(device).split(":")[0]
    platform = {"cpu": "cpu", "cuda": "cuda", "tpu": "tpu"}.get(kind)
    if platform is None:
        raise ArtifactError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'tpu'")
    if platform not in m["platforms"]:
        raise ArtifactError(f"{directory!r} was exported for {m['platforms']}, not for {platform}; "
                            f"export it again with platforms including {platform!r}")
    prog_path = _checked_file(directory, PROGRAM_FILE, m)
    w_path = _checked_file(directory, WEIGHTS_FILE, m)
    with open(prog_path, "rb") as f:
        blob = f.read()
    try:
        with _scope(bool(m["x64"])):
            exported = jax.export.deserialize(bytearray(blob))
    except Exception as e:
        raise ArtifactError(f"{prog_path} could not be deserialised ({type(e).__name__}: {e}); "
                            "it may come from an incompatible jax version: export it again") from None
    try:
        with np.load(w_path, allow_pickle=False) as z:
            weights = []
            for k, spec in enumerate(m["weights"]):
                a = z[f"w{k}"]
                if spec["dtype"] in _RAW:
                    a = a.view(_np_dtype(spec["dtype"]))
                if list(a.shape) != spec["shape"] or a.dtype != _np_dtype(spec["dtype"]):
                    raise ArtifactError(f"{w_path}: weight {spec['name']!r} is {a.shape}:{a.dtype}, "
                                        f"the manifest says {tuple(spec['shape'])}:{spec['dtype']}")
                weights.append(a)
    except ArtifactError:
        raise
    except Exception as e:
        raise ArtifactError(f"{w_path} could not be read ({type(e).__name__}: {e}); export the program again") from None
    try:
        idx = int(str(device).split(":")[1]) if ":" in str(device) else 0
        dev = jax.devices({"cuda": "gpu"}.get(platform, platform))[idx]
    except (RuntimeError, IndexError) as e:
        raise ArtifactError(f"device {device!r} is not available to JAX here ({e})") from None
    return ExportedProgram(directory, m, exported, weights, dev)


__all__ = ["DEFAULT_PLATFORMS", "ExportedProgram", "export_executable", "load_exported"]
