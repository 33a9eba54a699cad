"""The saturation engine: one egglog e-graph with the rules loaded, run under hard limits.

egglog itself has iteration counts and a back-off scheduler but no e-node or
time limit, and one iteration of comm/assoc can grow an e-graph 100x.  So:

* the *safe* rules run one iteration per ``run`` call, and the limits
  (iterations, e-nodes, seconds) are checked between iterations;
* the *explosive* rules (``RuleSpec.explosive``) run as one bounded step:
  ``explosive_iterations`` iterations inside ONE ``run-schedule`` whose
  back-off scheduler spans them (a fresh scheduler per call would ban an
  over-limit rule forever) and caps every rule at ``match_limit`` matches
  per iteration (doubling after each ban), so the step's growth is bounded;
* procedural rules (Python, ``RuleSpec.apply``) run between egglog
  iterations on a fresh :class:`~egraft.ir.egraph.Snapshot`.

:func:`run_schedule`: safe rules to a fixed point, the explosive step, safe
rules to a fixed point again.  Which graph a :class:`EGraphSession` saturates (the
whole graph, or one layer template at a time) is the strategy's choice:
:mod:`egraft.rewrites.saturation`.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import egglog.bindings as eb

from ..ir.egraph import Snapshot, best_by_cost
from ..errors import SaturationError
from ..ir import Op
from ..ir.graph import Graph
from .codec import Context, constant_attrs, encode_op, encode_term, handle, split_commands
from .snapshot import snapshot
from .rule import RuleSpec, Term
from .schema import PRELUDE, SIGS

SATURATED = "saturated"
ITERATION_LIMIT = "iteration limit"
NODE_LIMIT = "node limit"
TIME_LIMIT = "time limit"
STOP_ORDER = (TIME_LIMIT, NODE_LIMIT, ITERATION_LIMIT, SATURATED)  # most severe first


@dataclass(frozen=True)
class Limits:
    """Hard limits for one saturation.

    ``iterations`` caps rewrite iterations in total (the explosive step counts
    as ``explosive_iterations``); ``nodes`` and ``seconds`` are checked after
    every iteration, so the overshoot is at most one (bounded) iteration.
    """

    iterations: int = 10
    nodes: int = 200_000
    seconds: float = 60.0
    explosive_iterations: int = 1
    match_limit: int = 500
    ban_length: int = 2
    proc_cap: int = 20_000  # unions one procedural rule may add per iteration
    repeated_layers: bool = True  # saturate each distinct layer once, stitch the copies (repeated.py)


@dataclass
class IterationStat:
    phase: str
    nodes: int
    classes: int
    seconds: float  # wall time since saturation started
    matches: int


@dataclass
class ScheduleResult:
    """How one :func:`run_schedule` ended (and, as the base of :class:`SaturationResult`, a saturation)."""

    stop_reason: str
    iterations: int
    nodes: int
    classes: int
    seconds: float
    history: list[IterationStat]


@dataclass
class SaturationResult(ScheduleResult):
    """The grown e-graph and how it got there (the schedule's fields, then these).

    ``egraph`` is the live egglog EGraph; ``ctx`` the facts kept outside it
    (constants, input roles, weights); ``output_handles`` / ``input_handles``
    name the e-classes of the graph's outputs / model inputs.  ``firings`` counts
    matches per rule; ``form_firings`` per egglog command of a rule
    (:func:`command_names`), so a test can tell which form of a rule fired.

    A repeated-layer result (``layers`` non-empty) was stitched in Python from
    per-layer saturations: ``egraph`` is None and ``snap`` is given;
    ``nodes``/``classes`` are the stitched totals, ``history`` lists each
    template's iterations (phase ``t<k>:...``) and a final ``stitched`` row,
    ``firings`` counts matches in the templates (each distinct layer once).
    """

    egraph: Any
    ctx: Context
    graph: Graph
    output_handles: list[int]
    input_handles: list[int]
    firings: Counter
    layers: dict = field(default_factory=dict)  # what repeated-layer reuse did
    snap: Snapshot | None = field(default=None, repr=False)  # read from `egraph` on first use when None
    form_firings: Counter = field(default_factory=Counter)  # per egglog command: "rule#k", "rule#k=>"
    # repeated-layer results: (Block, Template or None) per block occurrence, in graph order; the search
    # searches each distinct template once and reuses the winner for every occurrence
    parts: list = field(default_factory=list, repr=False)

    def snapshot(self) -> Snapshot:
        if self.snap is None:
            if self.egraph is None:
                raise SaturationError("this saturation result has neither an e-graph nor a snapshot")
            self.snap = snapshot(self.egraph, self.ctx)
        return self.snap

    def drop_egraph(self) -> "SaturationResult":
        """Read the snapshot, then let the live egglog e-graph go (``egraph`` becomes None); returns self.

        Egglog's e-graph of a model is large (about 320 MB for a 4-layer Llama
        step of 7,000 e-nodes; the snapshot is a few MB) and everything after
        saturation (the search, extraction) reads the snapshot, so a search
        drops it before it lowers and times candidates.  The freed pages go
        back to the operating system (glibc's ``malloc_trim``; elsewhere
        nothing): egglog's many small blocks would otherwise stay resident,
        unused by the large buffers the search allocates next.
        """
        self.snapshot()
        if self.egraph is not None:
            self.egraph = None
            return_freed_pages()
        return self

    def output_classes(self) -> list[int]:
        s = self.snapshot()
        return [s.class_of_handle[h] for h in self.output_handles]

    def summary(self) -> str:
        return (f"{self.stop_reason} after {self.iterations} iterations: {self.nodes} e-nodes, "
                f"{self.classes} e-classes, {self.seconds:.2f} s")


def return_freed_pages() -> None:
    """Hand the C heap's free pages back to the OS where the C library can (glibc); else do nothing."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator returns pages its own way
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def scheduled_text(rule: RuleSpec, ruleset: str) -> tuple[str, list[str]]:
    """The rule's egglog commands with ``:ruleset`` and unique ``:name`` added."""
    cmds = split_commands(rule.egglog or "")
    names, out = [], []
    for k, cmd in enumerate(cmds):
        head = cmd[1:].split(None, 1)[0]
        if head not in ("rewrite", "birewrite", "rule"):
            raise ValueError(f"rule {rule.name!r}: only rewrite/birewrite/rule commands are allowed, got {head!r}")
        if ":ruleset" in cmd or ":name" in cmd:
            raise ValueError(f"rule {rule.name!r}: leave :ruleset/:name out, the driver adds them")
        name = f"{rule.name}#{k}"
        names.append(name)
        out.append(f'{cmd[:-1]} :ruleset {ruleset} :name "{name}")')
    return "\n".join(out), names


