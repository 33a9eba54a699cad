"""Everything a rule module needs: ``from egraft.rewrites.rule import ...``.

A rule module (a family in :mod:`egraft.rewrites.rules`) exports
``RULES: list[RuleSpec]``.  A :class:`RuleSpec` is named ``family.kebab-name``
(its family is the prefix) and is *either*

* ``egglog=``: text of one or more egglog commands (``rewrite``, ``birewrite``
  or ``rule``) over the term language of :mod:`egraft.rewrites.schema`,
  written WITHOUT ``:ruleset``/``:name`` (the driver adds them, so a rule can
  be scheduled in any phase and its firings are counted); or
* ``apply=``: a procedural rule ``apply(snapshot) -> iterable of (class_id, Term)``.
  ``snapshot`` is an :class:`egraft.ir.egraph.Snapshot` (plain Python e-graph:
  e-nodes with IR op/attrs/children classes, shape/dtype per class); each
  pair says "this e-class also equals this term" (a plain class id instead of
  a Term says "these two classes are equal").  A :class:`Term` has an IR op
  name, IR attrs (as in ``ir.Node.attrs``) and children that are class ids
  (ints of that snapshot) or nested Terms; build one with
  ``term("View", cls, shape=..., strides=..., offset=0)``.  Use it when the
  right side needs Python arithmetic (view composition, factorisation of sizes).

plus ``explosive=True`` for rules that must run under the back-off scheduler
with a match limit (comm/assoc and friends), and witnesses.

Witnesses and near-misses
-------------------------
A *witness* ``witness(rng) -> Witness`` is a small LHS program on random
shapes that the rule fires on (and optionally the RHS the rule should
produce; :func:`pair` builds both from two builder functions).  A rule has
one witness per *form*: ``witness=`` is the first, ``witnesses=(...)`` the
others (:attr:`RuleSpec.forms` lists them all).  Forms are every operand
order of a non-commutative match (``ac+bc`` and ``ca+cb``), every literal
spelling (broadcast ``View (ScalarF ..)`` and bare rank-0 ``ScalarF``,
``ScalarI`` for ints), every egglog command of a multi-command rule (both
directions of a ``birewrite``) and every branch of a procedural rule.
tests/rewrites checks every witness of every rule: the rule must fire on it,
and every program extracted from its e-graph must equal the LHS in float64.
The engine counts firings per egglog command (``SaturationResult.form_firings``,
keyed ``family.name#k``, ``#k=>`` / ``#k<=`` for a birewrite's directions),
and the suite fails if some command of some rule fired on none of its
witnesses: a form without a witness is a form whose soundness is untested.

A rule with a side condition (nonneg, int dtype, a stride or shape guard,
"constant along K", divisible sizes) also lists ``near_misses=(...)``:
programs that look like the left side but violate the guard.  The rule must
NOT fire on them (firing count 0), unless the near-miss is built with
``Witness(lhs, may_fire=True)`` -- firing there is allowed only because it is
still sound, and then every extraction must equal the LHS.

Writing egglog rules: egglog allows looking up a function (``shape``,
``dtype``, ``zeros``) only in a rule's query, not in a ``rewrite``'s right
side, so use the ``rule`` form (or ``:when``) and bind the value::

    (rule ((= e (SumReduce (View x s st o) ax)) (= 0 (vec-get st ax)) (= sx (shape x))) (...))

A scalar constant broadcast to a shape is ``(View (ScalarF 1.0 d) s z 0)``
with ``(= z (zeros (vec-length s)))`` in the query; ``(nonneg e)`` guards
identities such as ``exp2(log2 a) = a``.  -0.0 never becomes a ``ScalarF``
(egglog equates it with 0.0), and a folded constant must be finite and
non-zero to be emitted.  Op lists come from :class:`egraft.ir.Group` via
:func:`ops_in` (table order), never from a list kept here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..ir import Group, shapes
from ..ir.builder import GraphBuilder, Tensor
from ..ir.graph import Graph
from .schema import SIGS, ops_in

__all__ = ["Group", "RuleSpec", "Term", "Witness", "arity", "call", "contig", "dims", "drop", "norm_strides", "ops_in", "pair",
           "program", "rand_shape", "scalar", "term", "view", "view_attrs", "view_term"]

_NAME = re.compile(r"^([a-z][a-z0-9]*)\.([a-z0-9]+(?:-[a-z0-9]+)*)$")


# --- rule declarations -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """A term a procedural rule adds: IR op, IR attrs, children (class ids or Terms)."""

    op: str
    attrs: Mapping[str, Any]
    children: tuple[Any, ...] = ()


def term(op: str, *children, **attrs) -> Term:
    """``term("View", cls, shape=..., strides=..., offset=0)``: children positionally, attrs by name."""
    return Term(op, attrs, tuple(children))


@dataclass(frozen=True)
class Witness:
    """A program a rule fires on (``lhs``) and, optionally, what it rewrites it to (``rhs``).

    Both are complete ``ir.Graph``s over the same inputs; ``rhs`` is checked
    numerically against ``lhs`` and is documentation of the rule's intent.
    """

    lhs: Graph
    rhs: Graph | None = None
    may_fire: bool = False  # a near-miss the rule may fire on (soundly); see the module doc


@dataclass(frozen=True)
class RuleSpec:
    """One rule: ``name`` is ``family.kebab-name``; exactly one of ``egglog`` / ``apply``."""

    name: str
    egglog: str | None = None
    apply: Callable[[Any], Iterable[tuple[int, Term]]] | None = None
    explosive: bool = False
    witness: Callable[[np.random.Generator], Witness] | None = None
    doc: str = ""
    witnesses: tuple[Callable[[np.random.Generator], Witness], ...] = ()  # the other forms
    near_misses: tuple[Callable[[np.random.Generator], Witness], ...] = ()  # guard violated: must not fire

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"rule name {self.name!r}: write family.kebab-name (lower-case letters, digits, '-')")
        if (self.egglog is None) == (self.apply is None):
            raise ValueError(f"rule {self.name!r}: give exactly one of egglog= or apply=")
        if self.egglog is not None and not isinstance(self.egglog, str):
            raise ValueError(f"rule {self.name!r}: egglog= takes the rule text")

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def forms(self) -> tuple[Callable[[np.random.Generator], Witness], ...]:
        """Every witness: ``witness`` first, then ``witnesses``."""
        return ((self.witness,) if self.witness is not None else ()) + tuple(self.witnesses)


# --- terms ------------------------------------------------------------------------------------------

def norm_strides(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """Strides with size-1 dims set to 0 (the builder's canonical spelling)."""
    return tuple(0 if n == 1 else int(s) for n, s in zip(shape, strides))


def contig(shape: Sequence[int]) -> tuple[int, ...]:
    """Canonical contiguous strides of `shape`."""
    return norm_strides(shape, shapes.contiguous_strides(shape))


def drop(seq: Sequence, ax: int) -> tuple:
    """`seq` without position `ax`."""
    return tuple(seq[:ax]) + tuple(seq[ax + 1:])


def view_term(x, shape: Sequence[int], strides: Sequence[int], offset: int = 0) -> Term:
    """A View term with canonical strides."""
    shape = tuple(int(n) for n in shape)
    return term("View", x, shape=shape, strides=norm_strides(shape, strides), offset=int(offset))


def view(child, child_shape: Sequence[int], shape: Sequence[int], strides: Sequence[int], offset: int = 0):
    """A View term, or `child` itself when the view would be the identity."""
    shape = tuple(int(s) for s in shape)
    st = norm_strides(shape, strides)
    if shapes.is_identity_view(tuple(child_shape), shape, st, offset):
        return child
    return term("View", child, shape=shape, strides=st, offset=int(offset))


def scalar(value, dtype: str, shape: Sequence[int] = ()) -> Term:
    """A scalar constant, broadcast (stride-0 View) to `shape` when given."""
    c = term("Constant", value=value, shape=(), dtype=dtype)
    if tuple(shape):
        return term("View", c, shape=tuple(shape), strides=(0,) * len(shape), offset=0)
    return c


# --- witnesses: small programs on random shapes -----------------------------------------------------

def rand_shape(rng: np.random.Generator, rank: int | None = None, lo: int = 1, hi: int = 5) -> tuple[int, ...]:
    """A random shape (rank 1..3 unless given), each dim in [lo, hi]."""
    rank = int(rng.integers(1, 4)) if rank is None else rank
    return tuple(int(rng.integers(lo, hi + 1)) for _ in range(rank))


def dims(rng: np.random.Generator, k: int, lo: int = 1, hi: int = 5) -> tuple[int, ...]:
    """`k` random sizes in [lo, hi)."""
    return tuple(int(x) for x in rng.integers(lo, hi, size=k))


def program(build: Callable[..., Tensor | Sequence[Tensor]], *shapes_: Sequence[int], dtype: str = "float32") -> Graph:
    """A graph whose inputs x0, x1, ... have `shapes_` and whose outputs are build(*inputs)."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", tuple(s), dtype) for i, s in enumerate(shapes_)]
    out = build(*xs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return b.build(outs)


def pair(lhs: Callable, rhs: Callable | None, *shapes_, dtype: str = "float32") -> Witness:
    """A Witness from two builder functions over the same inputs."""
    return Witness(program(lhs, *shapes_, dtype=dtype), program(rhs, *shapes_, dtype=dtype) if rhs else None)


# --- egglog text and snapshot helpers ----------------------------------------------------------------

def call(op: str, *children: str) -> str:
    """An egglog pattern ``(Op children.. v_attr..)`` with one variable per encoded attribute of `op`."""
    sig = SIGS[op]
    if len(children) != sig.children:
        raise ValueError(f"{op} takes {sig.children} children, got {len(children)}")
    return f"({' '.join([sig.ctor, *children, *(f'v_{name}' for name, _ in sig.attrs)])})"


def arity(op: str) -> int:
    """How many children `op`'s (first) constructor takes."""
    return SIGS[op].children


def view_attrs(node) -> tuple:
    """(shape, strides, offset) of a View e-node."""
    return node.attrs["shape"], node.attrs["strides"], node.attrs["offset"]
