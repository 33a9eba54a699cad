"""A saved generation: the step programs of a causal LM and their KV caches, run by the light runtime.

The directory ``CompiledModel.save`` writes for a model compiled with
``max_batch`` / ``max_length``::

    generation.json          what the steps were built for (spec), each program's bucket and directory, and
                             the weights file's SHA-256
    weights.safetensors      every tensor any program binds, once (memory-mapped at load, shared by all)
    step_1_ctx640_rows4/ ... one artifact per bucket (``runtime.step_spec.Bucket``: chunk size,
                             cache slots read, rows computed); each manifest lists the caches as inputs of
                             role ``state``, each aliased by the output that holds its new value (shape,
                             dtype and aliasing are the manifest's), and names each of its weights'
                             tensor in the shared file (``weights_store: "shared"``)

(format version 2 held a weights file in each program's directory, version 1 also listed ``steps``,
``decoders`` and ``row_programs`` under three keys; both still load.)

``egraft.load(dir)`` starts the programs' loads first (``runtime.generation_read``,
which imports no torch, so they overlap this module's import of it) and
returns a :class:`GenerationArtifact` whose
``generate`` takes transformers' arguments and runs ``runtime.generation``:
no transformers, egglog or deap is imported.  The caches are allocated once
at load (zeros, of the shapes the manifests declare) and updated in place
by every step; the program of each size is checked at load to declare the
same caches.  The weights are mapped once and every program binds the
same arrays, so a loaded generation costs about its weights' size in
memory, however many programs it holds.
"""

from __future__ import annotations

from ..errors import ArtifactError, InputError
from . import generation as gen
from .generation_read import FORMAT, FORMAT_VERSION, Started
from .generation_runtime import GenerationRuntime, RunsGeneration
from .manifest import GENERATION_FILE, is_generation
from .sampling import Sampling
from .step_program import step_program


def spec_to_dict(spec: gen.StepSpec) -> dict:
    d = spec.defaults
    return {"max_batch": spec.max_batch, "max_length": spec.max_length, "chunks": list(spec.chunks),
            "contexts": list(spec.contexts), "rows": list(spec.rows), "max_context": spec.max_context,
            "vocab_size": spec.vocab_size, "filler_token": spec.filler_token,
            "state": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in spec.state],
            "defaults": {"do_sample": d.do_sample, "temperature": d.temperature, "top_k": d.top_k, "top_p": d.top_p,
                         "eos_token_id": None if d.eos_token_id is None else list(d.eos_token_id),
                         "pad_token_id": d.pad_token_id}}


def spec_from_dict(d: dict, where: str) -> gen.StepSpec:
    try:
        dflt = dict(d["defaults"])
        if dflt.get("eos_token_id") is not None:
            dflt["eos_token_id"] = tuple(int(t) for t in dflt["eos_token_id"])
        return gen.StepSpec(max_batch=int(d["max_batch"]), max_length=int(d["max_length"]),
                            chunks=tuple(int(c) for c in d["chunks"]), vocab_size=int(d["vocab_size"]),
                            state=tuple(gen.StateSpec(s["name"], tuple(int(n) for n in s["shape"]), str(s["dtype"]))
                                        for s in d["state"]),
                            defaults=Sampling(**dflt), filler_token=int(d.get("filler_token", 0)),
                            contexts=tuple(int(c) for c in d.get("contexts", ())),
                            rows=tuple(int(r) for r in d.get("rows", ())), max_context=int(d.get("max_context", 0)))
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{where}: the step spec is incomplete or malformed ({type(e).__name__}: {e}); "
                            "save the model again with CompiledModel.save") from None


