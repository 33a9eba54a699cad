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

A dynamic size (:class:`PieceBuckets`): each new size is partitioned again
(the PyTorch parts run at the real size, never padded), and each piece runs
the program compiled for the bucket size, its inputs padded, when
:func:`egraft.ir.rows.row_axes` proves that piece's rows apart; otherwise
that piece is compiled for the size itself.
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
from .binding import Bound, changed, placeholders, versions
from .buckets import bucket, cut_rows, pad_rows, probe_size, prove_rows
from .exported import compile_exported, compile_graph, export
from .uninitialized import UNINITIALIZED, filled_allocations

PREFIX = "egraft_piece_"
# ops a piece is not worth compiling for when they are its only companions of one real op
NON_COMPUTE = ["torch.ops.aten.view", "torch.ops.aten.permute", "torch.ops.aten.expand", "torch.ops.aten.unsqueeze",
               "torch.ops.aten.squeeze", "torch.ops.aten.t", "torch.ops.aten.alias", "torch.ops.aten.clone",
               "torch.ops.aten._assert_tensor_metadata", "torch.ops.aten.detach", "_operator.getitem"]
_TORCH_DTYPES = ir_dtypes()
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
    compiled: list = field(default_factory=list)  # one CompiledSignature per compiled piece

    @property
    def results(self) -> list:  # the SearchResults behind the pieces
        return [c.result for c in self.compiled]

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
    exported = export(bound, user)
    with torch.no_grad():
        bound(*user)  # records the output structure on real tensors (export ran it on fake ones)
    done = compile_exported(exported, config, user, bound, label)
    return _Piece(bound, done.executable), done


def _partition(ep: torch.export.ExportedProgram, refused: set[str]):
    """The fused program of ``ep`` (a fresh copy), its piece calls in order, and the support it was cut by."""
    gm = ep.module(check_guards=False)
    support = _Support(refused)
    partitioner = CapabilityBasedPartitioner(gm, support, non_compute_ops=NON_COMPUTE)
    parts = partitioner.propose_partitions()
    if not parts:
        raise CannotSplit("no piece of the graph is left for egraft")
    fused = partitioner.fuse_partitions(parts, prefix=PREFIX)
    calls = [n for n in fused.graph.nodes if n.op == "call_module" and str(n.target).startswith(PREFIX)]
    return fused, calls, support


def split_compile(ep: torch.export.ExportedProgram, user_args: Sequence[torch.Tensor], config: CompileConfig,
                  pieces=None) -> Split:
    """Compile the lowerable pieces of ``ep`` with egraft (`config` for its device; the pieces share its budget).

    `pieces`: a :class:`PieceBuckets` that compiles (or reuses) each piece instead of a
    search per piece (a dynamic size; its ``refused`` ops carry over between sizes).
    Raises :class:`CannotSplit` if no piece remains.
    """
    refused: set[str] = pieces.refused if pieces is not None else set()
    while True:
        fused, calls, support = _partition(ep, refused)
        recorder = _Recorder(fused)
        with torch.no_grad(), filled_allocations():  # each piece's example inputs: no unspecified memory in them
            recorder.run(*user_args)
        try:
            share = config.with_(budget=config.budget.share(1.0 / len(calls)))
            if pieces is not None:
                built = [pieces.piece(fused, n, k, recorder.seen[str(n.target)], share, f"piece {k + 1}/{len(calls)}")
                         for k, n in enumerate(calls)]
            else:
                built = [_compile_piece(fused, n, recorder.seen[str(n.target)], share, f"piece {k + 1}/{len(calls)}")
                         for k, n in enumerate(calls)]
        except UnsupportedOpError as e:
            op = e.op.split(" ")[0]
            if op in refused or not any(op_name(n.target) == op for n in ep.graph.nodes if n.op == "call_function"):
                raise CannotSplit(f"{e.op} could not be isolated from the rest of the graph") from e
            refused.add(op)
            continue
        for n, (piece, _) in zip(calls, built):
            setattr(fused, str(n.target), piece)
        return Split(fused, _fallback_ops(fused, support), [done for _, done in built])


