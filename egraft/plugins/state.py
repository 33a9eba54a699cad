"""A Dynamo graph that writes into its inputs, compiled with those inputs as ``state``.

transformers' static KV cache (``cache_implementation="static"``) hands the
decode graph its cache tensors and a step counter, and the graph updates
them in place (``keys.index_copy_(2, cache_position, k)``,
``cumulative_length.add_(n)``); ``torch.export`` shows them as
``USER_INPUT_MUTATION`` outputs and egraft's frontend lowers them as inputs
of role ``state``, each aliased to the output that carries its new value
(``egraft.frontend.signature``).  :func:`compile_stateful` compiles such a
graph and returns a :class:`Stateful` runner that, like the graph in
PyTorch, leaves the new values in the caller's own tensors:

* the executable takes its call inputs, then its state
  (``egraft.ir.signature``), the :class:`~.binding.Bound` graph the user's
  tensors in Dynamo's order: :func:`layout` maps one to the other;
* the torch and Triton backends write a tensor passed as state in place and
  hand it back (``egraft.backends.base.Executable``); an aliased output that
  is another tensor (JAX returns a new value) is ``copy_``-ed into the
  caller's tensor, counted in :attr:`Stateful.copies`.  A cache-sized copy
  per decode step would cost what a static cache saves, so the Dynamo
  backend searches only the backends that write in place
  (``CompileConfig.state_in_place``, on by default there:
  ``egraft.backends.candidates``); a backend named explicitly is used as
  asked, with the copy;
* the check against PyTorch (``egraft.search.pipeline.check``) compares the
  new state values as well as the outputs, and both the reference and the
  checked program run on clones of the state, so the caller's tensors are
  written exactly once per call, by the call itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch.export.graph_signature import InputKind

from ..runtime.step_program import graph_state
from ..search.config import CompileConfig
from ..search.pipeline import CompiledSignature
from .exported import Exported, compile_graph


def mutated_positions(exported: Exported) -> frozenset[int]:
    """The positions, among the user inputs of the exported program, of those it writes into."""
    by_node, written = exported.specs, {name for _, name in exported.signature.aliases}
    users = [s.arg.name for s in exported.program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return frozenset(k for k, n in enumerate(users) if n in by_node and by_node[n].name in written)


def layout(exported: Exported, graph) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """(the user position of each executable input, (output index, user position) per state write, the
    indices of the graph's own outputs)."""
    by_node = exported.specs
    users = [by_node[s.arg.name].name for s in exported.program.graph_signature.input_specs
             if s.kind == InputKind.USER_INPUT]
    order = [users.index(n) for n in graph.input_names()]
    names, outs, own = graph_state(graph, [name for _, name in sorted(graph.aliases.items())])
    return order, [(k, users.index(name)) for k, name in zip(outs, names)], own


@dataclass
class Stateful:
    """The user tensors in (Dynamo's order), the graph's own outputs out; the state written into the caller's tensors."""

    executable: object
    order: list[int]
    writes: list[tuple[int, int]]
    own: list[int]
    copies: int = 0  # state values that came back as another tensor and were copied in (0 for torch, Triton)

    def __call__(self, *user: torch.Tensor) -> list[torch.Tensor]:
        outs = self.executable.run_torch([user[p] for p in self.order])
        for k, p in self.writes:
            new, mine = outs[k], user[p]
            if new is not mine and new.data_ptr() != mine.data_ptr():
                with torch.no_grad():
                    mine.copy_(new)
                self.copies += 1
        return [outs[k] for k in self.own]


def compile_stateful(exported: Exported, config: CompileConfig, user: Sequence[torch.Tensor],
                     bound, label: str) -> tuple[Stateful, CompiledSignature]:
    """Lower the `exported` program and compile it under `config` (the Dynamo backend's has
    ``state_in_place``), checked against `bound` run on clones of the state."""
    graph = exported.lower()
    order, writes, own = layout(exported, graph)
    by_out = dict(writes)
    mutated = set(by_out.values())

    def reference(*flat):  # the bound graph in PyTorch, on clones of the state; new state, then its outputs
        args: list = [None] * len(user)
        for x, p in zip(flat, order):
            args[p] = x.clone() if p in mutated else x
        outs = iter(bound(*args))
        return [args[by_out[k]] if k in by_out else next(outs) for k in range(len(graph.outputs))]

    flat = [user[p].clone() if p in mutated else user[p] for p in order]  # the search never sees the caller's
    done = compile_graph(graph, config, flat, reference, label)
    return Stateful(done.executable, order, writes, own), done


__all__ = ["Stateful", "compile_stateful", "layout", "mutated_positions"]
