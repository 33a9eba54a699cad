"""One signature compiled, for every entry point: saturate, search, the winner's executable, check.

``egraft.compile`` (``egraft.api.pipeline``), the ``torch.compile`` backend
(``egraft.plugins.exported``, whole graphs and the pieces of a split one)
and the ``egraft compile`` command (through ``egraft.compile``) each trace
their program their own way, then call :func:`compile_signature`, which:

1. searches the traced graph under the :class:`~egraft.search.config.CompileConfig`
   (saturation, the genetic search, the final comparison; the search cache
   answers what it covers);
2. takes the winner's executable as the search built it (it is never
   lowered a second time);
3. checks it once against the reference: the user's eager model, or the
   Dynamo graph run in PyTorch, on the check input sets (the example inputs
   and a fresh random set drawn like them, :func:`egraft.measure.like`; another
   size of a program compiled before, on the fresh set).

The check.  The search validated every candidate against the *traced*
program (the float64 reference interpreter); that proves the rewrites and
the backend right, not the tracing, so the program is compared once more
with the reference the user trusts, through the one check
(:func:`egraft.measure.check.outputs`).  Each float output may differ from
the reference by twice the graph's error budget
(:func:`egraft.measure.tolerance_for`: both the reference and the program
carry up to one budget of rounding error relative to the exact result);
integer and bool outputs, shapes and dtypes must match exactly.  A
disagreement raises :class:`egraft.errors.ValidationError`: a wrong program
is never handed out.

Another size of a program compiled before (a padded bucket of a dynamic
dimension): :func:`compile_like` lowers the new graph with the earlier
winner's backend and knobs and checks it by the same one check; only when
that fails does it search.  A size then costs a lowering and a check.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import BackendError, ValidationError
from ..measure import output_tolerances, outputs
from ..measure.memory import mark
from ..runtime.device import parse as parse_device
from ..runtime.step_program import graph_state
from .config import CompileConfig
from .result import SearchResult


@dataclass(frozen=True)
class CompiledSignature:
    """One program compiled for one signature, whichever entry point asked (``egraft.compile``'s signatures
    and generation's buckets hold one each, a Dynamo graph one per whole graph or piece): the executable,
    the device it runs on, its state calling convention, and the evidence (the search result behind it, the
    check against the reference, each stage's seconds)."""

    executable: Any
    result: SearchResult
    check: dict | None  # the check against the reference (None: not checked)
    stages: dict = field(default_factory=dict)  # seconds: saturate, search, lower, validate (the check)
    searched: bool = True  # False: compile_like reused an earlier winner's backend and knobs (no search ran)

    @property
    def device(self):
        """Where the executable runs, parsed (:class:`egraft.runtime.device.Device`)."""
        return parse_device(self.result.device)

    @property
    def state(self) -> tuple[list[str], list[int], list[int]]:
        """The state calling convention (:func:`egraft.runtime.step_program.state_outputs`): the state inputs'
        names in call order (after the other inputs), each one's aliased output, the program's own outputs."""
        return graph_state(self.executable.graph)


def compile_program(graph, config: CompileConfig, *, reference: Callable | None = None,
                    check_sets: Sequence[Sequence] | None = None, inputs: Sequence[Sequence] | None = None,
                    label: str = "graph", against: str = "the reference",
                    prior: CompiledSignature | None = None) -> CompiledSignature:
    """The one compile every entry point calls (``egraft.compile``, generation's buckets, the Dynamo backend's
    graphs, buckets and pieces): a search (:func:`compile_signature`) or, given `prior` (an earlier compile of
    another size of the program), its backend and knobs reused (:func:`compile_like`, which searches only when
    that fails).  The other arguments are :func:`compile_signature`'s."""
    kw = dict(reference=reference, check_sets=check_sets, inputs=inputs, label=label, against=against)
    return compile_signature(graph, config, **kw) if prior is None else compile_like(prior, graph, config, **kw)


def compile_signature(graph, config: CompileConfig, *, reference: Callable | None = None,
                      check_sets: Sequence[Sequence] | None = None, inputs: Sequence[Sequence] | None = None,
                      label: str = "graph", against: str = "the reference") -> CompiledSignature:
    """Search `graph` under `config`, take the winner's executable, check it against `reference`.

    `reference(*flat)` runs the user's program on one flat input list (the
    tensors the executable takes, in its order) and returns its outputs (any
    torch pytree; None leaves are dropped); `check_sets` are those flat
    lists.  Without a reference or with ``config.validate`` False nothing is
    checked.  `inputs`: numpy input sets the search validates candidates on
    (default: random ones drawn from the graph).  `label` names the program
    and `against` the reference in errors (``"eager PyTorch"``).
    """
    t = _time.perf_counter()
    res = _search(graph, config, inputs)
    total = _time.perf_counter() - t
    stages = {"saturate": float(res.stages.get("saturate", 0.0))}
    stages["search"] = max(0.0, total - stages["saturate"])
    t = _time.perf_counter()
    ex = res.executable  # as the search built and measured it (a cached result lowers it here, once)
    stages["lower"] = _time.perf_counter() - t
    mark("lower")
    record = None
    if reference is not None and config.validate and check_sets:
        t = _time.perf_counter()
        record = check(ex, graph, reference, check_sets, label, against)
        stages["validate"] = _time.perf_counter() - t
        mark("validate")
    return CompiledSignature(ex, res, record, {k: round(v, 4) for k, v in stages.items()})


def compile_like(prior: CompiledSignature, graph, config: CompileConfig, *, reference: Callable | None = None,
                 check_sets: Sequence[Sequence] | None = None, inputs: Sequence[Sequence] | None = None,
                 label: str = "graph", against: str = "the reference") -> CompiledSignature:
    """`graph` (another size of the program `prior` compiled) lowered with `prior`'s backend and knobs, checked.

    The earlier search's backend and knobs are reused; its rewritten program
    is not (it is a program of the other size): `graph` itself is lowered.
    The lowering is checked once, as :func:`compile_signature` checks a
    winner, but on the last of `check_sets` only (the fresh random set: the
    backend and knobs were checked on the example inputs at the searched
    size; at a deployed size the reference's eager run is the check's cost,
    a bfloat16 prefill of 256 tokens seconds on a CPU without bfloat16
    instructions) when there is a reference, else against the float64
    reference interpreter on `inputs` (or random inputs).
    A knob the backend does not offer for this graph, a failing lowering or
    a failed check falls back to :func:`compile_signature` (a full search),
    and the result says so (``searched`` and a note).  The result's times
    are NaN: nothing was timed.
    """
    from ..backends import get_backend, lower
    from ..backends.base import search_knobs

    res0 = prior.result
    backend, knobs, device = res0.backend, dict(res0.knobs), config.device or res0.device
    why = ""
    t = _time.perf_counter()
    try:
        space = search_knobs(get_backend(backend), graph, config.weight_copies)
        bad = sorted(k for k, v in knobs.items() if k not in space or v not in space[k])
        if bad:
            raise BackendError(f"knob(s) {', '.join(bad)} are not offered for this graph")
        ex = lower(graph, backend, device, knobs)
    except BackendError as e:
        why, ex = f"the {backend} lowering with {knobs} failed: {e}", None
    stages = {"lower": _time.perf_counter() - t}
    mark("lower")
    record = None
    if ex is not None and config.validate:
        t = _time.perf_counter()
        try:
            if reference is not None and check_sets:
                record = check(ex, graph, reference, check_sets, label, against, skip=len(check_sets) - 1)
            else:
                record = _check_oracle(ex, graph, inputs, config.seed, label)
        except ValidationError as e:
            why = f"the reused {backend} lowering failed the check: {e}"
        stages["validate"] = _time.perf_counter() - t
        mark("validate")
    if why:
        done = compile_signature(graph, config, reference=reference, check_sets=check_sets, inputs=inputs,
                                 label=label, against=against)
        done.result.notes.append(f"a reuse of an earlier winner ({backend} {knobs}) was tried first: {why}")
        return done
    result = SearchResult(graph, backend, knobs, math.nan, math.nan, device=device, fitness=res0.fitness,
                          seed=config.seed, budget=config.budget.effort(), built=ex, notes=[
                              f"not searched: the {backend} backend and knobs {knobs} of the winner for a graph of "
                              f"{len(res0.graph.nodes)} nodes were reused, lowered and checked at this size"])
    return CompiledSignature(ex, result, record, {k: round(v, 4) for k, v in stages.items()}, searched=False)


def _check_oracle(ex, graph, inputs, seed: int, label: str) -> dict:
    """The one check against the float64 reference interpreter (``measure.validate``); raises ValidationError."""
    from ..measure.validate import validate

    errors = []
    for xs in inputs or [None]:
        v = validate(ex, graph, xs, seed=seed)
        if not v.ok:
            raise ValidationError(f"{label}: the program ({ex.backend}) differs from the reference interpreter: "
                                  f"{v.message}")
        errors.append(max(v.errors, default=0.0))
    return {"sets": len(errors), "max_error": max(errors, default=0.0), "against": "the reference interpreter"}


def _search(graph, config: CompileConfig, inputs) -> SearchResult:
    from .engine import search

    return search(graph, config, inputs=inputs)


def _leaves(out) -> list:
    import torch

    return [x for x in torch.utils._pytree.tree_leaves(out) if x is not None]


def check(executable, graph, reference: Callable, sets: Sequence[Sequence], label: str,
          against: str = "the reference", skip: int = 0) -> dict:
    """Compare `executable` with `reference` on each flat input set (module docstring) after the first `skip`
    (``compile_like`` checks on the fresh random set only); the check's record."""
    import torch

    each = output_tolerances(graph)
    tols = [2 * each[k] for k in range(len(graph.outputs))]
    worst = [0.0] * len(tols)
    for n, flat in list(enumerate(sets))[skip:]:
        with torch.no_grad():
            wants = _leaves(reference(*flat))
            got = executable(*flat)
        c = outputs(got, wants, tols, same_dtype=True)
        if not c.ok:
            which = "the example inputs" if n == 0 else "fresh random inputs"
            hint = ("this is a bug in egraft's tracing" if len(got) != len(wants) else
                    "it was not returned. Try backend='torch' or another backend, and please report this "
                    "model to egraft")
            raise ValidationError(f"{label}: on {which} the compiled program ({executable.backend}) differs from "
                                  f"{against}: {c.message}; {hint}")
        worst = [max(w, e) for w, e in zip(worst, c.errors)]
    return {"sets": len(sets) - skip, "errors": worst, "tolerances": tols, "max_error": max(worst, default=0.0)}
