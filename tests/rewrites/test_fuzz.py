"""Equivalence fuzzer: saturate, then every extraction must equal the original in float64.

For each program: saturate with every registered rule (bounded limits), then
greedy + 32 random extractions, each evaluated on random inputs against the
original (1e-9 relative).  200 random programs per run (fresh base seed, printed
on failure) plus every reference model; ``-m slow`` runs 3,000 programs.
"""

import os

import pytest

from egraft.rewrites import Limits, saturate
from egraft.testing.equivalence import check_space
from egraft.testing.fuzz import random_program
from egraft.search import Space
from egraft.testing import fresh_seed

from rewrites_testlib import model_names, traced

LIMITS = Limits(iterations=6, nodes=4_000, seconds=8.0, explosive_iterations=1, match_limit=300)
BASE = int(os.environ.get("EGRAFT_FUZZ_SEED", fresh_seed()))
CHUNK = 10


def _fuzz(seeds, max_nodes=24):
    checked = 0
    for s in seeds:
        g = random_program(s, max_nodes)
        res = saturate(g, limits=LIMITS)
        sp = Space.from_egraph(res)
        checked += check_space(sp, g, s, samples=32, per_class_cap=0,
                               what=f"random_program({s}, {max_nodes}) [EGRAFT_FUZZ_SEED={BASE}]")
    return checked


@pytest.mark.parametrize("chunk", range(200 // CHUNK))
def test_random_programs(chunk):
    _fuzz(range(BASE + chunk * CHUNK, BASE + (chunk + 1) * CHUNK))


@pytest.mark.parametrize("name", model_names())
def test_models(name):
    g = traced(name)
    res = saturate(g, limits=Limits(iterations=8, nodes=30_000, seconds=30.0, explosive_iterations=1))
    sp = Space.from_egraph(res)
    assert check_space(sp, g, BASE, samples=32, per_class_cap=0, what=f"model {name}") >= 2


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(3000 // 100))
def test_random_programs_long(chunk):
    _fuzz(range(10_000_000 + BASE + chunk * 100, 10_000_000 + BASE + (chunk + 1) * 100), max_nodes=32)
