"""Load a Triton artifact: import each kernel's source and hand the launch plan to a ``TritonRunner``.

The manifest's ``launch`` section lists every buffer (model inputs, weights,
tensor constants, kernel outputs) and its ``kernels`` list the launches:
grid, ``constexprs``, warps, stages, buffers read and written.  Loading
imports each ``kernels/<name>.py`` (checked against its hash) from the
artifact directory, which ``@triton.jit`` needs as real source, and puts
weights and constants on the device once.  Calls go through
:class:`~egraft.runtime.triton_runner.TritonRunner`, the runner the Triton
backend's executable launches its kernels with.

Devices: ``cuda`` compiles the kernels with Triton's JIT on first launch;
``cpu`` runs them in Triton's interpreter, which must be chosen before triton
is first imported (``TRITON_INTERPRET=1`` in the environment).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys

import numpy as np

from ..errors import ArtifactError
from .device import parse
from .manifest import read_verified
from ..ir.tensors import to_torch, torch_dtype
from .triton_runner import TritonRunner


def interpreter_active() -> bool:
    """Whether triton was (or, not yet imported, will be) imported in interpreter mode (TRITON_INTERPRET=1)."""
    if "triton" not in sys.modules:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.sum, InterpretedFunction)


def files(manifest: dict) -> list[str]:
    """The files this loader reads (and checks) itself."""
    return [k["file"] for k in manifest["kernels"]]


def _check_mode(device: str, directory: str) -> None:
    kind = parse(device, ArtifactError).kind
    active = interpreter_active()
    if kind == "cpu" and not active:
        raise ArtifactError(f"{directory!r} holds Triton kernels, which run on 'cpu' only in Triton's interpreter: "
                            "set TRITON_INTERPRET=1 in the environment before triton is imported, or load it "
                            "with device='cuda'")
    if kind == "cuda" and active:
        raise ArtifactError("TRITON_INTERPRET=1 was set when triton was imported, so Triton kernels cannot be "
                            f"compiled for {device!r}; unset it to run on the GPU")
    if kind not in ("cpu", "cuda"):
        raise ArtifactError(f"Triton artifacts run on cuda (or cpu in the interpreter), not {device!r}")


def _import_kernel(directory: str, manifest: dict, entry: dict):
    read_verified(directory, manifest, entry["file"], keep=False)
    path = os.path.join(directory, *entry["file"].split("/"))
    digest = hashlib.sha256(f"{os.path.abspath(path)}:{manifest['files'][entry['file']]}".encode()).hexdigest()[:16]
    mod_name = f"egraft_artifact_kernels.{entry['name']}_{digest}"
    mod = sys.modules.get(mod_name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            raise ArtifactError(f"{path} could not be imported ({type(e).__name__}: {e}); it was written with triton "
                                f"{manifest['backend_versions'].get('triton')}: rebuild it with `egraft compile`") from None
        sys.modules[mod_name] = mod
    fn = getattr(mod, entry["name"], None)
    if fn is None:
        raise ArtifactError(f"{path} defines no kernel {entry['name']!r}; rebuild the artifact with `egraft compile`")
    return fn


def load(directory: str, manifest: dict, weights: list[np.ndarray], device: str) -> "TritonRunner":
    _check_mode(device, directory)
    import torch

    from .torch_runner import torch_device

    dev = torch_device(device, ArtifactError, "a Triton artifact")
    stored = {w["name"]: to_torch(a, dev, copy=False) for w, a in zip(manifest["weights"], weights)}
    launch = manifest.get("launch") or {}
    fixed, kinds = {}, {}
    for b in launch.get("buffers", ()):
        kinds[b["id"]] = b
        if b["kind"] in ("weight", "constant"):
            if b["name"] not in stored:
                raise ArtifactError(f"{directory!r}: buffer %{b['id']} needs {b['name']!r}, which the weights file "
                                    "lacks; rebuild the artifact with `egraft compile`")
            fixed[b["id"]] = stored[b["name"]]
    fns = [_import_kernel(directory, manifest, k) for k in manifest["kernels"]]
    launches = [(fn, k["reads"], k["writes"], tuple(kinds[k["writes"]]["shape"]),
                 torch_dtype(kinds[k["writes"]]["dtype"]), tuple(k["grid"]), dict(k["constexprs"]),
                 int(k["num_warps"]), int(k["num_stages"])) for fn, k in zip(fns, manifest["kernels"])]
    inputs = [nid for _, nid in sorted((b["index"], b["id"]) for b in kinds.values() if b["kind"] == "input")]
    return TritonRunner(launches, fixed, inputs, launch["outputs"], launch.get("copied_outputs", ()), dev)


__all__ = ["files", "interpreter_active", "load"]
