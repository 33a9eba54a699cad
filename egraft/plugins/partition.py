"""Fallback for graphs egraft cannot lower whole: its lowerable pieces are compiled, the rest runs in PyTorch.

The exported program is core ATen, so "can egraft take this node" has an
exact answer: the op has a rule in ``egraft.frontend.lowering.LOWERINGS``
and every tensor it reads and writes has an IR dtype.  torch's
``CapabilityBasedPartitioner`` groups the supported nodes of the unlifted
program (``ExportedProgram.module()``: weights are attributes again) into
pieces without cycles; each piece becomes a small module exported and
compiled through the same pipeline as a whole graph (checked against the
piece run in PyTorch), with the weights it reads bound (they were
``get_attr`` nodes of the parent) and its share of the budget.  The nodes left outside run as the ATen
calls they are.

A rule may still refuse a node with particular arguments
(``UnsupportedOpError`` from the piece's lowering): that op is then taken out
of the supported set everywhere and the program is partitioned again, so
every round removes one op and the loop ends.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ..errors import UnsupportedOpError
from ..frontend.lowering import lookup, op_name
from ..frontend.tracer import source_line
from ..ir.tensors import ir_dtypes
from ..search.config import CompileConfig
from .binding import Bound, placeholders
from .exported import compile_exported, export

PREFIX = "egraft_piece_"
# ops a piece is not worth compiling for when they are its only companions of one real op
NON_COMPUTE = ["torch.ops.aten.view", "torch.ops.aten.permute", "torch.ops.aten.expand", "torch.ops.aten.unsqueeze",
               "torch.ops.aten.squeeze", "torch.ops.aten.t", "torch.ops.aten.alias", "torch.ops.aten.clone",
               "torch.ops.aten._assert_tensor_metadata", "torch.ops.aten.detach", "_operator.getitem"]
_TORCH_DTYPES = ir_dtypes()
# allocations whose values are unspecified (an out= buffer a custom op fills, as vLLM's linears and attention do):
# nothing to compile, and no value a compiled piece could be checked against, so they stay PyTorch's
UNINITIALIZED = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


class CannotSplit(Exception):
    """Partitioning made no progress: the caller runs the whole graph in PyTorch."""


def _untyped(value) -> str | None:
    """The first dtype egraft's IR lacks among a node's values (complex, uint8, ...), or None."""
    vals = value if isinstance(value, (tuple, list)) else (value,)
    return next((str(v.dtype).removeprefix("torch.") for v in vals
                 if isinstance(v, torch.Tensor) and v.dtype not in _TORCH_DTYPES), None)


class _Support(OperatorSupportBase):
    """A call is egraft's when its op has a lowering rule (not refused since) and all its values have IR dtypes."""

    def __init__(self, refused: set[str]):
        super().__init__()
        self.refused = refused
        self._unset: dict[torch.fx.Node, bool] = {}

    def uninitialized(self, node: torch.fx.Node) -> bool:
        """An allocation with unspecified values, or a value computed from one (a view of an out= buffer)."""
        if node not in self._unset:
            packet = getattr(node.target, "overloadpacket", None)
            self._unset[node] = node.op == "call_function" and (
                getattr(packet, "__name__", "") in UNINITIALIZED
                or (lookup(node.target) is not None and any(self.uninitialized(a) for a in node.all_input_nodes)))
        return self._unset[node]

    def why_not(self, node: torch.fx.Node) -> str | None:
        """None for a node egraft takes, else what to call it in the fallback warning."""
        name = op_name(node.target)
        if lookup(node.target) is None or name in self.refused:
            return name
        if self.uninitialized(node):
            return f"{name} (uninitialized memory)"
        for v in [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]:
            dt = _untyped(v)
            if dt:
                return f"{name} on {dt}"
        return None

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and self.why_not(node) is None


