"""One bound graph, one input signature: export it, search it, lower it.

The steps are egraft's own, by their public stages: ``export_program``
(torch.export and the core-ATen decomposition), ``lower_program`` (the ATen
lowering rules; an op without one raises
:class:`~egraft.errors.UnsupportedOpError`), ``search.search`` and
``backends.lower``.  The exported program is kept apart from the lowering
because the caller partitions it when an op does not lower.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch

from ..backends import lower
from ..errors import UnsupportedOpError
from ..frontend import export_program, lower_program
from ..ir import dtypes
from ..ir.evaluate import to_numpy
from ..measure.inputs import random_inputs
from ..search import search
from .options import Options

log = logging.getLogger("egraft.plugins")


def export(module: torch.nn.Module, user_args: Sequence[torch.Tensor]) -> torch.export.ExportedProgram:
    """``torch.export`` + core ATen; a graph that updates state in place is refused (UnsupportedOpError).

    A Dynamo graph that mutates a buffer or an input (a KV cache written in
    place) has no pure-function form egraft could bind weights for; the
    caller runs such a graph in PyTorch.
    """
    from torch.export.graph_signature import OutputKind

    ep = export_program(module, tuple(user_args))
    mutated = [s.target for s in ep.graph_signature.output_specs if s.kind != OutputKind.USER_OUTPUT]
    if mutated:
        raise UnsupportedOpError(f"in-place update of {', '.join(map(str, mutated))}", None,
                                 "the graph mutates state; egraft compiles pure functions")
    return ep


def device_of(args: Sequence, opts: Options) -> str:
    """The device to search for: the option, else the device of the first tensor argument."""
    if opts.device:
        return opts.device
    dev = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    return str(dev) if dev.type != "cuda" or dev.index is not None else "cuda"


def validation_inputs(graph, user_args: Sequence[torch.Tensor], seed: int) -> list[list[np.ndarray]]:
    """The inputs the search checks candidates on: the real ones, plus random ones if all are float.

    Integer and bool inputs are token ids, positions and masks whose valid
    range only the model knows (a random id past the vocabulary is an
    out-of-range gather), so a graph with any of them is checked on the
    inputs it was called with only.
    """
    real = [to_numpy(x) for x in user_args]
    if all(dtypes.is_float(dt) for _, dt in graph.input_types()):
        return [real, random_inputs(graph, seed)]
    return [real]


def compile_graph(graph, opts: Options, device: str, user_args: Sequence[torch.Tensor], share: float = 1.0,
                  label: str = "graph"):
    """Search ``graph`` for ``device`` and lower the winner: ``(executable, SearchResult)``."""
    res = search(graph, backend=opts.backend, device=device, budget=opts.search_budget(share), seed=opts.seed,
                 fitness=opts.fitness, cache=opts.cache, progress=opts.progress, limits=opts.rewrite_limits(),
                 inputs=validation_inputs(graph, user_args, opts.seed))
    exe = lower(res.graph, res.backend, device, res.knobs)
    log.info("egraft: %s (%d nodes) -> %s %s, %.3g ms (direct lowering %.3g ms)%s", label, len(graph.nodes),
             res.backend, res.knobs, res.time_s * 1e3, res.baseline_time_s * 1e3,
             " [from the search cache]" if res.from_cache else "")
    return exe, res


def compile_exported(ep: torch.export.ExportedProgram, opts: Options, device: str, user_args: Sequence[torch.Tensor],
                     share: float = 1.0, label: str = "graph"):
    """``lower_program`` + :func:`compile_graph`; raises UnsupportedOpError for an op with no lowering."""
    return compile_graph(lower_program(ep), opts, device, user_args, share, label)
