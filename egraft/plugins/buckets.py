"""A size Dynamo made dynamic, covered by a few compiles: the bucket ladder and the padding runner.

A Dynamo graph with a symbolic size (sequence length, batch, vLLM's
``num_tokens``) is called with a new concrete size again and again.
Compiling each one on its own costs a search per size (in generation with
a dynamic KV cache, one per decode step).  Instead, when egraft can prove
that the rows along that size never meet (:func:`egraft.ir.rows.row_axes`
on the graph traced at the padded size), a call of size ``n`` runs the
program compiled for the bucket ``N >= n`` (:func:`bucket`): the inputs are
padded along the size with copies of their last real row (real values, so
no NaN or inf appears from padding), and the outputs are cut back to ``n``
rows.  Padded rows never meet the real ones, so the cut outputs are the
graph's own at size ``n``; each new size is still checked once against
the graph run in PyTorch (``validate``).  The first bucket is searched;
later buckets reuse its winner's backend and knobs
(:func:`egraft.search.pipeline.compile_like`: a lowering and a check, no
search).

The proof is made on the graph traced at the bucket size.  A bucket size
that equals a fixed size of the model (8, 16, 64: a head dim) can make an
``arange`` over that dimension look like the rows' own index and the proof
refuse; then it is made once more at a probe size no fixed size of the FX
graph has, and holds for the FX graph's every size (one symbolic program).

What is padded is read from the FX graph (:func:`plan`): the one symbol of
the graph's symbolic sizes, each tensor input's axis of it, the ``SymInt``
arguments equal to it, and each output's axis of it.  A graph with several
symbols, a size used as a value (``x * n``, ``arange(n, n + 1)``: the padded
size would leak into real rows), a size output or a proof that fails is not
bucketed: the caller runs it in PyTorch with one warning that says why (or
compiles each size, ``dynamic="per_size"``).  A graph with an op egraft
cannot lower (:class:`SplitGraph`) is not padded whole: its egraft pieces are,
each proven on its own, while the ops left to PyTorch run at the real size
(:class:`egraft.plugins.partition.PieceBuckets`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from ..errors import InputError, TraceError, UnsupportedOpError, ValidationError
from ..ir.rows import row_axes
from .binding import Bound, signature
from . import stats
from .exported import compile_graph, device_of, export

STEPS = ((256, 8), (None, 16))  # every 8 up to 256, every 16 beyond (after 1, 2, 4, 8), as vLLM's capture sizes
WAY_IN = ("for transformers generation, a fixed-size cache keeps one shape: generate(..., "
          "cache_implementation=\"static\"); options={\"dynamic\": \"per_size\"} compiles each size on its own "
          "(up to max_shapes) instead")


def ladder(limit: int) -> list[int]:
    """The default bucket sizes up to the first one >= `limit`: 1, 2, 4, 8, 16, 24, ..., 256, 272, 288, ..."""
    sizes = [1, 2, 4, 8]
    while sizes[-1] < limit:
        step = next(s for top, s in STEPS if top is None or sizes[-1] < top)
        sizes.append(sizes[-1] + step)
    return sizes


def bucket(n: int, sizes: Sequence[int] | str = "buckets") -> int | None:
    """The bucket of size `n`: the smallest size of the ladder (or of `sizes`) >= n; None above a given list."""
    if n < 1:
        return None
    pool = ladder(n) if isinstance(sizes, str) else sizes
    return next((s for s in sorted(pool) if s >= n), None)


@dataclass(frozen=True)
class Plan:
    """What varies in a Dynamo graph: its one size symbol, where it appears in the arguments and outputs."""

    symbol: Any
    tensors: tuple[tuple[int, int], ...]  # (argument position, axis of the size)
    ints: tuple[int, ...]  # positions of SymInt arguments equal to the size
    outputs: tuple[int | None, ...]  # per tensor output: its axis of the size (None: it has none)

    def size(self, args: Sequence[Any]) -> int:
        if self.tensors:
            pos, ax = self.tensors[0]
            return int(args[pos].shape[ax])
        return int(args[self.ints[0]])

    def uniform(self, args: Sequence[Any]) -> bool:
        """Whether every varying size of `args` is the same (one symbol; several equal at this call)."""
        n = self.size(args)
        return all(int(args[p].shape[a]) == n for p, a in self.tensors) and all(int(args[p]) == n for p in self.ints)

    def pad(self, args: Sequence[Any], n: int, size: int) -> list:
        """`args` with every tensor padded from `n` to `size` rows (:func:`pad_rows`); the size arguments set to
        `size`."""
        out = list(args)
        for pos, ax in self.tensors:
            out[pos] = pad_rows(args[pos], ax, n, size)
        for pos in self.ints:
            out[pos] = size
        return out

    def cut(self, outs: Sequence[torch.Tensor], n: int, size: int) -> list[torch.Tensor]:
        return [o if size == n else cut_rows(o, ax, n) for o, ax in zip(outs, self.outputs)]


# --- the padding mechanism, shared by whole graphs (Buckets) and pieces (partition.PieceBuckets) ---------------

def pad_rows(t: torch.Tensor, ax: int, n: int, size: int) -> torch.Tensor:
    """`t` padded from `n` to `size` rows along `ax` with copies of its last real row (real values only, so no
    NaN or inf appears from padding), or cut to `size` rows when `size` is below `n`."""
    if size > n:
        last = t.narrow(ax, n - 1, 1)
        return torch.cat([t, last.expand(*[size - n if d == ax else -1 for d in range(t.dim())])], ax)
    return t.narrow(ax, 0, size) if size < n else t


def cut_rows(t: torch.Tensor, ax: int | None, n: int) -> torch.Tensor:
    """An output of a padded call cut back to its first `n` rows along `ax` (None: it has no rows)."""
    return t if ax is None else t.narrow(ax, 0, n).contiguous()


def prove_rows(graph, bound: Bound, axes: dict[int, int]):
    """:func:`egraft.ir.rows.row_axes` of `graph` (traced through `bound`) with each user argument's varying
    axis (`axes`: user position -> axis)."""
    varying = {spec.name: axes[p] for spec, p in zip(graph.signature.call_inputs, bound.user_positions) if p in axes}
    return row_axes(graph, varying)


def probe_size(gm: torch.fx.GraphModule, start: int, avoid: int = 0) -> int:
    """The first size from `start` that no fixed size of `gm` has (nor `avoid`): proven there, a proof holds
    for every size of the symbolic graph, not by a coincidence of lengths (a bucket size equal to a head dim)."""
    fixed = {int(d) for node in gm.graph.nodes for v in [_value(node)]
             if isinstance(v, torch.Tensor) for d in v.shape if not isinstance(d, torch.SymInt)}
    return next(p for p in range(start, 10 ** 6) if p not in fixed and p != avoid)


_VALUE_OPS = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
              operator.pow, operator.neg, operator.lt, operator.le, operator.gt, operator.ge, operator.eq}
_VALUE_NAMES = {"add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "pow", "clamp", "fill_",
                "masked_fill", "where", "tensor", "as_tensor", "scalar_tensor", "full_like", "rsub", "maximum",
                "minimum", "lt", "le", "gt", "ge", "eq", "ne", "add_", "mul_", "sub_", "div_", "fill"}


def _value(n: torch.fx.Node):
    return n.meta.get("example_value", n.meta.get("val"))


def _symbols(v) -> list:
    dims = [v] if isinstance(v, torch.SymInt) else list(v.shape) if isinstance(v, torch.Tensor) else []
    exprs = [d.node.expr if isinstance(d, torch.SymInt) else None for d in dims]
    return [None if e is None or e.is_number else e for e in exprs]  # a SymInt may hold a known number


def _as_value(user: torch.fx.Node, size: torch.fx.Node) -> bool:
    """Whether `user` reads the size node `size` as a number (not as a shape or an end of arange from 0)."""
    if not isinstance(_value(user), torch.Tensor):
        return False  # arithmetic on sizes (another SymInt), checked where that one is used
    name = user.target if user.op == "call_method" else getattr(user.target, "__name__", str(user.target))
    if user.op == "call_function" and user.target in _VALUE_OPS or name in _VALUE_NAMES:
        return True
    direct = [i for i, a in enumerate(user.args) if a is size] + [k for k, a in user.kwargs.items() if a is size]
    if name == "arange":  # arange(n) and arange(0, n) are row numbers; any other use of n is a value
        a = list(user.args)
        ends = (a == [size] and not user.kwargs) or (len(a) == 2 and a[0] == 0 and a[1] is size)
        return bool(direct) and not ends
    if name in ("full", "new_full"):  # the fill value: full(size, fill), x.new_full(size, fill)
        return any(k == "fill_value" or (isinstance(k, int) and k >= (1 if name == "full" else 2)) for k in direct)
    return False


def plan(gm: torch.fx.GraphModule, names: Sequence[torch.fx.Node], weights: frozenset[int],
         several: bool = False) -> Plan | str | None:
    """The :class:`Plan` of a dynamic graph, or why its size cannot be bucketed (None: no size varies).

    `several`: sizes of several symbols are padded together, all to the same bucket (vLLM's graph has
    one symbol for its token ids and one for its positions, equal at every call: :meth:`Plan.uniform`);
    only for a split graph's pieces, each proven on its own (the plan then has no output axes).
    """
    symbols, tensors, ints = set(), [], []
    for pos, node in enumerate(names):
        syms = _symbols(_value(node))
        odd = next((s for s in syms if s is not None and not s.is_Symbol), None)
        if odd is not None:
            return f"input {node.name} has a size {odd}"
        found = [d for d, s in enumerate(syms) if s is not None]
        if pos in weights and found:
            return f"the weight {node.name} has a dynamic size"
        symbols.update(syms[d] for d in found)
        if found and isinstance(_value(node), torch.SymInt):
            ints.append(pos)
        elif found:
            tensors.append((pos, found))
    if not symbols:
        return None  # every symbolic size is a known number: one signature, compiled as a static graph
    if len(symbols) != 1 and not several:
        return f"{len(symbols)} sizes vary ({', '.join(sorted(map(str, symbols)))}); only one can be padded"
    if any(len(found) > 1 for _, found in tensors):
        return "an input has the varying size on several axes"
    tensors = [(pos, found[0]) for pos, found in tensors]
    sym = next(iter(symbols)) if len(symbols) == 1 else frozenset(symbols)
    for node in gm.graph.nodes:
        if isinstance(_value(node), torch.SymInt):
            for user in node.users:
                if _as_value(user, node):
                    return f"a size is used as a number in {user.format_node()[:120]}"
    if len(symbols) > 1:
        return Plan(sym, tuple(tensors), tuple(ints), ()) if tensors else "no tensor input has the varying size"
    out = next(n for n in gm.graph.nodes if n.op == "output")
    axes = []
    for leaf in pytree.tree_leaves(out.args[0]):
        v = _value(leaf) if isinstance(leaf, torch.fx.Node) else leaf
        if isinstance(v, torch.SymInt):
            return "the graph returns a size"
        if not isinstance(v, torch.Tensor):
            continue
        syms = _symbols(v)
        found = [d for d, s in enumerate(syms) if s is not None and sym in s.free_symbols]
        if len(found) > 1 or any(syms[d] != sym for d in found):
            return f"an output has shape {tuple(v.shape)}, not the varying size on one axis"
        axes.append(found[0] if found else None)
    if not tensors:
        return "no tensor input has the varying size"
    return Plan(sym, tuple(tensors), tuple(ints), tuple(axes))


@dataclass
class PaddedSize:
    """The program compiled at one padded size, and how to use it for a smaller one."""

    size: int
    entry: Any  # the DynamoGraph's Entry at the padded signature
    done: Any  # the CompiledSignature behind it


class Padded:
    """A call of `n` rows run on a bucket's program: pad the arguments, run, cut the outputs (an Entry's protocol)."""

    fallback_ops: dict = {}

    def __init__(self, plan_: Plan, b: PaddedSize, n: int):
        self.plan, self.bucket, self.n = plan_, b, n
        self.bound, self.run, self.compiled = b.entry.bound, b.entry.run, []  # its programs are the bucket's

    @property
    def results(self) -> list:
        return []

    def __call__(self, gm, args):
        padded = self.plan.pad(args, self.n, self.bucket.size)
        with torch.no_grad():
            outs = self.run(*self.bound.user_args(padded))
            return self.bound.rebuild(self.plan.cut(outs, self.n, self.bucket.size))


class SplitGraph(str):
    """The refusal of a graph egraft can only compile split (`op` does not lower): the graph is not padded
    whole; its pieces are (:class:`egraft.plugins.partition.PieceBuckets`, each piece proven on its own)."""

    op: str = ""


class Buckets:
    """The bucket runner of one DynamoGraph: its plan, the buckets compiled, and why it stopped bucketing."""

    def __init__(self, graph, make_entry: Callable, mismatch: Callable):
        self.graph, self.make_entry, self.mismatch = graph, make_entry, mismatch
        self.plan = plan(graph.gm, graph._names, graph._weights)
        self.refused = self.plan if isinstance(self.plan, str) else ""
        # several sizes cannot be padded whole, but a split graph's pieces can (each proven apart)
        self.several = plan(graph.gm, graph._names, graph._weights, several=True) if self.refused else None
        self.compiled: dict[int, PaddedSize] = {}
        self.probed: str | None = None  # the proof at a probe size (None: not needed yet)

    def entry(self, key, args):
        """The entry for a call of signature `key`: a bucket's program (padded), PyTorch with one warning, or
        None for a graph that compiles only split (:class:`SplitGraph`: the caller pads its pieces instead)."""
        g, cfg = self.graph, self.graph.config
        if isinstance(self.refused, SplitGraph):
            return None
        if self.refused and isinstance(self.several, Plan):  # once: does it compile only split?
            several, self.several = self.several, None
            traced = self._trace(list(args))
            if isinstance(traced, SplitGraph):
                self.plan, self.refused = several, traced
                return None
        if self.refused:
            return self._eager(key, self.refused)
        n = self.plan.size(args)
        size = bucket(n, cfg.dynamic)
        if n < 1:
            return g._eager(key, "a call with 0 rows runs in PyTorch")
        if size is None:
            return g._eager(key, f"size {n} is above every bucket size of the dynamic option {list(cfg.dynamic)}; "
                                 "add a larger one")
        b = self.compiled.get(size)
        if b is None or b.entry.bound.stale(args):
            full = cfg.no_room(self.compiled, size, "bucket sizes")
            if full:
                return g._eager(key, f"{full}; further sizes run in PyTorch")
            b = self._compile(size, args, n)
            if isinstance(b, SplitGraph):
                self.refused = b
                return None  # the caller compiles this size on its own
            if isinstance(b, str):
                return self._eager(key, b)
        entry = b.entry if size == n else Padded(self.plan, b, n)
        if cfg.validate and size != n:
            with torch.no_grad():
                problem = self.mismatch(_flat(entry(g.gm, args)), _flat(g.gm(*args)))
            if problem:
                self.refused = (f"its program padded from {n} to {size} rows does not match PyTorch ({problem}); "
                                "please report this as an egraft bug")
                return self._eager(key, self.refused)
        g.entries[key] = entry
        return entry

    def _eager(self, key, why: str):
        self.refused = why
        return self.graph._eager(key, f"Dynamo marked a size dynamic and egraft cannot pad it to a few "
                                      f"compiled sizes: {why}. So the graph runs in PyTorch rather than compile "
                                      f"for every size; {WAY_IN}")

    def _trace(self, padded: list):
        """The bound graph at `padded`'s size, its user tensors and its IR graph, or why it does not trace."""
        g = self.graph
        # new tensor objects for the user's: torch.export would read torch._dynamo.mark_dynamic's marks on them
        padded = [a.detach() if isinstance(a, torch.Tensor) and i not in g._weights else a
                  for i, a in enumerate(padded)]
        bound = Bound(g.gm, padded, g._weights, g._names)
        user = bound.user_args(padded)
        try:
            return bound, user, export(bound, user).lower()
        except (TraceError, InputError) as e:
            return str(e).strip().splitlines()[0]
        except UnsupportedOpError as e:
            refusal = SplitGraph(f"it uses {e.op}, which egraft cannot lower")
            refusal.op = e.op
            return refusal

    def _prove(self, bound: Bound, graph) -> str:
        """Why the rows of `graph` (traced at one size) may meet, or '' when they are proven apart."""
        rows = prove_rows(graph, bound, dict(self.plan.tensors))
        if not rows.independent:
            return f"its rows meet at {rows.reason}"
        wrong = [k for k, (r, a) in enumerate(zip(rows.axes, self.plan.outputs)) if r is not None and r != a]
        if wrong or len(rows.axes) != len(self.plan.outputs):
            return f"the rows of output {wrong[0] if wrong else 0} lie on another axis than its dynamic size"
        return ""

    def _probe(self, args: Sequence[Any], n: int) -> str:
        """The proof at a size no fixed size of the graph has (once): a bucket size equal to a model dimension
        (8, 16, 64, ...) lets an ``arange`` over that dimension pass for the rows' own index, a false alarm."""
        if self.probed is None:
            size = probe_size(self.graph.gm, 3)
            traced = self._trace(self.plan.pad(args, n, size))
            self.probed = traced if isinstance(traced, str) else self._prove(traced[0], traced[2])
        return self.probed

    def _compile(self, size: int, args: Sequence[Any], n: int) -> PaddedSize | str:
        g, cfg = self.graph, self.graph.config
        padded = self.plan.pad(args, n, size)
        traced = self._trace(padded)
        if isinstance(traced, str):
            return traced
        bound, user, graph = traced
        if size > 1:  # one row cannot meet another
            why = self._prove(bound, graph)
            if why and not self._probe(args, n):
                why = ""  # proven at the probe size: the refusal at this size was a coincidence of lengths
            if why:
                return why
        with torch.no_grad():
            bound(*user)  # the output structure Bound.rebuild puts outputs back into
        prior = next(iter(self.compiled.values()), None)
        try:
            done = compile_graph(graph, cfg.with_(device=device_of(padded, cfg)), user, bound,
                                 label=f"{g.label} (bucket {size})", prior=prior.done if prior is not None else None)
        except ValidationError as e:
            return (f"its compiled program does not match PyTorch ({str(e).splitlines()[0]}); please report this "
                    "as an egraft bug")
        g.compiles += 1
        stats.compiled()
        entry = self.make_entry(bound, _runner(done.executable), [done])
        g.entries[signature(padded, g._weights)] = entry
        self.compiled[size] = PaddedSize(size, entry, done)
        return self.compiled[size]


def _runner(exe):
    def run(*user):
        return exe.run_torch(list(user))

    return run


def _flat(out) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


__all__ = ["Buckets", "Padded", "PaddedSize", "Plan", "STEPS", "bucket", "cut_rows", "ladder", "pad_rows", "plan",
           "probe_size", "prove_rows"]
