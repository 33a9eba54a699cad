"""The light runtime: load an egraft artifact and call it, with nothing of the compiler imported.

::

    art = egraft.runtime.load("out/", device="cpu")   # also egraft.load
    y = art(x)                                         # numpy in, numpy out; torch in, torch out
    op = art.register_op()                             # torch.ops.egraft.<name>, one node for Dynamo

A load reads and checks the manifest (``manifest.read_manifest``), checks
each file it reads against its recorded SHA-256, reads the weights and hands
them to the loader module the manifest names (``target["loader"]``, written
from the backend's record when it was saved; a module with
``load(directory, manifest, weights, device)`` and ``files(manifest)``),
imported only then: so a JAX artifact never imports torch, and none imports
the compiler (egglog, deap, the tracer, the rewrites, the search or the
backends).  ``docs/artifacts.md`` describes the directory, the
manifest's fields and the compatibility policy.
"""

from __future__ import annotations

import os

from ..errors import ArtifactError
from . import gc_pause, outputs
from .artifact import Artifact, TensorSpec
from .device import parse
from .loaders import LEGACY_LOADERS, loader_of
from .manifest import FORMAT, FORMAT_VERSION, is_generation, read_manifest, read_verified
from .weights import WEIGHTS_FILE, check_weights, map_weights


def device_kind(device: str) -> str:
    return parse(device, ArtifactError).kind


def load(directory: str | os.PathLike, device: str = "cpu", *, shared: dict | None = None
         ) -> "Artifact | GenerationArtifact":
    """The artifact in `directory`, ready to call on `device` (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"tpu"``).

    A directory holding a saved generation (``generation.json``) loads as a
    :class:`GenerationArtifact`, whose ``generate`` runs the step programs.
    `shared`: the tensors of the generation's one weights file, for a step
    program whose manifest says ``weights_store: "shared"`` (the generation's
    loader passes them).  Python's garbage collector is paused while it loads (``runtime.gc_pause``).
    """
    with gc_pause.paused():
        return _load(directory, device, shared)


def _load(directory: str | os.PathLike, device: str, shared: dict | None) -> "Artifact | GenerationArtifact":
    directory = os.fspath(directory)
    device = str(device)
    device_kind(device)
    if is_generation(directory):  # a causal LM's step programs and caches (runtime.generation_artifact: torch)
        from . import generation_read

        started = generation_read.start(directory, device, load)  # its programs load while torch is imported
        try:
            from .generation_artifact import load_generation
        except BaseException:
            started.abandon()
            raise
        return load_generation(started)
    m = read_manifest(directory, files=False)
    outputs.check(m["output_tree"])
    if outputs.count(m["output_tree"]) != len(m["outputs"]):
        raise ArtifactError(f"{directory!r}: the manifest's output_tree takes {outputs.count(m['output_tree'])} "
                            f"tensor(s) but it lists {len(m['outputs'])} outputs; rebuild it with `egraft compile`")
    loader = loader_of(m, directory)
    used = set(loader.files(m))
    for rel in m["files"]:  # the files the loader does not read are checked here
        if rel not in used and rel != WEIGHTS_FILE:
            read_verified(directory, m, rel, keep=False)
    if m.get("weights_store") == "shared":
        if shared is None:
            raise ArtifactError(f"{directory!r} is one step program of a saved generation: its weights are in the "
                                "generation's directory above it; load that directory with egraft.load")
        path = os.path.join(os.path.dirname(os.path.abspath(directory)), WEIGHTS_FILE)
        weights = check_weights(shared, m["weights"], path)
    else:
        path = os.path.join(directory, WEIGHTS_FILE)
        if WEIGHTS_FILE not in m["files"]:
            raise ArtifactError(f"{path} is not listed in the manifest; rebuild the artifact with `egraft compile`")
        mapped = map_weights(path, m["files"][WEIGHTS_FILE], huge_pages=device_kind(device) == "cpu")
        weights = check_weights(mapped, m["weights"], path)
    runner = loader.load(directory, m, weights, device)
    return Artifact(directory, m, device, runner)


__all__ = ["Artifact", "FORMAT", "FORMAT_VERSION", "LEGACY_LOADERS", "TensorSpec", "load", "loader_of", "outputs",
           "read_manifest"]


def __getattr__(name):  # GenerationArtifact imports torch: only when asked for
    if name == "GenerationArtifact":
        from .generation_artifact import GenerationArtifact

        return GenerationArtifact
    raise AttributeError(name)
