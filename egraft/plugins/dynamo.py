"""``torch.compile(model, backend="egraft")``: egraft as a TorchDynamo backend.

Registered through the ``torch_dynamo_backends`` entry point, so after
``pip install egraft`` the name resolves without importing egraft.  Dynamo
hands :func:`egraft_backend` each captured graph (a ``GraphModule`` over
torch functions, the module's parameters and buffers lifted to inputs); the
backend returns a :class:`DynamoGraph`, which compiles on the first call
per input signature:

1. the graph is rebound as a module with its weights as buffers and only
   the user's tensors as inputs (:mod:`.binding`), run once in PyTorch for
   its output structure and the reference outputs, and ``torch.export``-ed;
2. the whole program is lowered and compiled through the pipeline every
   entry point shares (:mod:`.exported`, ``egraft.search.pipeline``: search,
   the winner's executable, the check against the bound graph in PyTorch);
3. if an op has no lowering, the program is split: lowerable pieces are
   compiled the same way, the rest runs in PyTorch, with ONE
   :class:`EgraftFallbackWarning` naming the ops (:mod:`.partition`), and
   the split graph is checked as a whole against the PyTorch outputs of
   step 1 (the one check, ``egraft.measure.check``);
4. a program that disagrees with PyTorch warns and runs the graph in
   PyTorch, never returns wrong numbers.

A graph that writes into its inputs (a static KV cache updated in place)
is compiled with those inputs as ``state``, and the new values are left in
the caller's tensors, in place (:mod:`.state`).  A graph that cannot be
exported, writes into a module buffer, or cannot be split (a graph with
state is never split) runs in PyTorch, with one warning saying why; so does
a signature whose search cannot start because the graph's own program fails
its check on the first inputs (:meth:`DynamoGraph._unsearchable`).  Any
other error (a bad option, a broken backend) is raised.  Dynamic shapes:
SymInts arrive as ints at call time;
a size whose rows egraft proves independent is padded to a few bucket
sizes, each compiled once (:mod:`.buckets`); a graph whose size cannot be
bucketed runs in PyTorch with one warning, or with ``dynamic="per_size"``
each signature is compiled on its own, up to ``max_shapes`` per graph.  A
dynamic graph that compiles only split has its pieces padded instead
(:class:`.partition.PieceBuckets`): each new size is partitioned again, the
PyTorch parts run at the real size, each piece runs a bucket's program.
Outputs carry no autograd history (egraft compiles inference).
"""

from __future__ import annotations

import itertools
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..errors import InputError, SearchError, TraceError, UnsupportedOpError, ValidationError
from ..ir import dtypes
from ..measure import outputs, tolerance
from ..search.config import CompileConfig
from .binding import Bound, is_weight, placeholders, signature, written_in_place
from .buckets import Buckets
from .exported import compile_exported, device_of, export
from . import serialize, stats
from .partition import CannotSplit, PieceBuckets, split_compile
from .state import compile_stateful, mutated_positions
from .uninitialized import filled_allocations

WHERE = "the egraft torch.compile backend"
# A torch.compile call blocks the first forward pass, so the default search is short (the search cache makes
# the next compile of the same graph return at once); the device is the inputs' own; no progress bar.
# A graph that writes into its inputs (a static KV cache) is searched over the backends that write the caller's
# tensors in place (.state).
DEFAULTS = {"budget": "10s", "device": None, "progress": False, "state_in_place": True}

_GRAPH_IDS = itertools.count(1)
log = logging.getLogger("egraft.plugins")


class EgraftFallbackWarning(UserWarning):
    """Part or all of a graph handed to the egraft backend runs in PyTorch instead."""