def command_names(rule: RuleSpec) -> list[str]:
    """The keys of ``SaturationResult.form_firings`` for the rule's egglog commands: ``rule#k``,
    and ``rule#k=>`` / ``rule#k<=`` for the two directions of a birewrite."""
    _, names = scheduled_text(rule, "safe")
    out = []
    for name, cmd in zip(names, split_commands(rule.egglog or "")):
        out += [name + "=>", name + "<="] if cmd[1:].startswith("birewrite") else [name]
    return out


class EGraphSession:
    """One egglog e-graph with the prelude and a rule set loaded."""

    def __init__(self, rules: Sequence[RuleSpec], ctx: Context):
        self.eg = eb.EGraph()
        self.ctx = ctx
        self.firings: Counter = Counter()
        self.form_firings: Counter = Counter()  # per egglog command (see command_names)
        self.safe_proc = [r for r in rules if r.apply and not r.explosive]
        self.expl_proc = [r for r in rules if r.apply and r.explosive]
        self.owner: dict[str, str] = {}
        texts = [PRELUDE, "(ruleset safe)", "(ruleset explosive)"]
        self.has = {"safe": False, "explosive": False}
        for r in rules:
            if r.egglog is None:
                continue
            rs = "explosive" if r.explosive else "safe"
            txt, names = scheduled_text(r, rs)
            texts.append(txt)
            self.has[rs] = True
            for n in names:
                self.owner[n] = r.name
        self.run("\n".join(texts), what="loading the rules")

    # -- egglog calls -----------------------------------------------------------------
    CHUNK_CHARS = 20_000

    def run(self, text: str, what: str = "saturating"):
        """Run egglog commands.  Long programs go in chunks: egglog keeps a copy of the
        source per command, so one 250 KB program of 5k unions took > 6 GB."""
        if len(text) <= self.CHUNK_CHARS:
            return self._run(text, what)
        out, buf, size = [], [], 0
        for cmd in split_commands(text):
            buf.append(cmd)
            size += len(cmd)
            if size >= self.CHUNK_CHARS:
                out += self._run("\n".join(buf), what)
                buf, size = [], 0
        if buf:
            out += self._run("\n".join(buf), what)
        return out

    def _run(self, text: str, what: str):
        try:
            return self.eg.run_program(*self.eg.parse_program(text))
        except BaseException as e:  # pyo3 PanicException derives from BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            msg = str(e)
            if "Illegal merge" in msg:
                raise SaturationError(
                    "conflicting facts while " + what + ": a rule equated terms whose shape or dtype "
                    "differ (egglog: " + msg.strip()[:300] + "). Find the unsound rule with "
                    "tests/rewrites (per-rule soundness) or run saturate(rules=[...]) on a subset."
                ) from None
            raise SaturationError(f"egglog failed while {what}: {msg.strip()[:500]}") from None

    def _count(self, outputs) -> int:
        total = 0
        for o in outputs:
            rep = getattr(o, "report", None)
            if rep is None:
                continue
            for name, n in rep.num_matches_per_rule.items():
                rule = self.owner.get(name.rstrip("=><"))
                if rule is not None and n:
                    self.form_firings[name] += n
                if rule is None:
                    base = name.split("#")[0]
                    rule = base if "#" in name else None
                if rule is not None and n:
                    self.firings[rule] += n
                    total += n
        return total

    def analysis(self):
        self.run("(run-schedule (saturate (run analysis)))", "computing shapes")

    def sizes(self) -> tuple[int, int]:
        out = self.run("(print-size)")
        sizes = dict(out[-1].sizes)
        nodes = sum(sizes.get(c, 0) for c in SIGS)
        return nodes, sizes.get("shape", 0)

    def safe_iteration(self) -> tuple[bool, int]:
        """One iteration of the safe egglog rules: (whether the e-graph changed, matches)."""
        if not self.has["safe"]:
            return False, 0
        outs = self.run("(run-schedule (saturate (run analysis)) (repeat 1 (run safe)) (saturate (run analysis)))")
        return bool(outs[-1].report.updated), self._count(outs)

    def explosive_step(self, iterations: int, match_limit: int, ban_length: int) -> int:
        if not self.has["explosive"] or iterations <= 0:
            return 0
        outs = self.run(
            f"(run-schedule (let-scheduler bo (back-off :match-limit {match_limit} :ban-length {ban_length}))"
            f" (repeat {iterations} (seq (saturate (run analysis)) (run-with bo explosive)))"
            " (saturate (run analysis)))"
        )
        return self._count(outs)

    # -- procedural rules ---------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return snapshot(self.eg, self.ctx)

    def apply_proc(self, rules, cap: int) -> int:
        if not rules:
            return 0
        snap = self.snapshot()
        lines: list[str] = []
        ranks = None
        made: dict[int, int] = {}

        def ref(cls: int) -> str:
            nonlocal ranks
            h = snap.handle_of(cls)
            if h is None:
                h = made.get(cls)
            if h is None:
                if ranks is None:
                    ranks = best_by_cost(snap, [1.0] * len(snap.nodes), "max")[1]
                node = snap.nodes[ranks[cls]]
                kids = [ref(c) for c in node.children]
                h = made[cls] = self.ctx.new_handle()
                lines.append(f"(union {handle(h)} {encode_op(node.op, node.attrs, kids, self.ctx)})")
            return handle(h)

        total = 0
        for rule in rules:
            n = 0
            for cls, t in rule.apply(snap):
                if isinstance(t, int):  # "these two classes are equal"
                    if t != cls:
                        lines.append(f"(union {ref(cls)} {ref(t)})")
                        n += 1
                    continue
                if resolve(snap, t, self.ctx) == cls:
                    continue  # already there: nothing to add
                lines.append(f"(union {ref(cls)} {encode_term(t, ref, self.ctx)})")
                n += 1
                if n >= cap:
                    break
            if n:
                self.firings[rule.name] += n
                total += n
        if lines:
            self.run("\n".join(lines), "adding procedural rewrites")
            self.analysis()
        return total


