"""Write a compiled generation as a directory ``egraft.load`` runs (the layout: ``runtime.generation_artifact``).

Each bucket's program is saved as an artifact under ``Bucket.name``
(``step_<T>_ctx<C>_rows<r>/``; ``backends.artifact.save_artifact``, which declares the caches as inputs of
role ``state`` with their aliases), its weights named in one ``weights.safetensors`` beside them that holds
every tensor once (``backends.artifact.WeightStore``); ``generation.json`` is written last, into
a staging directory that replaces the target only when complete, so a failed
save leaves the target as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from ..errors import ArtifactError
from ..runtime.generation_artifact import FORMAT, FORMAT_VERSION, GENERATION_FILE, is_generation, spec_to_dict
from ..runtime.hashed import remember_written
from ..runtime.manifest import is_artifact


def save_generation(generation, directory: str, *, model: str) -> str:
    """Write `generation` (an ``api.generation.Generation``) to `directory`; returns its path."""
    from ..backends.artifact import WeightStore, commit_staged, save_artifact
    from ..runtime.weights import WEIGHTS_FILE

    directory = os.path.abspath(os.fspath(directory))
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ArtifactError(f"{directory!r} is a file; save a generation to a directory")
    if os.path.isdir(directory) and os.listdir(directory) and not (is_generation(directory) or is_artifact(directory)):
        raise ArtifactError(f"{directory!r} is a non-empty directory that holds no egraft artifact; "
                            "save to a new or empty directory (nothing was written)")
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".egraft-gen-", dir=parent)
    try:
        programs = {}
        store = WeightStore()
        for b, prog in sorted(generation.programs.items()):
            save_artifact(prog.executable, os.path.join(stage, b.name), store=store,
                          meta={"model": f"{model} step x{b.chunk} of {b.rows} row(s) reading {b.context} slots",
                                "input_names": list(prog.input_names)})
            programs[b.name] = {"chunk": b.chunk, "context": b.context, "rows": b.rows}
        weights_sha = store.write(os.path.join(stage, WEIGHTS_FILE))
        weights_stat = os.stat(os.path.join(stage, WEIGHTS_FILE))
        doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": model,
               "spec": spec_to_dict(generation.spec), "programs": programs,
               "weights": {"file": WEIGHTS_FILE, "sha256": weights_sha,
                           "tensors": len(store.arrays), "bytes": store.nbytes},
               "compiled": generation.describe()}
        with open(os.path.join(stage, GENERATION_FILE), "w") as f:
            json.dump(doc, f, indent=1)
        commit_staged(stage, directory)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    remember_written(os.path.join(directory, WEIGHTS_FILE), weights_sha, weights_stat)  # (runtime.hashed)
    return directory


__all__ = ["save_generation"]