def egraft_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None,
                   mode: str | None = None, **kwargs) -> "DynamoGraph":
    """The TorchDynamo backend: ``torch.compile(model, backend="egraft", options={...})``.

    ``options``: the fields of :class:`egraft.search.config.CompileConfig`
    (``budget``, ``device``, ``backend``, ``fitness``, ``rules``, ``limits``,
    ``seed``, ``cache``, ``validate``, ``max_shapes``, ``progress``, ...), over
    those of ``$EGRAFT_DYNAMO_OPTIONS``, over this backend's defaults
    (:data:`DEFAULTS`); keyword arguments are merged into them (for
    ``functools.partial(egraft_backend, budget=...)``).  ``mode`` is an
    Inductor setting egraft does not use: anything but the default is an
    error rather than silently ignored.  ``example_inputs`` are not needed:
    compilation happens on the first call per signature, with real inputs
    (Dynamo's may be fake tensors or SymInts).
    """
    del example_inputs
    if mode not in (None, "default"):
        raise InputError(f"torch.compile mode={mode!r} is an Inductor setting; the egraft backend takes "
                         "options={'budget': ..., 'fitness': ...} instead")
    return DynamoGraph(gm, CompileConfig.parse(options, env=True, where=WHERE, defaults=DEFAULTS, **kwargs))


@dataclass
class Entry:
    """One compiled signature: ``run`` maps the user tensors to the flat tensor outputs (None: PyTorch)."""

    bound: Bound | None
    run: Callable[..., list] | None
    compiled: list = field(default_factory=list)  # the CompiledSignatures behind it (a split graph: one per piece)
    fallback_ops: dict = field(default_factory=dict)  # ops left to PyTorch -> their source line

    @property
    def results(self) -> list:  # the SearchResults behind it
        return [c.result for c in self.compiled]

    def __call__(self, gm, args):
        if self.run is None:
            return gm(*args)
        with torch.no_grad():
            return self.bound.rebuild(self.run(*self.bound.user_args(args)))


