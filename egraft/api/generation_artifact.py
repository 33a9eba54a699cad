"""Write a compiled generation as a directory ``egraft.load`` runs (the layout: ``runtime.generation_artifact``).

Each chunk size's program is saved as an ordinary artifact under ``step_<T>/``
(``backends.artifact.save_artifact``, which declares the caches as inputs of
role ``state`` with their aliases); ``generation.json`` is written last, into
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
from ..runtime.manifest import is_artifact


def save_generation(generation, directory: str, *, model: str) -> str:
    """Write `generation` (an ``api.generation.Generation``) to `directory`; returns its path."""
    from ..backends.artifact import save_artifact

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
        def save_each(programs: dict, key, rel, what) -> dict:
            """Each program as an artifact under `stage`/rel(k); generation.json's map key(k) -> rel(k)."""
            out = {}
            for k, prog in sorted(programs.items()):
                save_artifact(prog.executable, os.path.join(stage, rel(k)),
                              meta={"model": f"{model} {what(k)}", "input_names": list(prog.input_names)})
                out[key(k)] = rel(k)
            return out

        steps = save_each(generation.programs, str, lambda t: f"step_{t}", lambda t: f"step x{t}")
        decoders = save_each(generation.decoders, str, lambda c: f"decode_{c}", lambda c: f"decode reading {c} slots")
        row_programs = save_each(generation.row_programs, lambda k: f"{k[0]}x{k[1]}",
                                 lambda k: f"step_{k[0]}_rows{k[1]}", lambda k: f"step x{k[0]} of {k[1]} row(s)")
        doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": model,
               "spec": spec_to_dict(generation.spec), "steps": steps, "decoders": decoders,
               "row_programs": row_programs, "compiled": generation.describe()}
        with open(os.path.join(stage, GENERATION_FILE), "w") as f:
            json.dump(doc, f, indent=1)
        if os.path.isdir(directory):
            aside = directory + ".old-" + os.path.basename(stage)
            os.rename(directory, aside)
            os.rename(stage, directory)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(stage, directory)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return directory


__all__ = ["save_generation"]
