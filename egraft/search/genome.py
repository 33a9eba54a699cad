"""The genome: which choices of the e-graph the search may change, and how a genome becomes a candidate.

A genome is a list of small ints, one per *gene*:

* one gene per e-class whose alternatives differ in what they compute
  (an idiom or its primitive form, concatenated weights or separate
  matmuls, a merged adapter, re-associations): its value picks one of the
  class's usable e-nodes.  Classes whose alternatives are all views are not
  genes: no backend prices a view's placement differently (XLA folds views,
  Triton turns them into index arithmetic), so they stay at the base
  extraction's choice instead of diluting the search;
* one materialise-or-recompute bit per intermediate the base program uses
  several times, for backends whose kernels can recompute a value inside
  each consumer (``Backend.recomputes``: Triton); XLA and torch fuse (and
  CSE) on their own, so for them the bits would only make duplicates of one
  program;
* the backend, among those that run on the device;
* each backend knob with more than one choice (per-anchor fusion knobs
  excepted: their names depend on the program; so are a backend's late
  knobs, ``Backend.late_knobs``, whose every new value costs a long compile:
  the search tries them once, on the winner).

Decoding a genome gives ``(program, backend, knobs)``; programs are then
memoised by structural hash, so two genomes that extract to the same
program are compiled and timed once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from ..backends import get_backend
from ..backends.base import search_knobs
from ..ir import Group, Op
from ..ir.graph import Graph
from .candidate import Candidate, knob_items
from .space import Space

MAX_SHARED_BITS = 64
_PER_PROGRAM_KNOB = re.compile(r"^fuse_\d+$")


def _differ(space: Space, members: Sequence[int]) -> bool:
    ops = {space.nodes[i].op for i in members}
    return bool(ops - Group.MOVEMENT) and len(members) > 1 and not ops <= Group.MOVEMENT


@dataclass
class GenomeSpace:
    space: Space
    base: list[int]  # e-node id per class: what a class that is not a gene extracts to
    backends: list[str]
    reference: Graph  # the program whose knob spaces define the knob genes
    weight_copies: bool = False  # CompileConfig.weight_copies: False holds the copy-free knobs to their values
    genes: list[int] = field(init=False)  # gene classes
    alleles: list[list[int]] = field(init=False)  # e-node ids per gene class
    shared: list[int] = field(init=False)  # classes with a materialise bit
    knobs: list[tuple[str, str, list]] = field(init=False)  # (backend, knob, values)

    def __post_init__(self):
        sp = self.space
        self.genes, self.alleles = [], []
        for c, usable in enumerate(sp.usable):
            if sp.nodes[sp.safe[c]].op == Op.Input or not _differ(sp, usable):
                continue
            self.genes.append(c)
            self.alleles.append(list(usable))
        recompute = any(get_backend(b).recomputes for b in self.backends)
        self.shared = sp.shared(list(self.base))[:MAX_SHARED_BITS] if recompute else []
        self.knobs = []
        self.fixed: dict[str, dict] = {}  # backend -> the knobs held to one value that is not the default
        for b in self.backends:
            rec = get_backend(b)
            full = rec.knobs(self.reference)
            space = search_knobs(rec, self.reference, self.weight_copies)
            self.fixed[b] = {k: v[0] for k, v in space.items() if len(v) == 1 and v[0] != full[k][0]}
            for name, values in space.items():
                if len(values) > 1 and not _PER_PROGRAM_KNOB.match(name) and name not in rec.late_knobs:
                    self.knobs.append((b, name, list(values)))

    # -- shape of the genome ------------------------------------------------------------
    def sizes(self) -> list[int]:
        """Number of values of each gene, in genome order."""
        return ([len(a) for a in self.alleles] + [2] * len(self.shared) + [len(self.backends)]
                + [len(v) for _, _, v in self.knobs])

    def __len__(self) -> int:
        return len(self.genes) + len(self.shared) + 1 + len(self.knobs)

    # -- genome <-> candidate ---------------------------------------------------------------
    def encode(self, ch: Sequence[int], backend: str | None = None, knobs: dict | None = None) -> list[int]:
        """The genome of a full choice (e-node id per class), a backend and knobs (defaults: first values)."""
        g = [a.index(ch[c]) if ch[c] in a else 0 for c, a in zip(self.genes, self.alleles)]
        g += [0] * len(self.shared)
        g.append(self.backends.index(backend) if backend in self.backends else 0)
        for b, name, values in self.knobs:
            v = (knobs or {}).get(name) if b == (backend or self.backends[0]) else None
            g.append(values.index(v) if v in values else 0)
        return g

    def decode(self, genome: Sequence[int]) -> tuple[list[int], frozenset[int], str, dict]:
        ng, ns = len(self.genes), len(self.shared)
        ch = list(self.base)
        for c, a, k in zip(self.genes, self.alleles, genome[:ng]):
            ch[c] = a[k % len(a)]
        recompute = frozenset(c for c, bit in zip(self.shared, genome[ng:ng + ns]) if bit)
        backend = self.backends[genome[ng + ns] % len(self.backends)]
        knobs = {name: values[k % len(values)] for (b, name, values), k in zip(self.knobs, genome[ng + ns + 1:])
                 if b == backend}
        return ch, recompute, backend, {**self.fixed.get(backend, {}), **knobs}

    def candidate(self, genome: Sequence[int]) -> Candidate:
        ch, recompute, backend, knobs = self.decode(genome)
        if not get_backend(backend).recomputes:
            recompute = frozenset()
        return Candidate(self.space.build(ch, recompute), backend, knob_items(knobs))

    def random(self, rng) -> list[int]:
        """A uniformly random genome (`rng`: a ``random.Random``)."""
        return [rng.randrange(n) for n in self.sizes()]