def artifact_program(art, spec: gen.StepSpec, where: str):
    """A loaded step artifact as the runtime's program, after checking it declares the spec's caches."""
    m = art.manifest
    states = [i for i in m["inputs"] if i.get("role") == "state"]
    want = [(s.name, list(s.shape), s.dtype) for s in spec.state]
    got = [(i["name"], list(i["shape"]), i["dtype"]) for i in states]
    if got != want:
        raise ArtifactError(f"{where}: its state inputs {got[:2]}... are not the caches generation.json declares "
                            f"{want[:2]}...: the directory mixes artifacts of different models; save it again")
    alias = {a["input"]: a["output"] for a in m.get("aliases", ())}
    try:
        return step_program(art.runner, alias, len(m["outputs"]), [s.name for s in spec.state])
    except InputError as e:
        raise ArtifactError(f"{where}: {e}; save the model again") from None


class GenerationArtifact(RunsGeneration):
    """A loaded generation (module docstring): ``generate`` as transformers', ``session()`` for shared slots.

    It runs ``runtime.generation_runtime.GenerationRuntime`` (``.runtime``), as a
    compiled generation does, its programs made by the same adapter
    (``runtime.step_program``).
    """

    def __init__(self, directory: str, doc: dict, spec: gen.StepSpec, steps: dict, device: str):
        self.directory, self.doc, self.spec, self.steps, self.device = directory, doc, spec, steps, device
        try:
            programs = gen.StepPrograms(spec, {b: artifact_program(a, spec, f"{directory!r} {b.name}")
                                               for b, a in steps.items()})
        except InputError as e:
            raise ArtifactError(f"{directory!r}: {e}; save the model again") from None
        self.runtime = GenerationRuntime(programs, device)

    @property
    def programs(self) -> gen.StepPrograms:
        return self.runtime.programs

    @property
    def name(self) -> str:
        return str(self.doc.get("model") or "generation")

    def __repr__(self) -> str:
        return (f"<egraft GenerationArtifact {self.name!r} (max_batch={self.spec.max_batch}, max_length="
                f"{self.spec.max_length}, chunks={list(self.spec.chunks)}) from {self.directory!r}>")


def load_generation(started: Started) -> GenerationArtifact:
    """The generation whose programs `started` is loading (``runtime.generation_read.start``, called before this
    module is imported), with its step spec and each program's bucket."""
    directory, doc, path = started.directory, started.doc, started.path
    try:
        spec = spec_from_dict(doc.get("spec") or {}, path)
        listed = _listed_v1(doc, spec, path) if doc["format_version"] < 2 else _listed(doc, path)
        loaded = started.programs()
    except BaseException:
        started.abandon()
        raise
    return GenerationArtifact(directory, doc, spec, {listed[rel]: art for rel, art in loaded.items()}, started.device)


def _listed(doc: dict, path: str) -> dict:
    """generation.json's programs: directory -> Bucket."""
    try:
        return {rel: gen.Bucket(int(e["chunk"]), int(e["context"]), int(e["rows"]))
                for rel, e in dict(doc["programs"]).items()}
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: its program list is missing or malformed ({type(e).__name__}: {e}); "
                            "save the model again") from None


def _listed_v1(doc: dict, spec: gen.StepSpec, path: str) -> dict:
    """A format-1 file's steps (full buckets), decoders (chunk 1 of a context) and row programs ("TxR")."""
    full, b = spec.full_context, spec.max_batch
    try:
        out = {rel: gen.Bucket(int(t), full, b) for t, rel in dict(doc["steps"]).items()}
        out.update({rel: gen.Bucket(1, int(c), b) for c, rel in dict(doc.get("decoders") or {}).items()})
        for k, rel in dict(doc.get("row_programs") or {}).items():
            t, r = (int(n) for n in k.split("x"))
            out[rel] = gen.Bucket(t, full, r)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ArtifactError(f"{path}: its steps are missing or malformed ({type(e).__name__}: {e}); "
                            "save the model again") from None
    return out


__all__ = ["GENERATION_FILE", "GenerationArtifact", "is_generation", "load_generation",
           "spec_from_dict", "spec_to_dict"]