class DynamoGraph:
    """What the backend returns to Dynamo: the graph, compiled per input signature on first call."""

    def __init__(self, gm: torch.fx.GraphModule, config: CompileConfig, weight_names=(), dynamic=None):
        # weight_names / dynamic: what a graph read back from a compile cache (.serialize) lost of its
        # placeholders' metadata: the parameters and buffers among them, and those with symbolic sizes
        self.gm, self.config = _plain_data_reads(gm), config
        self._weight_names, self._dynamic = frozenset(weight_names), dynamic
        self.label = f"dynamo graph {next(_GRAPH_IDS)}"
        self.entries: dict[tuple, Entry] = {}
        self._names = placeholders(gm)
        self._weights: frozenset[int] | None = None  # positions of the parameters and buffers, found on 1st call
        self._warned: set[str] = set()
        self._buckets: Buckets | None = None  # the bucket runner of a graph with a dynamic size
        self._pieces: PieceBuckets | None = None  # the pieces of a dynamic graph that compiles only split
        self.compiles = 0  # programs egraft compiled for this graph (signatures, buckets; a split graph's: one)
        stats.graph_received(bool(self._dynamic_dims()))

    def __call__(self, *args):
        if self._weights is None:
            written = written_in_place(self.gm)  # written in place: the caller's state, never a bound weight
            self._weights = frozenset(i for i, (n, a) in enumerate(zip(self._names, args))
                                      if isinstance(a, torch.Tensor) and n.name not in written
                                      and (is_weight(n, a) or n.name in self._weight_names))
        key = signature(args, self._weights)
        entry = self.entries.get(key)
        if entry is None or (entry.bound is not None and entry.bound.stale(args)):
            entry = self._build(key, args)
        stats.called(entry.run is not None)
        return entry(self.gm, args)

    @property
    def results(self) -> list:
        """The SearchResult of every compiled graph or piece, over all signatures."""
        return [r for e in self.entries.values() for r in e.results]

    def _warn(self, message: str) -> None:
        """Each distinct message once per graph (a new input shape does not repeat it)."""
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"egraft: {self.label}: {message}", EgraftFallbackWarning, stacklevel=4)

    def _eager(self, key, why: str) -> Entry:
        self._warn(f"runs in PyTorch, not egraft: {why}")
        stats.eager(why)
        self.entries[key] = Entry(None, None)
        return self.entries[key]

    def weight_names(self) -> set[str]:
        """The placeholders that are a module's parameters or buffers, by their Dynamo metadata (and hints)."""
        return {n.name for n in self._names if n.name in self._weight_names
                or is_weight(n, n.meta.get("example_value", n.meta.get("val")))}

    # torch's SerializableCallable (vLLM's compile cache in mode 2): see egraft.plugins.serialize
    @classmethod
    def serialize_compile_artifacts(cls, fn: "DynamoGraph") -> bytes:
        return serialize.dumps(fn)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes):
        return serialize.loads(data)

    def _unsearchable(self, key, e: SearchError) -> Entry:
        """A search that cannot start on this signature's first inputs: the graph's own program already
        disagrees with its float64 reference there (a serving engine's warm-up run computes on unfilled
        buffers, whose values may overflow); that signature runs in PyTorch rather than stopping the server."""
        return self._eager(key, f"egraft could not search it on its first inputs ({_first_line(e)})")

    def _dynamic_dims(self) -> list[str]:
        """The placeholders Dynamo made symbolic (a SymInt, or a tensor with a symbolic dim), by name."""
        if self._dynamic is not None:
            return list(self._dynamic)
        out = []
        for n in self._names:
            v = n.meta.get("example_value", n.meta.get("val"))
            if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor)
                                               and any(isinstance(s, torch.SymInt) for s in v.shape)):
                out.append(n.name)
        return out

    def _build(self, key, args) -> Entry:
        cfg = self.config
        dynamic = self._dynamic_dims()
        if dynamic and cfg.dynamic != "per_size":
            self._buckets = self._buckets or Buckets(self, Entry, mismatch)
            if self._buckets.plan is not None:
                entry = self._buckets.entry(key, args)
                if entry is not None:
                    return entry
                # a graph that compiles only split (the one way Buckets.entry gives None): its pieces are padded
                self._pieces = self._pieces or PieceBuckets(self, self._buckets.plan, mismatch)
                try:
                    return self._build_split(key, args, self._pieces.at(self._buckets.plan.size(args), args))
                except CannotSplit as e:
                    return self._eager(key, str(e))
        if dynamic:  # said once, before the first compile, so a caller knows what each new size costs
            self._warn(f"Dynamo marked sizes of {', '.join(dynamic[:4])}{' ...' if len(dynamic) > 4 else ''} "
                       f"dynamic; egraft compiles each new size on its own (up to max_shapes={cfg.max_shapes}, "
                       "then PyTorch)" + (f", because {self._buckets.refused}" if self._buckets is not None
                                          and self._buckets.refused else " (the dynamic=\"per_size\" option)")
                       + "; in transformers' generate, cache_implementation=\"static\" keeps one shape per step")
        full = cfg.no_room(self.entries, key, "input shapes")
        if full:
            message = f"{full}; further shapes run in PyTorch"
            if message not in self._warned:
                stats.eager("max_shapes reached")  # once per graph; its calls are counted as PyTorch's
            self._warn(message)
            return Entry(None, None)
        return self._build_split(key, args)

    def _build_split(self, key, args, pieces: PieceBuckets | None = None) -> Entry:
        """Export and compile one signature: whole, else split (`pieces`: straight to a split whose pieces are
        padded to bucket sizes, :class:`.partition.PieceBuckets`)."""
        bound = Bound(self.gm, args, self._weights, self._names)
        user = bound.user_args(args)
        cfg = self.config.with_(device=device_of(args, self.config))
        try:  # export runs on fake tensors: a write into a module buffer is refused before it runs for real
            exported = export(bound, user, inputs_state=True)
        except (TraceError, InputError) as e:
            return self._eager(key, _first_line(e))
        except UnsupportedOpError as e:
            return self._eager(key, e.op)
        mutated = mutated_positions(exported)  # inputs the graph writes into (a static KV cache): state (.state)
        # the output structure, and the reference for a split graph's check (state: on clones; unspecified memory
        # zeroed, as in the check's own run: plugins.uninitialized)
        with torch.no_grad(), filled_allocations():
            want = bound(*[u.clone() if k in mutated else u for k, u in enumerate(user)])
        try:
            if pieces is not None:
                raise UnsupportedOpError(self._buckets.refused.op)  # known not to lower whole: no second try
            self.compiles += 1
            if mutated:
                run, done = compile_stateful(exported, cfg, user, bound, self.label)
            else:
                done = compile_exported(exported, cfg, user, bound, label=self.label)
                run = _runner(done.executable)
            entry = Entry(bound, run, [done])
            stats.compiled()
            log.info("egraft: %s compiled whole for inputs %s", self.label, _shapes(user))
        except ValidationError as e:
            return self._eager(key, f"its compiled program does not match PyTorch ({_first_line(e)}); "
                                    "please report this as an egraft bug")
        except SearchError as e:
            return self._unsearchable(key, e)
        except UnsupportedOpError as first:
            if mutated:  # the pieces of a split graph are pure: none could hand the state back
                return self._eager(key, f"it uses {first.op}, which egraft cannot lower, and it writes into its "
                                        "inputs, which a graph split between egraft and PyTorch cannot do")
            try:
                split = split_compile(exported.program, user, cfg, pieces=pieces)
            except SearchError as e:
                return self._unsearchable(key, e)
            except CannotSplit as e:
                return self._eager(key, f"it uses {first.op}, which egraft cannot lower, and {e}")
            except ValidationError as e:
                return self._eager(key, f"a compiled piece does not match PyTorch ({_first_line(e)}); "
                                        "please report this as an egraft bug")
            ops = "; ".join(f"{op}" + (f" (at {src})" if src else "") for op, src in split.fallback_ops.items())
            self._warn(f"operators egraft cannot lower run in PyTorch: {ops}; "
                       f"the rest of the graph ({len(split.results)} piece(s)) is compiled by egraft")
            if pieces is not None:
                self._warn_pieces(pieces)
            entry = Entry(bound, split, split.compiled, split.fallback_ops)
            if self.config.validate:
                with torch.no_grad(), filled_allocations():
                    problem = mismatch(entry.run(*user), want)
                if problem:
                    return self._eager(key, f"its compiled program does not match PyTorch on the first inputs "
                                            f"({problem}); please report this as an egraft bug")
            new = len(split.results) if pieces is None else pieces.compiled
            self.compiles += pieces is not None and new > 0
            stats.split(new, split.fallback_ops) if new else stats.split_reused()
            log.info("egraft: %s compiled in %d piece(s) for inputs %s (%d new); %d op(s) run in PyTorch",
                     self.label, len(split.results), _shapes(user), new, len(split.fallback_ops))
        self.entries[key] = entry
        return entry

    def _warn_pieces(self, pieces: PieceBuckets) -> None:
        self._warn(f"Dynamo marked a size dynamic and the graph compiles only split ({self._buckets.refused}): "
                   "each egraft piece runs the program of a bucket size, its inputs padded; the ops left to "
                   "PyTorch run at the real size")
        for k, why in pieces.per_size.items():
            self._warn(f"piece {k + 1} is compiled for each size (up to max_shapes={self.config.max_shapes}), "
                       f"not padded: {next(iter(why.values()))}")


