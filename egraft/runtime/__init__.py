"""The light runtime: load an egraft artifact and call it, with nothing of the compiler imported.

::

    art = egraft.runtime.load("out/", device="cpu")   # also egraft.load
    y = art(x)                                         # numpy in, numpy out; torch in, torch out
    op = art.register_op()                             # torch.ops.egraft.<name>, one node for Dynamo

A load reads and checks the manifest (``manifest.read_manifest``), checks
each file it reads against its recorded SHA-256, reads the weights and hands
them to the loader of the artifact's backend, imported only then (so a JAX
artifact never imports torch, and none imports egglog, deap, the tracer, the
rewrites or the search).  ``docs/artifacts.md`` describes the directory, the
manifest's fields and the compatibility policy.
"""

from __future__ import annotations

import importlib
import os

from ..errors import ArtifactError
from . import outputs
from .artifact import Artifact, TensorSpec
from .manifest import FORMAT, FORMAT_VERSION, read_manifest, read_verified
from .weights import WEIGHTS_FILE, check_weights, parse_weights

# backend name -> the module whose ``load(directory, manifest, weights, device)`` returns a runner
LOADERS = {"jax": "egraft.runtime.jax_loader", "torch": "egraft.runtime.torch_loader",
           "triton": "egraft.runtime.triton_loader"}


def device_kind(device: str) -> str:
    kind = str(device).split(":")[0]
    if kind not in ("cpu", "cuda", "tpu"):
        raise ArtifactError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'tpu'")
    return kind


def load(directory: str | os.PathLike, device: str = "cpu") -> Artifact:
    """The artifact in `directory`, ready to call on `device` (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"tpu"``)."""
    directory = os.fspath(directory)
    device = str(device)
    device_kind(device)
    m = read_manifest(directory, files=False)
    outputs.check(m["output_tree"])
    if outputs.count(m["output_tree"]) != len(m["outputs"]):
        raise ArtifactError(f"{directory!r}: the manifest's output_tree takes {outputs.count(m['output_tree'])} "
                            f"tensor(s) but it lists {len(m['outputs'])} outputs; rebuild it with `egraft compile`")
    backend = m["target"].get("backend")
    if backend not in LOADERS:
        raise ArtifactError(f"{directory!r} is for backend {backend!r}, which this egraft cannot load "
                            f"(it loads {', '.join(LOADERS)}): upgrade egraft")
    loader = importlib.import_module(LOADERS[backend])
    used = set(loader.files(m))
    for rel in m["files"]:  # the files the loader does not read are checked here
        if rel not in used and rel != WEIGHTS_FILE:
            read_verified(directory, m, rel, keep=False)
    path = os.path.join(directory, WEIGHTS_FILE)
    weights = check_weights(parse_weights(read_verified(directory, m, WEIGHTS_FILE), path), m["weights"], path)
    runner = loader.load(directory, m, weights, device)
    return Artifact(directory, m, device, runner)


__all__ = ["Artifact", "FORMAT", "FORMAT_VERSION", "LOADERS", "TensorSpec", "load", "outputs", "read_manifest"]
