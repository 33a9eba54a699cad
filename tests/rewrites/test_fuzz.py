"""Equivalence fuzzer: saturate, then every extraction must equal the original in float64.

For each program: saturate with every registered rule (bounded limits), then
greedy + 32 random extractions, each evaluated on random inputs against the
original (1e-9 relative).  A program must yield at least one extraction and,
in each chunk, at least half the programs at least two distinct ones (a
saturation that silently produced nothing fails).  Each chunk prints (``-s``)
and records how many variants it checked; the run ends with a line
``fuzz: N programs, M variants checked`` (tests/conftest.py).

* default: 200 random programs (chunks of 10) plus every reference model;
* ``pytest -m slow tests/rewrites/test_fuzz.py``: 3,000 programs of up to 32
  nodes in chunks of 100 (``-n 2`` runs chunks in parallel);
  ``EGRAFT_FUZZ_PROGRAMS=10000`` makes it 10,000 (``make fuzz-10k``).

Each test's seed comes from ``egraft.testing.fresh_seed()`` (chunk k of a
test checks programs ``seed + k*size ...``); a failure names the program's
seed and the replay command, ``EGRAFT_SEED=<n> pytest '<test id>'``
(``EGRAFT_FUZZ_SEED`` is gone: ``EGRAFT_SEED`` replays these tests like every other).
"""

import os

import pytest
from rewrites_testlib import model_names, traced

from egraft.ir import Group
from egraft.rewrites import Limits, saturate
from egraft.search import Space
from egraft.testing import fresh_seed
from egraft.testing.equivalence import check_space
from egraft.testing.fuzz import random_program

LIMITS = Limits(iterations=6, nodes=4_000, seconds=8.0, explosive_iterations=1, match_limit=300)
CHUNK = 10
LONG_CHUNK = 100
LONG_PROGRAMS = int(os.environ.get("EGRAFT_FUZZ_PROGRAMS", "3000"))


def _fuzz(request, chunk, size, max_nodes=24):
    base = fresh_seed()
    lo = base + chunk * size
    replay = f"EGRAFT_SEED={base} pytest '{request.node.nodeid}'"
    counts = []
    for s in range(lo, lo + size):
        g = random_program(s, max_nodes)
        res = saturate(g, limits=LIMITS)
        sp = Space.from_egraph(res)
        n = check_space(sp, g, s, samples=32, per_class_cap=0,
                        what=f"random_program({s}, {max_nodes}) [replay: {replay}]")
        assert n >= 1, f"random_program({s}, {max_nodes}): no extraction at all [replay: {replay}]"
        counts.append(n)
    multi = sum(n >= 2 for n in counts)
    print(f"fuzz chunk {chunk}: programs {lo}..{lo + size - 1}, {sum(counts)} variants checked, "
          f"{multi}/{size} with >= 2 variants")
    request.node.user_properties += [("fuzz_programs", size), ("fuzz_variants", sum(counts))]
    assert multi * 2 >= size, (f"only {multi} of {size} programs gave two or more distinct extractions: "
                               f"saturation produced (almost) no alternatives [replay: {replay}]")


@pytest.mark.parametrize("chunk", range(200 // CHUNK))
def test_random_programs(request, chunk):
    _fuzz(request, chunk, CHUNK)


@pytest.mark.parametrize("name", model_names())
def test_models(request, name):
    g = traced(name)
    res = saturate(g, limits=Limits(iterations=8, nodes=30_000, seconds=30.0, explosive_iterations=1))
    sp = Space.from_egraph(res)
    n = check_space(sp, g, fresh_seed(), samples=32, per_class_cap=0, what=f"model {name}")
    request.node.user_properties += [("fuzz_programs", 1), ("fuzz_variants", n)]
    assert n >= 2, f"model {name}: saturation gave {n} distinct extraction(s), expected alternatives"


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(-(-LONG_PROGRAMS // LONG_CHUNK)))
def test_random_programs_long(request, chunk):
    _fuzz(request, chunk, LONG_CHUNK, max_nodes=32)


def test_generator_covers_every_op():
    """Over a few hundred programs (generated only, not saturated) every op of the op table appears --
    leaves, views and idioms included -- and Attention with and without a bias, causal or not."""
    seen, attention = set(), set()
    for s in range(600):
        for node in random_program(s).nodes:
            seen.add(node.op)
            if node.op == "Attention":
                attention.add((len(node.inputs) == 4, bool(node.attrs["causal"])))
    assert sorted(Group.ALL - seen) == [], "random_program never generates these ops"
    assert attention == {(b, c) for b in (False, True) for c in (False, True)}, attention
    primitive = set()
    for s in range(200):
        primitive |= {node.op for node in random_program(s, idioms=False).nodes}
    assert not primitive & Group.IDIOM, f"idioms=False generated idiom nodes {primitive & Group.IDIOM}"
    assert Group.PRIMITIVE <= primitive, Group.PRIMITIVE - primitive
