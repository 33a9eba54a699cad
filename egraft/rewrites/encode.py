"""``ir.Graph`` <-> egglog terms: the term language every rule module writes against.

Term language (egglog sort ``T``; one constructor per IR op, children first,
then the op's attributes).  ``IVec`` is ``(Vec i64)``::

    (Input  name:String shape:IVec dtype:String)     model input or weight (values stay outside)
    (Const  key:String shape:IVec dtype:String)      opaque constant: tensors, inf/nan, -0.0
    (ScalarF v:f64 dtype:String)                     scalar float literal (finite, never -0.0), shape ()
    (ScalarI v:i64 dtype:String)                     scalar int / bool (0/1) literal, shape ()
    (Exp2 a) (Log2 a) (Sin a) (Sqrt a) (Recip a)
    (Add a b) (Mul a b) (Mod a b) (LessThan a b)     operands of identical shape (no implicit broadcast)
    (Where c a b)
    (SumReduce a axis:i64) (MaxReduce a axis:i64)    reduce one axis and drop it
    (Iota n:i64 dtype:String)
    (Gather x idx axis:i64)
    (Cast a dtype:String)
    (View a shape:IVec strides:IVec offset:i64)      as_strided over the row-major flattening of a
    (MatMul a b) (Softmax a axis:i64) (LayerNorm a axis:i64 eps:f64) (RMSNorm a axis:i64 eps:f64)
    (Attention q k v scale:f64 causal:bool) (AttentionBias q k v bias scale:f64 causal:bool)
    (H id:i64)                                       a *handle*: names an e-class from Python;
                                                     never extracted, never matched by rules

Views stay one general ``View`` constructor (the IR's meaning, no separate
reshape/permute/...): view algebra (composition, identity, inverse) needs
``shapes.compose_views``, which is Python, so view rules are *procedural*
rules (below); pushing a view through an elementwise op is a plain egglog
rewrite because the view's attributes just move.

Analysis: ``(zeros r)`` is the all-zero IVec of rank r (r <= 12), for the
strides of a broadcast scalar in a rule's right side:
``(View (ScalarF 1.0 d) s z 0)`` with ``(= z (zeros (vec-length s)))`` in the
query.  egglog allows looking up a function (``shape``, ``dtype``, ``zeros``)
only in a rule's query, not in a ``rewrite``'s right side: use the ``rule``
form (or ``:when``) and bind the value to a variable.  ``(nonneg e)`` is a
relation that holds when e is provably not negative (Exp2, Sqrt, x*x,
Softmax, non-negative literals, and sums/products/views/max of such); use it
to guard conditional identities like ``exp2(log2 a) = a``.  Every e-class gets ``(shape e) -> IVec`` and ``(dtype e) -> String``
from the ``analysis`` ruleset (run to a fixed point before each rewrite
iteration).  Both functions have no merge, so a rule that unions terms of
different shape/dtype fails loudly ("Illegal merge attempted"); the driver
turns that into :class:`egraft.errors.SaturationError`.  Rules guard on them::

    (rule ((= e (SumReduce (View x s st o) ax)) (= 0 (vec-get st ax)) (= sx (shape x))) (...))

A scalar constant broadcast to a shape is ``(View (ScalarF 1.0 d) s st 0)``
with all-zero ``st``.  -0.0 never becomes a ``ScalarF`` (egglog equates it
with 0.0), and a folded constant must be finite and non-zero to be emitted.

How a rule module declares rules: it exports ``RULES: list[RuleSpec]``.
A :class:`RuleSpec` is *either*

* ``egglog=``: text of one or more egglog commands (``rewrite``, ``birewrite``
  or ``rule``) written WITHOUT ``:ruleset``/``:name`` (the driver adds them, so
  a rule can be scheduled in any phase and its firings are counted); or
* ``apply=``: a procedural rule ``apply(snapshot) -> iterable of (class_id, Term)``.
  ``snapshot`` is an :class:`egraft.egraph.Snapshot` (plain Python
  e-graph: e-nodes with IR op/attrs/children classes, shape/dtype per class);
  each pair says "this e-class also equals this term" (a plain class id instead
  of a Term says "these two classes are equal").  A :class:`Term` has an IR op
  name, IR attrs (a dict, as in ``ir.Node.attrs``) and children that are class ids
  (ints of that snapshot) or nested Terms.  Use it when the right side needs
  Python arithmetic (view composition, factorisation of sizes).

plus ``explosive=True`` for rules that must run under the back-off scheduler
with a match limit (comm/assoc and friends), and a ``witness(rng) -> Witness``:
a small LHS program on random shapes that the rule fires on (and optionally
the RHS the rule should produce).  tests/rewrites checks every registered
rule generically: it must fire on its witness, and every program extracted
from the witness's e-graph must equal the LHS in float64.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import IRError
from ..ir.graph import Attrs, Graph
from ..ir.ops import TensorValue

# --- the constructor table ---------------------------------------------------------

# attribute kinds: egglog sort used for the value
I64, F64, STR, VEC, BOOL = "i64", "f64", "String", "IVec", "bool"


@dataclass(frozen=True)
class Sig:
    """One egglog constructor: which IR op it stands for and how its arguments map."""

    ctor: str
    op: str
    children: int
    attrs: tuple[tuple[str, str], ...] = ()  # (IR attr name, kind), in argument order


_UNARY = ("Exp2", "Log2", "Sin", "Sqrt", "Recip")
_BINARY = ("Add", "Mul", "Mod", "LessThan")

SIGS: dict[str, Sig] = {}


def _sig(ctor, op, children, *attrs):
    SIGS[ctor] = Sig(ctor, op, children, tuple(attrs))


for _op in _UNARY:
    _sig(_op, _op, 1)
for _op in _BINARY:
    _sig(_op, _op, 2)
_sig("Where", "Where", 3)
_sig("SumReduce", "SumReduce", 1, ("axis", I64))
_sig("MaxReduce", "MaxReduce", 1, ("axis", I64))
_sig("Iota", "Iota", 0, ("n", I64), ("dtype", STR))
_sig("Gather", "Gather", 2, ("axis", I64))
_sig("Cast", "Cast", 1, ("dtype", STR))
_sig("View", "View", 1, ("shape", VEC), ("strides", VEC), ("offset", I64))
_sig("MatMul", "MatMul", 2)
_sig("Softmax", "Softmax", 1, ("axis", I64))
_sig("LayerNorm", "LayerNorm", 1, ("axis", I64), ("eps", F64))
_sig("RMSNorm", "RMSNorm", 1, ("axis", I64), ("eps", F64))
_sig("Attention", "Attention", 3, ("scale", F64), ("causal", BOOL))
_sig("AttentionBias", "Attention", 4, ("scale", F64), ("causal", BOOL))
_sig("Input", "Input", 0, ("name", STR), ("shape", VEC), ("dtype", STR))
_sig("Const", "Constant", 0, ("key", STR), ("shape", VEC), ("dtype", STR))
_sig("ScalarF", "Constant", 0, ("value", F64), ("dtype", STR))
_sig("ScalarI", "Constant", 0, ("value", I64), ("dtype", STR))

HANDLE = "H"
ANALYSIS_FUNCTIONS = ("shape", "dtype")


def _declarations() -> str:
    lines = ["(sort IVec (Vec i64))", "(sort T)", f"(constructor {HANDLE} (i64) T)"]
    for s in SIGS.values():
        args = " ".join(["T"] * s.children + [k for _, k in s.attrs])
        lines.append(f"(constructor {s.ctor} ({args}) T)")
    lines += ["(function shape (T) IVec :no-merge)", "(function dtype (T) String :no-merge)"]
    return "\n".join(lines)


MAX_RANK = 12  # ranks the ``zeros`` table covers

# facts that make an e-class provably not negative (it may be NaN; the sign of zero is ignored)
_NONNEG = (
    "(= e (Exp2 a))", "(= e (Sqrt a))", "(= e (Mul a a))", "(= e (Softmax a ax))",
    "(= e (ScalarF v d)) (>= v 0.0)", "(= e (ScalarI v d)) (>= v 0)",
    "(= e (Mul a b)) (nonneg a) (nonneg b)", "(= e (Add a b)) (nonneg a) (nonneg b)",
    "(= e (Recip a)) (nonneg a)", "(= e (SumReduce a ax)) (nonneg a)", "(= e (MaxReduce a ax)) (nonneg a)",
    "(= e (View a s st o)) (nonneg a)", "(= e (Gather a i ax)) (nonneg a)",
    "(= e (Where c a b)) (nonneg a) (nonneg b)",
)


def _analysis() -> str:
    """shape/dtype rules, one per constructor (a table, not an if-chain)."""
    same = "((set (shape e) sa) (set (dtype e) da))"
    last = "(vec-set {s} (- (vec-length {s}) 1) (vec-get {t} (- (vec-length {t}) 1)))"
    rules = {
        "Input": ("(Input n s d)", [], "((set (shape e) s) (set (dtype e) d))"),
        "Const": ("(Const n s d)", [], "((set (shape e) s) (set (dtype e) d))"),
        "ScalarF": ("(ScalarF v d)", [], "((set (shape e) (vec-empty)) (set (dtype e) d))"),
        "ScalarI": ("(ScalarI v d)", [], "((set (shape e) (vec-empty)) (set (dtype e) d))"),
        "Iota": ("(Iota n d)", [], "((set (shape e) (vec-of n)) (set (dtype e) d))"),
        "Where": ("(Where c a b)", ["a"], same),
        "LessThan": ("(LessThan a b)", ["a"], '((set (shape e) sa) (set (dtype e) "bool"))'),
        "Cast": ("(Cast a d)", ["a"], "((set (shape e) sa) (set (dtype e) d))"),
        "SumReduce": ("(SumReduce a ax)", ["a"], "((set (shape e) (vec-remove sa ax)) (set (dtype e) da))"),
        "MaxReduce": ("(MaxReduce a ax)", ["a"], "((set (shape e) (vec-remove sa ax)) (set (dtype e) da))"),
        "Gather": ("(Gather a i ax)", ["a", "i"], "((set (shape e) si) (set (dtype e) da))"),
        "View": ("(View a s st o)", ["a"], "((set (shape e) s) (set (dtype e) da))"),
        "MatMul": ("(MatMul a b)", ["a", "b"], f"((set (shape e) {last.format(s='sa', t='sb')}) (set (dtype e) da))"),
        "Softmax": ("(Softmax a ax)", ["a"], same),
        "LayerNorm": ("(LayerNorm a ax ep)", ["a"], same),
        "RMSNorm": ("(RMSNorm a ax ep)", ["a"], same),
        "Attention": ("(Attention a k v sc ca)", ["a", "v"],
                      f"((set (shape e) {last.format(s='sa', t='sv')}) (set (dtype e) da))"),
        "AttentionBias": ("(AttentionBias a k v b sc ca)", ["a", "v"],
                          f"((set (shape e) {last.format(s='sa', t='sv')}) (set (dtype e) da))"),
    }
    for op in _UNARY:
        rules[op] = (f"({op} a)", ["a"], same)
    for op in ("Add", "Mul", "Mod"):
        rules[op] = (f"({op} a b)", ["a"], same)
    missing = set(SIGS) - set(rules)
    assert not missing, f"analysis rules missing for {missing}"
    out = ["(ruleset analysis)", "(function zeros (i64) IVec :no-merge)", "(relation nonneg (T))"]
    out += [f"(set (zeros {r}) {lit_vec([0] * r)})" for r in range(MAX_RANK + 1)]
    out += [f"(rule ({fact}) ((nonneg e)) :ruleset analysis :name \"analysis:nonneg{k}\")"
            for k, fact in enumerate(_NONNEG)]
    for ctor, (pat, uses, action) in rules.items():
        facts = [f"(= e {pat})"]
        for v in uses:
            facts.append(f"(= s{v} (shape {v}))")
            if v == "a":
                facts.append("(= da (dtype a))")
        out.append(f'(rule ({" ".join(facts)}) {action} :ruleset analysis :name "analysis:{ctor}")')
    return "\n".join(out)



# --- literals -------------------------------------------------------------------------

_SAFE_STRING = re.compile(r'^[^"\\\n]*$')


def lit_str(s: str) -> str:
    if not _SAFE_STRING.match(s):
        raise IRError(f"name {s!r} cannot be encoded for the e-graph: rename it without quotes, backslashes or newlines")
    return f'"{s}"'


def lit_f64(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        raise IRError("NaN cannot be an f64 literal in the e-graph (encode it as an opaque Const)")
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    r = repr(v)
    return r if any(c in r for c in ".en") else r + ".0"


def lit_vec(xs: Sequence[int]) -> str:
    return f"(vec-of {' '.join(str(int(x)) for x in xs)})" if len(xs) else "(vec-empty)"


def lit_bool(b: bool) -> str:
    return "true" if b else "false"


_LIT = {I64: lambda v: str(int(v)), F64: lit_f64, STR: lit_str, VEC: lit_vec, BOOL: lit_bool}

PRELUDE = _declarations() + "\n" + _analysis()


# --- encoding context: what lives outside the e-graph -------------------------------------

@dataclass
class Context:
    """Facts that stay outside the e-graph: constant values by key, input roles, weights.

    One ``Context`` belongs to one saturation; the Space carries it so an
    extraction can rebuild ``Constant`` and ``Input`` nodes exactly.
    """

    constants: dict[str, tuple[Any, tuple[int, ...], str]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    input_names: list[str] = field(default_factory=list)  # model inputs, in the model's order
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    next_handle: int = 0

    def new_handle(self) -> int:
        h = self.next_handle
        self.next_handle += 1
        return h

    def constant_key(self, value, shape, dtype) -> str:
        if isinstance(value, TensorValue):
            key = f"t:{value._key[2][:20]}:{dtype}"
        else:
            key = f"s:{value!r}:{dtype}"
        self.constants.setdefault(key, (value, tuple(shape), dtype))
        return key

    @classmethod
    def for_graph(cls, graph: Graph) -> "Context":
        ctx = cls()
        ctx.add_graph_leaves(graph)
        ctx.input_names = graph.input_names()
        ctx.weights = dict(graph.weights)
        return ctx

    def add_graph_leaves(self, graph: Graph) -> None:
        for n in graph.nodes:
            if n.op == "Input":
                self.roles[n.attrs["name"]] = n.attrs["role"]


# --- IR op + attrs -> egglog text ----------------------------------------------------------

def _scalar_ctor(value, dtype) -> tuple[str, Any] | None:
    """Which literal constructor holds this scalar Constant, or None for an opaque Const."""
    if isinstance(value, (bool, np.bool_)):
        return "ScalarI", int(bool(value))
    if isinstance(value, (int, np.integer)):
        return "ScalarI", int(value)
    if isinstance(value, float) and math.isfinite(value) and not (value == 0.0 and math.copysign(1.0, value) < 0):
        return "ScalarF", value
    return None


def constant_attrs(attrs: Mapping[str, Any], ctx: Context) -> Attrs:
    """The attrs a Constant has after a trip through the e-graph (what the Decoder returns)."""
    shape, dtype = tuple(attrs["shape"]), attrs["dtype"]
    lit = None if shape else _scalar_ctor(attrs["value"], dtype)
    if lit is None:
        value = ctx.constants[ctx.constant_key(attrs["value"], shape, dtype)][0]
    elif lit[0] == "ScalarF":
        value = float(lit[1])
    else:
        value = bool(lit[1]) if dtype == "bool" else int(lit[1])
    return Attrs({"value": value, "shape": shape, "dtype": dtype})


def ctor_for(op: str, attrs: Mapping[str, Any], n_children: int) -> str:
    if op == "Attention":
        return "AttentionBias" if n_children == 4 else "Attention"
    if op == "Constant":
        raise AssertionError("constants go through encode_op")
    if op not in SIGS:
        raise IRError(f"op {op!r} has no e-graph encoding; add a Sig for it in egraft/rewrites/encode.py")
    return op


def encode_op(op: str, attrs: Mapping[str, Any], children: Sequence[str], ctx: Context) -> str:
    """egglog text of one node whose children are already egglog expressions."""
    if op == "Constant":
        shape, dtype = tuple(attrs["shape"]), attrs["dtype"]
        lit = None if shape else _scalar_ctor(attrs["value"], dtype)
        if lit is None:
            key = ctx.constant_key(attrs["value"], shape, dtype)
            return f"(Const {lit_str(key)} {lit_vec(shape)} {lit_str(dtype)})"
        ctor, v = lit
        return f"({ctor} {lit_f64(v) if ctor == 'ScalarF' else int(v)} {lit_str(dtype)})"
    sig = SIGS[ctor_for(op, attrs, len(children))]
    if len(children) != sig.children:
        raise IRError(f"{op} encodes with {sig.children} children, got {len(children)}")
    parts = [sig.ctor, *children]
    for name, kind in sig.attrs:
        parts.append(_LIT[kind](attrs[name]))
    return "(" + " ".join(parts) + ")"


def handle(h: int) -> str:
    return f"({HANDLE} {int(h)})"


def encode_graph(graph: Graph, ctx: Context, rename: Mapping[str, str] | None = None,
                 bind: Mapping[int, str] | None = None) -> tuple[str, list[int]]:
    """egglog commands that add `graph` to an e-graph; returns (text, handle per node).

    Every node i becomes ``(union (H h_i) term_i)`` so Python can name its
    e-class later.  `rename` maps input names (used when one saturated
    segment is instantiated for another layer); `bind` maps node ids to an
    egglog expression that replaces them (the segment's placeholder input).
    """
    rename = rename or {}
    bind = bind or {}
    lines, hs = [], []
    for i, n in enumerate(graph.nodes):
        h = ctx.new_handle()
        hs.append(h)
        if i in bind:
            lines.append(f"(union {handle(h)} {bind[i]})")
            continue
        if n.op == "Input":
            name = rename.get(n.attrs["name"], n.attrs["name"])
            term = f"(Input {lit_str(name)} {lit_vec(n.shape)} {lit_str(n.dtype)})"
        else:
            term = encode_op(n.op, n.attrs, [handle(hs[j]) for j in n.inputs], ctx)
        lines.append(f"(union {handle(h)} {term})")
    return "\n".join(lines), hs


# --- egglog row -> IR op + attrs ----------------------------------------------------------------

class Decoder:
    """Decodes frozen e-graph rows into (IR op, Attrs, child class values), with caches."""

    def __init__(self, egraph, ctx: Context):
        self.eg, self.ctx = egraph, ctx
        self._cache: dict[tuple[str, Any], Any] = {}

    def prim(self, kind: str, v):
        key = (kind, v)
        hit = self._cache.get(key)
        if hit is not None or key in self._cache:
            return hit
        eg = self.eg
        if kind == I64:
            out = eg.value_to_i64(v)
        elif kind == F64:
            out = eg.value_to_f64(v)
        elif kind == STR:
            out = eg.value_to_string(v)
        elif kind == BOOL:
            out = eg.value_to_bool(v)
        elif kind == VEC:
            out = tuple(eg.value_to_i64(x) for x in eg.value_to_vec(v))
        else:  # pragma: no cover
            raise AssertionError(kind)
        self._cache[key] = out
        return out

    def row(self, ctor: str, inputs: Sequence[Any]) -> tuple[str, Attrs, tuple[Any, ...]]:
        sig = SIGS[ctor]
        kids = tuple(inputs[: sig.children])
        vals = {name: self.prim(kind, v) for (name, kind), v in zip(sig.attrs, inputs[sig.children:])}
        if ctor == "Input":
            name = vals["name"]
            role = self.ctx.roles.get(name, "input")
            return "Input", Attrs({"name": name, "shape": vals["shape"], "dtype": vals["dtype"], "role": role}), kids
        if ctor == "Const":
            value, shape, dtype = self.ctx.constants[vals["key"]]
            return "Constant", Attrs({"value": value, "shape": shape, "dtype": dtype}), kids
        if ctor in ("ScalarF", "ScalarI"):
            dt = vals["dtype"]
            v = vals["value"]
            v = float(v) if ctor == "ScalarF" else (bool(v) if dt == "bool" else int(v))
            return "Constant", Attrs({"value": v, "shape": (), "dtype": dt}), kids
        return sig.op, Attrs(vals), kids


# --- terms built by procedural rules ----------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """A term a procedural rule adds: IR op, IR attrs, children (class ids or Terms)."""

    op: str
    attrs: Mapping[str, Any]
    children: tuple[Any, ...] = ()

    def text(self, ref: Callable[[int], str], ctx: Context) -> str:
        kids = [c.text(ref, ctx) if isinstance(c, Term) else ref(c) for c in self.children]
        return encode_op(self.op, self.attrs, kids, ctx)


def T(op: str, *children, **attrs) -> Term:
    """Shorthand: ``T("View", cls, shape=..., strides=..., offset=0)``."""
    return Term(op, attrs, tuple(children))


def scalar(value, dtype: str, shape: Sequence[int] = ()) -> Term:
    """A scalar constant, broadcast (stride-0 View) to `shape` when given."""
    c = Term("Constant", {"value": value, "shape": (), "dtype": dtype})
    if tuple(shape):
        return Term("View", {"shape": tuple(shape), "strides": (0,) * len(shape), "offset": 0}, (c,))
    return c


# --- rule declarations ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Witness:
    """A program a rule fires on (``lhs``) and, optionally, what it rewrites it to (``rhs``).

    Both are complete ``ir.Graph``s over the same inputs; ``rhs`` is checked
    numerically against ``lhs`` and is documentation of the rule's intent.
    """

    lhs: Graph
    rhs: Graph | None = None


@dataclass(frozen=True)
class RuleSpec:
    name: str
    family: str
    egglog: str | None = None
    apply: Callable[[Any], Iterable[tuple[int, Term]]] | None = None
    explosive: bool = False
    witness: Callable[[np.random.Generator], Witness] | None = None
    doc: str = ""

    def __post_init__(self):
        if (self.egglog is None) == (self.apply is None):
            raise ValueError(f"rule {self.name!r}: give exactly one of egglog= or apply=")
        if not re.match(r"^[A-Za-z0-9_.:\-/]+$", self.name):
            raise ValueError(f"rule name {self.name!r}: use letters, digits and _.:-/ only")


def split_commands(text: str) -> list[str]:
    """Top-level s-expressions of an egglog program (string literals respected)."""
    out, depth, start, in_str, i = [], 0, None, False, 0
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == ";":
            while i < len(text) and text[i] != "\n":
                i += 1
        elif c == "(":
            if depth == 0:
                start = i
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                out.append(text[start:i + 1])
        i += 1
    if depth != 0:
        raise ValueError(f"unbalanced parentheses in egglog text: {text[:80]!r}")
    return out


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


ENCODING_READY = True