# ---- a split graph with a dynamic size: each piece padded to a bucket size ---------------------------------


def _ops(sub: torch.fx.GraphModule) -> tuple:
    """A piece's identity across sizes: its op sequence (the partitioner cuts every size the same way)."""
    return tuple(str(n.target) for n in sub.graph.nodes if n.op == "call_function")


@dataclass
class _Slot:
    """One piece compiled at one bucket size: its program, the shapes it was compiled for, its proofs."""

    ops: tuple  # its op sequence and argument dtypes (what must match to reuse it)
    shapes: list  # per piece argument: its shape at the bucket size (None: a weight)
    graph: Any  # the piece's IR graph at the bucket size
    bound: Bound
    done: Any  # its CompiledSignature
    proofs: dict = field(default_factory=dict)  # varying input axes -> output row axes, or why rows meet

    def prove(self, axes: dict[int, int]) -> tuple | str:
        key = tuple(sorted(axes.items()))
        if key not in self.proofs:
            rows = prove_rows(self.graph, self.bound, axes)
            self.proofs[key] = tuple(rows.axes) if rows.independent else f"its rows meet at {rows.reason}"
        return self.proofs[key]


class _Padded(torch.nn.Module):
    """A piece called with `n` rows run on a bucket's program: inputs padded, outputs cut back to `n`."""

    def __init__(self, slot: _Slot, size: int, n: int, axes: dict[int, int], out_axes: tuple, bound_n: Bound):
        super().__init__()
        self.slot, self.size, self.n, self.axes, self.out_axes, self.bound_n = slot, size, n, axes, out_axes, bound_n

    def flat(self, args) -> list[torch.Tensor]:
        padded = [pad_rows(a, self.axes[j], self.n, self.size) if j in self.axes else a for j, a in enumerate(args)]
        outs = self.slot.done.executable.run_torch(self.slot.bound.user_args(padded))
        return [cut_rows(o, ax, self.n) for o, ax in zip(outs, self.out_axes)]

    def forward(self, *args):
        return self.bound_n.rebuild(self.flat(args))


