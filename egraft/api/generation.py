"""``egraft.compile(causal_lm, max_batch=..., max_length=...)``: generation through compiled step programs.

A causal LM is compiled as its *step* (``frontend.causal_lm``): one forward
over ``T`` new tokens per row that writes their keys and values into KV
caches held as ``state`` and returns each row's last logits.  One program is
compiled per bucket (``runtime.step_spec.Bucket``: a chunk size of the
ladder, the cache slots it reads, the rows it computes; ``StepSpec.buckets``
lists them).  The full decode step (chunk 1, ``max_length`` slots, every row)
is searched; every other bucket is lowered with its winning backend and knobs
and checked against eager PyTorch, with no search
(``search.pipeline.compile_like``), so compile time follows the number of
buckets, not prompt lengths or batch sizes.  Their graphs come from one
``torch.export`` per family of buckets with the chunk and context sizes
symbolic (``frontend.causal_lm.StepTracer``), not one per bucket.  The generation loop is the
light runtime's (``runtime.generation``): per step it runs one program call,
the sampler and the stopping test.  A compiled generation runs the same
``runtime.generation_runtime.GenerationRuntime`` as a loaded one (``.runtime``), its
programs made by the same adapter (``runtime.step_program``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

from ..errors import InputError
from ..measure.memory import ledger, mark
from ..runtime.device import parse
from ..runtime import generation as gen
from ..runtime.generation_runtime import GenerationRuntime, RunsGeneration
from ..runtime.step_program import step_program
from .pipeline import CompiledProgram, build, call_key


@dataclass
class Generation(RunsGeneration):
    """The compiled step programs of one causal LM (one per bucket), their caches, and what compiling them took."""

    spec: gen.StepSpec
    programs: dict[gen.Bucket, CompiledProgram]  # bucket -> the compiled program
    compile_s: dict[gen.Bucket, float]  # bucket -> seconds to trace and compile it
    device: str = "cpu"  # where the caches live: the programs' device
    weights: object = None  # the frontend.weights.WeightCopies every program binds (views of the model's weights)
    export_s: float = 0.0  # the step's torch.export(s), made before any bucket's compile (in no program's stages)
    memory: dict = field(default_factory=dict)  # measure.memory.Ledger.report() of the compile: what set the peak
    quantization: dict | None = None  # frontend.quantize.quantize's report when compiled with quantize=

    def __post_init__(self):
        names = [s.name for s in self.spec.state]
        programs = {}
        for b, p in self.programs.items():
            g = p.executable.graph
            programs[b] = step_program(p.executable.runner, {name: k for k, name in g.aliases.items()},
                                       len(g.outputs), names)
        self.runtime = GenerationRuntime(gen.StepPrograms(self.spec, programs), self.device, self.check_weights)

    @property
    def step_programs(self) -> gen.StepPrograms:
        return self.runtime.programs

    @property
    def searches(self) -> int:
        """How many of the programs ran a search (the others reused the first one's choices)."""
        return sum(1 for p in self.programs.values() if p.searched)

    def check_weights(self) -> None:
        """InputError if a weight the programs bind was updated in place after compiling (module docstring)."""
        changed = self.weights.changed() if self.weights is not None else []
        if changed:
            raise InputError(f"the model's weights were updated in place after egraft.compile ({changed[0]}"
                             f"{f' and {len(changed) - 1} more' if len(changed) > 1 else ''}): the compiled programs "
                             "bind the model's own weight memory but computed some forms of them (folded, "
                             "relaid) when compiled, so they would mix old and new values; compile the model again")

    def weight_report(self) -> dict:
        """What the programs bind: the model's weights (bytes, and how many are views of the model's own memory)
        and the forms derived from them (folded, relaid: ``runtime.derived``), each array counted once."""
        from ..runtime.derived import provenance

        bound, derived = {}, {}
        for p in self.programs.values():
            ex = p.executable
            for a in ex.graph.weights.values():
                bound[id(a)] = a
            for a in list(getattr(ex, "_host", ())) + list(getattr(ex, "folded", {}).values()):
                if id(a) not in bound and provenance(a) is not None:
                    derived[id(a)] = a
        held = self.weights.counts() if self.weights is not None else {}
        return {"weights": len(bound), "weight_bytes": int(sum(a.nbytes for a in bound.values())),
                "views_of_the_model": held.get("views", 0), "copies_of_the_model": held.get("copies", 0),
                "derived": len(derived), "derived_bytes": int(sum(a.nbytes for a in derived.values()))}

    def describe(self) -> dict:
        stages: dict[str, float] = {"trace": self.export_s}
        for p in self.programs.values():
            for k, v in p.stages.items():
                stages[k] = stages.get(k, 0.0) + float(v)
        return {"max_batch": self.spec.max_batch, "max_length": self.spec.max_length,
                "chunks": list(self.spec.chunks), "contexts": list(self.spec.contexts), "rows": list(self.spec.rows),
                "programs": len(self.programs), "searches": self.searches,
                "searched": [b.name for b, p in self.programs.items() if p.searched],
                "compile_s": {b.name: round(s, 3) for b, s in self.compile_s.items()},
                "backends": sorted({p.result.backend for p in self.programs.values()}),
                "choices": {b.name: {"backend": p.result.backend, "knobs": dict(p.result.knobs)}
                            for b, p in self.programs.items() if p.searched},  # the search's winner(s)
                "stages_s": {k: round(v, 3) for k, v in stages.items()},  # summed over the programs
                "memory": self.weight_report(), "compile_memory": dict(self.memory),
                **({"quantization": dict(self.quantization)} if self.quantization else {})}


def compile_generation(model: torch.nn.Module, config, status: Callable[[str], None], *, max_batch: int,
                       max_length: int, chunks: Sequence[int] | None = None,
                       contexts: Sequence[int] | None = None, rows: Sequence[int] | None = None) -> Generation:
    """Compile `model`'s step for every bucket of its spec (the module docstring)."""
    from ..frontend.causal_lm import DEFAULT_CHUNKS, step_module

    start = time.perf_counter()  # the budget is the whole compile's (search.config.Budget.started)

    if not callable(getattr(model, "get_output_embeddings", None)) or not hasattr(model, "config"):
        raise InputError(f"{type(model).__name__} is not a Hugging Face causal LM (no config / output embeddings): "
                         "max_batch and max_length compile generation for transformers' *ForCausalLM models; "
                         "compile other models without them")
    step = step_module(model, max_batch, max_length, DEFAULT_CHUNKS if chunks is None else tuple(chunks),
                       None if contexts is None else tuple(contexts), None if rows is None else tuple(rows))
    if config.cache:  # XLA's own disk cache too: a second process then finds the compiled programs, not only the search
        try:
            from ..search.evaluators import enable_xla_cache, xla_cache_dir

            enable_xla_cache(xla_cache_dir())
        except ImportError:  # no jax here: nothing of XLA to cache
            pass
    with ledger() as led:
        programs, times, tracer = _compile_buckets(step, config, status, start)
    # the caches live on the programs' device (a JAX step keeps them as its own arrays after the first call)
    dev = parse(config.device or "cpu")
    return Generation(step.spec, programs, times, weights=tracer.weights, export_s=tracer.export_s,
                      memory=led.report(), device=str(dev) if dev.kind == "cuda" else "cpu")


def _compile_buckets(step, config, status: Callable[[str], None], start: float):
    """Every bucket's program: the step's exports first, then the full decode step searched, then the others."""
    from ..frontend.causal_lm import StepTracer, family
    from ..frontend.weights import WeightCopies

    programs: dict[gen.Bucket, CompiledProgram] = {}
    times: dict[gen.Bucket, float] = {}
    first = None
    weights = WeightCopies(views=True)  # the model's own weight memory, bound by every bucket's program
    tracer = StepTracer(step, weights, status)  # one torch.export per family of buckets
    buckets = step.spec.buckets()
    full_decode = gen.Bucket(1, step.spec.full_context, step.spec.max_batch)
    order = [full_decode] + [b for b in buckets if b != full_decode]  # the full decode step is the one searched
    status(f"exporting the step ({len({family(b) for b in order})} export(s) for {len(order)} bucket(s))")
    for b in order:  # every export before the search, so that its budget counts them
        tracer.export(b)
    mark("trace")
    # the search keeps time for compiling and checking the other buckets' programs after it
    searched = replace(config, budget=replace(config.budget, started=start, after=len(order) - 1))
    for b in order:
        args = step.example_inputs(b.chunk, b.context, b.rows)
        status(f"compiling the step for {b.chunk} token(s) of {b.rows} row(s) reading {b.context} cache slots"
               + (" (reusing the decode step's choices)" if first is not None else ""))
        t0 = time.perf_counter()
        prog = build(step, args, {}, call_key(args, {}), searched if first is None else config, status, reuse=first,
                     weights=weights, tracer=lambda: tracer(b))
        times[b] = time.perf_counter() - t0
        programs[b] = prog
        first = first or prog
    return programs, times, tracer


__all__ = ["Generation", "compile_generation"]
