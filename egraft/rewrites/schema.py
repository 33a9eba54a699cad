"""The e-graph schema, generated from the op table: egglog constructors and the shape/dtype analysis.

Term language (egglog sort ``T``).  Every op in :data:`egraft.ir.OPS` is one
constructor of the same name: its children first (sort ``T``), then its
attributes in the op table's order, each in the egglog sort of its attribute
type (:data:`SORT_OF`: int -> ``i64``, float -> ``f64``, bool -> ``bool``,
dtype/name -> ``String``, shape -> ``IVec`` = ``(Vec i64)``)::

    (Exp2 a) (Add a b) (Where c a b) (SumReduce a axis) (Cast a dtype)
    (View a shape strides offset) (Input name shape dtype) (MatMul a b) ...

The few exceptions are listed in one place (:data:`SPECIAL`, below):

* ``Input``'s ``role`` is not encoded (it lives in the codec's ``Context``);
* ``Constant`` has no constructor of its own: its value is either a literal,
  ``(ScalarF v:f64 dtype)`` (finite float, never -0.0) / ``(ScalarI v:i64
  dtype)`` (int or bool 0/1), both of shape ``()``, or opaque, ``(Const
  key:String shape dtype)`` (tensors, inf/nan, -0.0; the value is in the Context);
* an op with several arities gets one constructor per arity: ``Attention``
  with a bias (4 inputs) is ``(AttentionBias q k v bias scale causal)``;
* ``(H id:i64)`` is a *handle* that names an e-class from Python; never
  extracted, never matched by rules.

Analysis (ruleset ``analysis``, run to a fixed point before each rewrite
iteration): every e-class gets ``(shape e) -> IVec`` and ``(dtype e) ->
String``, one rule per constructor, derived from the op's kind (see
:func:`_shape_of` / :func:`_dtype_of`).  Both functions have no merge, so a
rule that unions terms of different shape/dtype fails loudly ("Illegal merge
attempted").  ``(zeros r)`` is the all-zero IVec of rank r (r <= MAX_RANK),
for the strides of a broadcast scalar in a rule's right side.  ``(nonneg e)``
holds when e is provably not negative (it may be NaN; the sign of zero is
ignored): Exp2, Sqrt, x*x, Softmax, non-negative literals, and sums,
products, views, reductions and gathers of such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..ir import OPS, Group, Op, dtypes
from ..errors import IRError
from ..ir.ops import OpDef

# egglog sorts of attribute values
I64, F64, STR, VEC, BOOL = "i64", "f64", "String", "IVec", "bool"
SORT_OF = {"int": I64, "float": F64, "bool": BOOL, "dtype": STR, "name": STR, "shape": VEC}
NOT_ENCODED = ("role", "value")  # Input's role lives in the Context; Constant's value: see SPECIAL

HANDLE = "H"
ANALYSIS_FUNCTIONS = ("shape", "dtype")
MAX_RANK = 12  # ranks the ``zeros`` table covers


@dataclass(frozen=True)
class Sig:
    """One egglog constructor: which IR op it stands for and how its arguments map."""

    ctor: str
    op: str
    children: int
    attrs: tuple[tuple[str, str], ...] = ()  # (IR attr name, egglog sort), in argument order


def ops_in(group) -> tuple[str, ...]:
    """The ops of a :class:`~egraft.ir.Group` set in op-table order (deterministic rule text)."""
    return tuple(op for op in OPS if op in group)


def _attr_sorts(d: OpDef) -> tuple[tuple[str, str], ...]:
    return tuple((a.name, SORT_OF[a.type]) for a in d.attrs if a.type not in NOT_ENCODED)


# --- the special cases: every departure from "one constructor per op" -----------------------------

SPECIAL: dict[str, tuple[Sig, ...]] = {
    # a Constant's value is a literal of its own sort or an opaque key into the Context
    "Constant": (Sig("Const", "Constant", 0, (("key", STR), ("shape", VEC), ("dtype", STR))),
                 Sig("ScalarF", "Constant", 0, (("value", F64), ("dtype", STR))),
                 Sig("ScalarI", "Constant", 0, (("value", I64), ("dtype", STR)))),
}
ARITY_CTOR = {("Attention", 4): "AttentionBias"}  # extra arities: constructor name per (op, arity)


def _generate() -> dict[str, Sig]:
    sigs: dict[str, Sig] = {}
    # compound ops first, leaves last (the order snapshots list e-nodes in)
    for name in sorted(OPS, key=lambda n: OPS[n].kind == "leaf"):
        d = OPS[name]
        if name in SPECIAL:
            sigs.update((s.ctor, s) for s in SPECIAL[name])
            continue
        for k, arity in enumerate(sorted(d.arity)):
            ctor = name if k == 0 else ARITY_CTOR[(name, arity)]
            sigs[ctor] = Sig(ctor, name, arity, _attr_sorts(d))
    return sigs


SIGS: dict[str, Sig] = _generate()


def ctor_for(op: str, n_children: int) -> str:
    """The constructor of a (non-Constant) op with `n_children` inputs."""
    ctor = ARITY_CTOR.get((op, n_children), op)
    if ctor not in SIGS or op in SPECIAL:
        raise KeyError(op)
    return ctor


# --- analysis: shape and dtype per constructor, from the op's kind ------------------------------------

_LAST = "(vec-set {s} (- (vec-length {s}) 1) (vec-get {t} (- (vec-length {t}) 1)))"
VALUE_OPERAND = {"select": 1}  # the operand that gives an elementwise result its shape (Where(c, a, b): a)


def _pattern(sig: Sig) -> tuple[str, list[str], dict[str, str]]:
    """``(Ctor c0 c1 .. attr..)`` with variables: children c<k>, attrs by IR name."""
    kids = [f"c{k}" for k in range(sig.children)]
    attrs = {name: f"a_{name}" for name, _ in sig.attrs}
    return f"({' '.join([sig.ctor, *kids, *attrs.values()])})", kids, attrs


def _fixed_dtype(d: OpDef) -> str | None:
    """The result dtype of an elementwise op when it does not follow its operands (LessThan: bool).

    Probed from the op's own type rule with float32, float64, int32 and int8 operands (those it takes).
    """
    outs = set()
    for dt in ("float32", "float64", "int32", "int8"):
        ts = [((2,), "bool" if d.kind == "select" and k == 0 else dt) for k in range(min(d.arity))]
        try:
            outs.add(d.infer(ts, {})[1])
        except IRError:  # an op defined on some dtypes only (Nibble: int8)
            continue
    return outs.pop() if len(outs) == 1 else None


def _shape_of(sig: Sig, kids: list[str], attrs: dict[str, str]) -> str:
    """The egglog expression of the result shape (child shapes are ``s<child var>``)."""
    d = OPS[sig.op]
    if sig.ctor in ("ScalarF", "ScalarI"):
        return "(vec-empty)"
    if "shape" in attrs:  # leaves and View say their shape
        return attrs["shape"]
    kind = d.kind
    if sig.op in Group.ELEMENTWISE or sig.op in Group.ROW_IDIOM:
        return f"s{kids[VALUE_OPERAND.get(kind, 0)]}"
    if kind == "reduce":
        return f"(vec-remove s{kids[0]} {attrs['axis']})"
    if kind == "contraction":  # a [..., M, K] @ b [..., K, N]
        return _LAST.format(s=f"s{kids[0]}", t=f"s{kids[1]}")
    if kind == "attention":  # q [..., Sq, D], v [..., Sk, Dv] -> [..., Sq, Dv]
        return _LAST.format(s=f"s{kids[0]}", t=f"s{kids[2]}")
    if sig.op == Op.Iota:
        return f"(vec-of {attrs['n']})"
    if sig.op == Op.Gather:  # the index tensor's shape
        return f"s{kids[1]}"
    if sig.op == Op.Scatter:  # the target's shape
        return f"s{kids[0]}"
    raise AssertionError(f"no shape rule for {sig.ctor} (kind {kind}): add one to egraft/rewrites/schema.py")


def _dtype_of(sig: Sig, kids: list[str], attrs: dict[str, str]) -> str:
    d = OPS[sig.op]
    if "dtype" in attrs:  # Cast, Iota and leaves say their dtype
        return attrs["dtype"]
    if d.kind in ("binary", "unary"):
        fixed = _fixed_dtype(d)
        if fixed is not None:
            return f'"{dtypes.check(fixed)}"'
    if not kids:
        raise AssertionError(f"no dtype rule for {sig.ctor}: add one to egraft/rewrites/schema.py")
    return f"d{kids[VALUE_OPERAND.get(d.kind, 0)]}"


def analysis_rule(sig: Sig) -> str:
    """The analysis rule that sets shape and dtype of every ``sig`` e-node."""
    pat, kids, attrs = _pattern(sig)
    shape, dtype = _shape_of(sig, kids, attrs), _dtype_of(sig, kids, attrs)
    facts = [f"(= e {pat})"]
    used = set(re.findall(r"\b[sd]c\d+\b", f"{shape} {dtype}"))
    for k in kids:
        if f"s{k}" in used:
            facts.append(f"(= s{k} (shape {k}))")
        if f"d{k}" in used:
            facts.append(f"(= d{k} (dtype {k}))")
    return (f'(rule ({" ".join(facts)}) ((set (shape e) {shape}) (set (dtype e) {dtype}))'
            f' :ruleset analysis :name "analysis:{sig.ctor}")')


def _nonneg_facts() -> list[str]:
    """Facts that make an e-class provably not negative (hand-written maths; op lists from Group)."""
    both = "(nonneg a) (nonneg b)"
    facts = ["(= e (Exp2 a))", "(= e (Sqrt a))", "(= e (Mul a a))", "(= e (Softmax a ax))",
             "(= e (ScalarF v d)) (>= v 0.0)", "(= e (ScalarI v d)) (>= v 0)",
             f"(= e (Mul a b)) {both}", f"(= e (Add a b)) {both}", "(= e (Recip a)) (nonneg a)"]
    facts += [f"(= e ({op} a ax)) (nonneg a)" for op in ops_in(Group.REDUCE)]  # sum/max of non-negatives
    facts += ["(= e (View a s st o)) (nonneg a)", "(= e (Gather a i ax)) (nonneg a)", f"(= e (Where c a b)) {both}",
              "(= e (Scatter a i b ax)) (nonneg a) (nonneg b)"]
    return facts


def _declarations() -> str:
    lines = ["(sort IVec (Vec i64))", "(sort T)", f"(constructor {HANDLE} (i64) T)"]
    for s in SIGS.values():
        args = " ".join(["T"] * s.children + [k for _, k in s.attrs])
        lines.append(f"(constructor {s.ctor} ({args}) T)")
    lines += ["(function shape (T) IVec :no-merge)", "(function dtype (T) String :no-merge)"]
    return "\n".join(lines)


def _zeros(r: int) -> str:
    return f"(vec-of {' '.join(['0'] * r)})" if r else "(vec-empty)"


def _analysis() -> str:
    out = ["(ruleset analysis)", "(function zeros (i64) IVec :no-merge)", "(relation nonneg (T))"]
    out += [f"(set (zeros {r}) {_zeros(r)})" for r in range(MAX_RANK + 1)]
    out += [f"(rule ({fact}) ((nonneg e)) :ruleset analysis :name \"analysis:nonneg{k}\")"
            for k, fact in enumerate(_nonneg_facts())]
    out += [analysis_rule(s) for s in SIGS.values()]
    return "\n".join(out)


PRELUDE = _declarations() + "\n" + _analysis()