class PieceBuckets:
    """The pieces of one dynamic split DynamoGraph, compiled per bucket size (or per size where rows meet).

    For a call of `n` rows, piece ``k`` of the program partitioned at `n` runs
    the piece ``k`` compiled at the bucket ``N >= n`` when the two are the
    same ops, its inputs differ from the bucket's on one axis each (``n``
    against ``N``: the varying axis, read from the two sizes), and
    :func:`egraft.ir.rows.row_axes` proves the bucket piece's rows apart;
    the PyTorch parts between pieces run at `n` as they are.  Each new size
    checks each padded piece against the piece run in PyTorch (`mismatch`)
    before use.  A piece that fails any of that is compiled at `n` itself
    (its reason in `per_size`).  The first compile of piece ``k`` is
    searched; every later one (other buckets, other sizes) reuses its winner
    (``compile_like``).
    """

    def __init__(self, graph, plan, mismatch):
        self.graph, self.plan, self.mismatch = graph, plan, mismatch
        self.refused: set[str] = set()
        self.slots: dict[tuple[int, int], _Slot | str] = {}  # (bucket size, piece index) -> slot or why not
        self.first: dict[int, Any] = {}  # piece index -> its first CompiledSignature (the winner reused)
        self.per_size: dict[int, dict[int, str]] = {}  # piece index -> {size compiled on its own: why}
        self.compiled = 0  # pieces compiled (lowered and checked) at this call's size
        self.n = self.size = 0
        self.args: Sequence[Any] = ()
        self._fused: dict[tuple, Any] = {}  # (size, refused ops) -> the graph partitioned at it, or why not
        self.probed: dict[int, tuple | str] = {}  # piece index -> its output row axes at a probe size, or why not
        self._weights: list = []  # the graph's weights and their versions, when the slots were compiled

    def at(self, n: int, args: Sequence[Any]) -> "PieceBuckets":
        """Ready for a call of `n` rows (the DynamoGraph's arguments `args`); raises CannotSplit past max_shapes."""
        cfg = self.graph.config
        if not self.plan.uniform(args):
            raise CannotSplit("its dynamic sizes differ in this call, so they cannot be padded together")
        size = bucket(n, cfg.dynamic)
        if size is None:
            raise CannotSplit(f"size {n} is above every bucket size of the dynamic option {list(cfg.dynamic)}")
        positions = sorted(self.graph._weights)
        if changed(self._weights, args, positions):
            self.__init__(self.graph, self.plan, self.mismatch)  # weights replaced or updated: compile afresh
            self._weights = versions(args, positions)
        full = cfg.no_room({s for s, _ in self.slots}, size, "bucket sizes")
        if full:
            raise CannotSplit(f"its pieces were {full}")
        self.n, self.size, self.args, self.compiled = n, size, args, 0
        return self

    def _calls_at(self, size: int, k: int):
        """Piece `k`'s call node in the graph exported (on fake tensors only) at `size` rows, or why not."""
        key = (size, frozenset(self.refused))
        if key not in self._fused:
            g = self.graph
            padded = [a.detach() if isinstance(a, torch.Tensor) and i not in g._weights else a
                      for i, a in enumerate(self.plan.pad(self.args, self.n, size))]
            try:
                bound = Bound(g.gm, padded, g._weights, g._names)
                self._fused[key] = _partition(export(bound, bound.user_args(padded)).program, set(self.refused))
            except Exception as e:  # noqa: BLE001 - any failure to trace at the bucket size: compile per size
                self._fused[key] = f"the graph does not trace at {size} rows ({str(e).strip().splitlines()[0][:120]})"
        got = self._fused[key]
        if isinstance(got, str):
            return got
        fused, calls, _ = got
        return (fused, calls[k]) if k < len(calls) else f"the graph is cut into other pieces at {size} rows"

    def _axes(self, args, shapes, size: int) -> dict[int, int] | str:
        """Per argument of a piece, the one axis where its `n`-row shape differs from the one at `size` rows."""
        axes = {}
        for j, (a, s) in enumerate(zip(args, shapes)):
            if s is None:
                continue
            diff = [d for d, (x, y) in enumerate(zip(a.shape, s)) if x != y]
            if len(a.shape) != len(s) or len(diff) > 1 or any(a.shape[d] != self.n or s[d] != size for d in diff):
                return f"its argument {j} has shape {tuple(a.shape)} at {self.n} rows, {tuple(s)} at {size}"
            axes.update({j: d for d in diff})
        return axes

    def _lower(self, sub, args, weights):
        bound = Bound(sub, args, weights, placeholders(sub))
        user = bound.user_args(args)
        return bound, user, export(bound, user).lower()

    def _lower_at(self, size: int, k: int, ops: tuple, args, weights):
        """Piece `k` traced at `size` rows (its arguments padded from `n`): its parts and its proof, or why not."""
        found = self._calls_at(size, k)
        if isinstance(found, str):
            return found
        fused, call = found
        sub = getattr(fused, str(call.target))
        if _ops(sub) != ops[0]:
            return f"{size} rows cut the graph into other pieces"
        vals = [None if j in weights else getattr(a, "meta", {}).get("val") for j, a in enumerate(call.args)]
        if any(j not in weights and not isinstance(v, torch.Tensor) for j, v in enumerate(vals)):
            return f"an argument of the piece has no traced shape at {size} rows"
        shapes = [None if v is None else tuple(v.shape) for v in vals]
        axes = self._axes(args, shapes, size)
        if isinstance(axes, str):
            return axes
        padded = [pad_rows(a, axes[j], self.n, size) if j in axes else a for j, a in enumerate(args)]
        bound, user, graph = self._lower(sub, padded, weights)
        slot = _Slot(ops, shapes, graph, bound, None)
        return slot, user, slot.prove(axes)

    def _probe(self, k: int, ops: tuple, args, weights) -> tuple | str:
        """Piece `k` proven at a size no fixed size of the graph has (once): a bucket size equal to a model
        dimension (8, 16, 64) can make a broadcast over that dimension pass for the rows', a false alarm."""
        if k not in self.probed:
            size = probe_size(self.graph.gm, self.n + 1, avoid=self.size)
            got = self._lower_at(size, k, ops, args, weights)
            self.probed[k] = got if isinstance(got, str) else got[2]
        return self.probed[k]

    def _proof(self, slot: _Slot, axes, k, ops, args, weights) -> tuple | str:
        rows = slot.prove(axes)
        return rows if not isinstance(rows, str) or isinstance(self._probe(k, ops, args, weights), str) \
            else self._probe(k, ops, args, weights)

    def _finish(self, bound, user, graph, config, label, k, ops, shapes=None):
        with torch.no_grad():
            bound(*user)  # records the output structure on real tensors (export ran it on fake ones)
        done = compile_graph(graph, config, user, bound, label, prior=self.first.get(k))
        self.first.setdefault(k, done)
        self.compiled += 1
        shapes = shapes or [None if i in bound.weight_positions else tuple(a.shape)
                            for i, a in enumerate(bound.full_args(user))]
        return _Slot(ops, shapes, graph, bound, done)

    def _slot(self, k, ops, args, weights, config, label) -> _Slot | str:
        """Piece `k` compiled at the bucket size (once), or why it cannot be."""
        slot = self.slots.get((self.size, k))
        if slot is None:
            got = self._lower_at(self.size, k, ops, args, weights)
            if not isinstance(got, str):
                low, user, rows = got
                if isinstance(rows, str) and not isinstance(self._probe(k, ops, args, weights), str):
                    rows = ""  # proven at the probe size: the refusal at the bucket size was a coincidence
                got = rows if isinstance(rows, str) and rows else self._finish(
                    low.bound, user, low.graph, config, f"{label} (bucket {self.size})", k, ops, low.shapes)
            slot = self.slots[(self.size, k)] = got
        return slot

    def piece(self, fused, node, k: int, args: Sequence[Any], config: CompileConfig, label: str):
        """Piece `k` of `fused` (the program partitioned at this call's size) as a module, and its
        CompiledSignature."""
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise CannotSplit(f"{label} takes a python value computed outside it")
        sub = getattr(fused, str(node.target))
        ops = (_ops(sub), tuple(str(a.dtype) for a in args))  # a piece is its ops on its dtypes
        weights = {i for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node) and a.op == "get_attr"}
        bound_n = Bound(sub, args, weights, placeholders(sub))
        with torch.no_grad():
            want = list(bound_n(*bound_n.user_args(args)))  # the piece in PyTorch at n: the reference
        if self.size == self.n:  # a bucket size itself: its program is the bucket's (proven when padded to)
            slot = self.slots.get((self.size, k))
            if not isinstance(slot, _Slot) or slot.ops != ops or self._axes(args, slot.shapes, self.size) != {}:
                slot = self._finish(*self._lower(sub, args, weights), config, f"{label} (bucket {self.size})", k, ops)
                self.slots[(self.size, k)] = slot
            return _Piece(slot.bound, slot.done.executable), slot.done
        slot = self._slot(k, ops, args, weights, config, label)
        axes = slot if isinstance(slot, str) else self._axes(args, slot.shapes, self.size) if slot.ops == ops else \
            "its dtypes differ from the bucket program's"
        out = self._proof(slot, axes, k, ops, args, weights) if not isinstance(axes, str) else axes
        if not isinstance(out, str):
            padded = _Padded(slot, self.size, self.n, axes, out, bound_n)
            with torch.no_grad():
                got = padded.flat(args)
            if [tuple(g.shape) for g in got] != [tuple(w.shape) for w in want]:
                out = "its outputs cut to the real rows do not have the shapes of the piece's"
            else:
                out = self.mismatch(got, want)
                out = f"padded, it does not match PyTorch ({out})" if out else padded
        if not isinstance(out, str):
            return out, slot.done
        reasons = self.per_size.setdefault(k, {})
        full = self.graph.config.no_room(reasons, self.n, "sizes")
        if full:
            raise CannotSplit(f"{label} was {full} because {out}")
        reasons[self.n] = out
        own = self._finish(*self._lower(sub, args, weights), config, f"{label} ({self.n} rows)", k, ops)
        return _Piece(own.bound, own.done.executable), own.done
