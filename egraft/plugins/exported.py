"""One bound graph, one input signature: export it, lower it to the IR, compile it through the pipeline.

The steps are egraft's own, by their public stages: ``export_program``
(torch.export and the core-ATen decomposition), ``lower_program`` (the ATen
lowering rules; an op without one raises
:class:`~egraft.errors.UnsupportedOpError`), then
:func:`egraft.search.pipeline.compile_program`, the pipeline every entry
point shares (search, the winner's executable, the check against the bound
graph run in PyTorch).  The exported program is kept apart from the
lowering because the caller partitions it when an op does not lower.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import UnsupportedOpError
from ..frontend import export_program, lower_program, require_pure
from ..frontend.signature import input_specs
from ..frontend.decomposition import decomposition_table
from ..ir.signature import Signature
from ..ir.evaluate import to_numpy
from ..measure import like
from ..search.config import CompileConfig
from ..search.pipeline import CompiledSignature, compile_program

log = logging.getLogger("egraft.plugins")


@dataclass(frozen=True)
class Exported:
    """One export of a bound graph and its signature, read once (the state, the lowering and the layout of
    the written inputs all read it from here)."""

    program: torch.export.ExportedProgram
    signature: Signature
    specs: dict  # placeholder name -> its InputSpec (frontend.signature.input_specs)

    def lower(self):
        """The IR graph (``lower_program``), from the signature read at export."""
        return lower_program(self.program, specs=(self.signature, self.specs))


def export(module: torch.nn.Module, user_args: Sequence[torch.Tensor], inputs_state: bool = False) -> Exported:
    """``torch.export`` + core ATen; a graph that updates state in place is refused (UnsupportedOpError).

    With `inputs_state`, a graph that writes into its user inputs (a static
    KV cache, ``keys.index_copy_(...)``, ``cumulative_length.add_(n)``) is
    taken: those inputs become ``state`` (:mod:`.state` writes the new values
    back into the caller's tensors).  A write into a bound weight (a module
    buffer Dynamo lifted) is always refused, and so is any state without
    `inputs_state` (a split graph's pieces, the padded buckets of a dynamic
    size): the caller runs such a graph in PyTorch.
    """
    # detached: a tensor Dynamo's caller marked dynamic (torch._dynamo.mark_dynamic, as vLLM does) carries the
    # mark as a python attribute, and torch.export would try to keep that size symbolic; egraft exports one size
    # (decomposed to core ATen here, not lowered as exported: the fallback partitioner (.partition) decides which
    # nodes egraft takes by reading the exported graph's ops)
    ep = export_program(module, tuple(a.detach() for a in user_args), decompositions=decomposition_table())
    sig, specs = input_specs(ep)
    if inputs_state:
        buffers = [name for _, name in sig.aliases if sig[name].source is None]
        if buffers:
            raise UnsupportedOpError(f"in-place update of the module buffer(s) {', '.join(buffers)} inside a "
                                     "torch.compile graph", None,
                                     "the torch.compile backend writes back into the graph's inputs (a static "
                                     "KV cache), not into module buffers: egraft.compile(model) compiles those")
    else:
        require_pure(sig)
    return Exported(ep, sig, specs)


def device_of(args: Sequence, config: CompileConfig) -> str:
    """The device to search for: the option, else the device of the first tensor argument."""
    if config.device:
        return config.device
    dev = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    return str(dev) if dev.type != "cuda" or dev.index is not None else "cuda"


def compile_graph(graph, config: CompileConfig, user_args: Sequence[torch.Tensor], reference,
                  label: str = "graph", prior: CompiledSignature | None = None) -> CompiledSignature:
    """Compile ``graph`` through the pipeline, checked against ``reference`` (the bound graph in PyTorch).

    The search validates candidates, and the pipeline checks the winner, on
    the inputs the graph was called with and one random set drawn like them
    (:func:`egraft.measure.like`: integer inputs within the called ones'
    range, so token ids and positions stay valid).  `prior`: an earlier
    compile of another size of this program, whose backend and knobs are
    reused (:func:`egraft.search.pipeline.compile_program`: no search unless
    the check fails).
    """
    fresh, _ = like(tuple(user_args), None, config.seed)
    sets = [list(user_args), list(fresh)]
    done = compile_program(graph, config, reference=reference, check_sets=sets,
                           inputs=[[to_numpy(x) for x in s] for s in sets], label=label,
                           against="the graph run in PyTorch", prior=prior)
    res = done.result
    log.info("egraft: %s (%d nodes) -> %s %s, %.3g ms (direct lowering %.3g ms)%s", label, len(graph.nodes),
             res.backend, res.knobs, res.time_s * 1e3, res.baseline_time_s * 1e3,
             " [from the search cache]" if res.from_cache else "" if done.searched else " [reused, not searched]")
    return done


def compile_exported(exported: Exported, config: CompileConfig, user_args: Sequence[torch.Tensor],
                     reference, label: str = "graph") -> CompiledSignature:
    """:meth:`Exported.lower` + :func:`compile_graph`; raises UnsupportedOpError for an op with no lowering."""
    return compile_graph(exported.lower(), config, user_args, reference, label)