def resolve(snap: Snapshot, t: Term | int, ctx: Context) -> int | None:
    """The class already holding `t` (a class id or a Term), or None if some node is new."""
    if isinstance(t, int):
        return t
    kids = []
    for c in t.children:
        k = resolve(snap, c, ctx)
        if k is None:
            return None
        kids.append(k)
    attrs = t.attrs
    if t.op == Op.Constant:
        attrs = constant_attrs(t.attrs, ctx)
    return snap.lookup(t.op, attrs, tuple(kids))


def run_schedule(sess: EGraphSession, limits: Limits, t0: float, iterations_used: int = 0) -> ScheduleResult:
    """Safe phase, explosive step, safe phase, within `limits` (time counted from `t0`)."""
    history: list[IterationStat] = []
    it = iterations_used
    nodes, classes = sess.sizes()
    history.append(IterationStat("start", nodes, classes, time.perf_counter() - t0, 0))

    def check() -> str | None:
        if nodes > limits.nodes:
            return NODE_LIMIT
        if time.perf_counter() - t0 > limits.seconds:
            return TIME_LIMIT
        return None

    def safe_phase() -> str:
        nonlocal it, nodes, classes
        while True:
            if it >= limits.iterations:
                return ITERATION_LIMIT
            before = (nodes, classes)
            changed, m = sess.safe_iteration()
            p = sess.apply_proc(sess.safe_proc, limits.proc_cap)
            it += 1
            nodes, classes = sess.sizes()
            history.append(IterationStat("safe", nodes, classes, time.perf_counter() - t0, m + p))
            stop = check()
            if stop:
                return stop
            if (not changed and p == 0) or (nodes, classes) == before:
                return SATURATED

    stop = check() or safe_phase()
    if stop == SATURATED and (sess.has["explosive"] or sess.expl_proc) and limits.explosive_iterations > 0:
        k = min(limits.explosive_iterations, limits.iterations - it)
        if k <= 0:
            stop = ITERATION_LIMIT
        else:
            before = (nodes, classes)
            m = sess.explosive_step(k, limits.match_limit, limits.ban_length)
            m += sess.apply_proc(sess.expl_proc, limits.match_limit)
            it += k
            nodes, classes = sess.sizes()
            history.append(IterationStat("explosive", nodes, classes, time.perf_counter() - t0, m))
            stop = check()
            if stop is None:
                grew = (nodes, classes) != before
                stop = safe_phase()
                if stop == SATURATED and grew:
                    stop = ITERATION_LIMIT  # explosive rules were cut off by their iteration budget
    return ScheduleResult(stop_reason=stop, iterations=it, nodes=nodes, classes=classes,
                          seconds=time.perf_counter() - t0, history=history)