serialize.register(DynamoGraph)


def _plain_data_reads(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``param.data`` reads (``torch._C._autograd._get_data_attr``, vLLM's norms) as ``detach``, in place.

    Both give the same values without autograd history; ``torch.export``
    cannot trace the former through a bound buffer (it lifts the result as a
    fake constant), and egraft compiles inference only.
    """
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch._C._autograd._get_data_attr:
            node.target, changed = torch.detach, True
    if changed:
        gm.recompile()
    return gm


def _shapes(user) -> str:
    return ", ".join("x".join(map(str, t.shape)) or "scalar" for t in user)


def _runner(exe):
    def run(*user):
        return exe.run_torch(list(user))

    return run


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def mismatch(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> str:
    """Why a split graph's flat outputs ``got`` do not match ``want``, or '' when they do.

    The one check (``egraft.measure.check.outputs``); with no single graph to
    derive a budget from, each float output may differ by its dtype's
    model-level tolerance (``egraft.measure.tolerance``); devices must match
    too.
    """
    for k, (g, w) in enumerate(zip(got, want)):
        if g.device != w.device:
            return f"output {k} is on {g.device}, PyTorch gives {w.device}"
    c = outputs(got, want, [tolerance(dtypes.from_torch(w.dtype)) for w in want], same_dtype=True)
    return c.message or ("" if c.ok else "the outputs differ")