@dataclass
class Split:
    """The partitioned program: call it with the user tensors; it returns the flat tensor outputs."""

    module: torch.fx.GraphModule
    fallback_ops: dict[str, str | None]  # op name -> the model source line of its first occurrence
    results: list = field(default_factory=list)  # one SearchResult per compiled piece

    def __call__(self, *user: torch.Tensor) -> list[torch.Tensor]:
        out = self.module(*user)
        return list(out) if isinstance(out, (tuple, list)) else [out]


class _Piece(torch.nn.Module):
    """A fused submodule replaced by its egraft executable (weight arguments are bound, hence ignored)."""

    def __init__(self, bound: Bound, executable):
        super().__init__()
        self.bound, self.executable = bound, executable

    def forward(self, *args):
        return self.bound.rebuild(self.executable.run_torch(self.bound.user_args(args)))


class _Recorder(torch.fx.Interpreter):
    """Runs the fused program in PyTorch once, keeping the arguments each piece receives."""

    def __init__(self, gm):
        super().__init__(gm)
        self.seen: dict[str, tuple] = {}

    def call_module(self, target, args, kwargs):
        if str(target).startswith(PREFIX):
            self.seen[str(target)] = tuple(args)
        return super().call_module(target, args, kwargs)


def _fallback_ops(gm: torch.fx.GraphModule, support: _Support) -> dict[str, str | None]:
    """What runs in PyTorch because egraft cannot take it (op, or op on a dtype) -> its first source line."""
    out: dict[str, str | None] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is not operator.getitem:
            why = support.why_not(n)
            if why:
                out.setdefault(why, source_line(n))
    return out


def _compile_piece(parent: torch.fx.GraphModule, node: torch.fx.Node, args: Sequence[Any], config: CompileConfig,
                   label: str):
    if not all(isinstance(a, torch.Tensor) for a in args):
        # a python value computed by the PyTorch part can change from call to call; a piece would bake it in
        raise CannotSplit(f"{label} takes a python value computed outside it")
    sub = getattr(parent, str(node.target))
    weights = {i for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node) and a.op == "get_attr"}
    bound = Bound(sub, args, weights, placeholders(sub))
    user = bound.user_args(args)
    ep = export(bound, user)
    with torch.no_grad():
        bound(*user)  # records the output structure on real tensors (export ran it on fake ones)
    done = compile_exported(ep, config, user, bound, label)
    return _Piece(bound, done.executable), done.result


def split_compile(ep: torch.export.ExportedProgram, user_args: Sequence[torch.Tensor], config: CompileConfig) -> Split:
    """Compile the lowerable pieces of ``ep`` with egraft (`config` for its device; the pieces share its budget).

    Raises :class:`CannotSplit` if no piece remains.
    """
    refused: set[str] = set()
    while True:
        gm = ep.module(check_guards=False)  # a fresh copy each round
        support = _Support(refused)
        partitioner = CapabilityBasedPartitioner(gm, support, non_compute_ops=NON_COMPUTE)
        parts = partitioner.propose_partitions()
        if not parts:
            raise CannotSplit("no piece of the graph is left for egraft")
        fused = partitioner.fuse_partitions(parts, prefix=PREFIX)
        calls = [n for n in fused.graph.nodes if n.op == "call_module" and str(n.target).startswith(PREFIX)]
        recorder = _Recorder(fused)
        with torch.no_grad():
            recorder.run(*user_args)
        try:
            share = config.with_(budget=config.budget.share(1.0 / len(calls)))
            pieces = [_compile_piece(fused, n, recorder.seen[str(n.target)], share, f"piece {k + 1}/{len(calls)}")
                      for k, n in enumerate(calls)]
        except UnsupportedOpError as e:
            op = e.op.split(" ")[0]
            if op in refused or not any(op_name(n.target) == op for n in ep.graph.nodes if n.op == "call_function"):
                raise CannotSplit(f"{e.op} could not be isolated from the rest of the graph") from e
            refused.add(op)
            continue
        for n, (piece, _) in zip(calls, pieces):
            setattr(fused, str(n.target), piece)
        return Split(fused, _fallback_ops(fused, support), [res for _, res in pieces])
