"""Repeated layers are searched once and spliced back; materialise-or-recompute extractions stay equal."""

from __future__ import annotations

import numpy as np
import pytest

import egraft
from egraft.ir import evaluate
from egraft.models import make
from egraft.rewrites import Limits, saturate
from egraft.measure import DeviceSpec
from egraft.search import Budget, Space, cost, search
from egraft.search.genome import GenomeSpace
from egraft.search.per_block import block_tasks, splice
from egraft.testing import assert_close, fresh_seed, random_inputs
from search_helpers import CtrlCOnSecondUpdate


@pytest.fixture(scope="module")
def stack():
    model, args = make("gpt2_stack", size="tiny")  # 2 GPT-2 layers + final LayerNorm
    g = egraft.trace(model, args)
    return g, saturate(g)


def _equal(prog, graph):
    seed = fresh_seed()
    xs = random_inputs(graph, seed)
    assert_close(evaluate(prog, xs, np.float64), evaluate(graph, xs, np.float64), tol=1e-9, what=f"seed {seed}")


def test_a_stitched_saturation_gives_one_search_per_distinct_block(stack):
    g, sat = stack
    tasks = block_tasks(sat)
    assert sat.parts and len(tasks) < len(sat.parts)
    assert max(t.occurrences for t in tasks) == 2  # the layer is searched once for both copies
    _equal(splice(g, sat.parts, {}), g)  # every block's own program spliced back is the model
    rng = np.random.default_rng(fresh_seed())
    chosen = {t.key: t.space.build(t.space.random_choices(rng)) for t in tasks}
    _equal(splice(g, sat.parts, chosen), g)


def test_per_layer_reuse_finds_the_program_of_a_whole_model_search(stack, monkeypatch):
    # a fixed CPU spec: the measured one differs between processes, and with it the search's path
    monkeypatch.setitem(cost._SPECS, "cpu", DeviceSpec("fixed test CPU", {"float32": 50e9}, 20e9))
    g, sat = stack
    plan = Budget(seconds=None, trials=60, population=10, patience=4)
    per_layer = search(g, budget=plan, saturation=sat, fitness="model", cache=False, progress=False)
    whole = search(g, budget=plan, saturation=sat, fitness="model", reuse_layers=False, cache=False, progress=False)
    assert per_layer.blocks["occurrences"] == 3 and not whole.blocks
    assert per_layer.graph.structural_hash() == whole.graph.structural_hash()
    assert per_layer.time_s == whole.time_s < per_layer.baseline_time_s
    _equal(per_layer.graph, g)


def test_recomputed_classes_are_duplicated_per_use_and_stay_equal():
    model, args = make("gpt2_block", size="tiny")
    g = egraft.trace(model, args)
    sp = Space.from_egraph(saturate(g, limits=Limits(repeated_layers=False)))
    ch = sp.greedy_choice()
    shared = sp.shared(ch)
    assert shared, "a GPT-2 block computes some value once for several consumers"
    plain = sp.build(list(ch))
    dup = sp.build(list(ch), frozenset(shared))
    assert len(dup.nodes) > len(plain.nodes)
    _equal(dup, g)
    # the genome has materialise bits only where a backend can recompute inside kernels
    assert GenomeSpace(sp, ch, ["triton", "jax"], g).shared and not GenomeSpace(sp, ch, ["jax"], g).shared


def test_ctrl_c_in_the_first_block_keeps_the_other_blocks_own_programs(stack):
    g, sat = stack
    res = search(g, budget=Budget(seconds=None, trials=40, population=6), saturation=sat, fitness="model",
                 cache=False, progress=CtrlCOnSecondUpdate())
    assert res.interrupted and len({t.block for t in res.trials}) == 1  # the later blocks were never searched
    _equal(res.graph, g)
