"""What a cached search result answers: the key holds the config's identity, the entry its budget."""

from __future__ import annotations

import numpy as np
import pytest

from egraft.errors import InputError
from egraft.ir import GraphBuilder
from egraft.search import Budget, CompileConfig, search
from egraft.search import stored
from egraft.search.cache import Cache

TINY = dict(trials=4, population=4, patience=1)


def _graph(seed=0):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    w = b.weight("w", rng.standard_normal((8, 6)).astype(np.float32))
    return b.build([((x.sin() @ w) * 2.0).softmax(-1)])


def test_budget_covers_only_an_equal_or_smaller_effort():
    small, large = Budget(seconds=1), Budget(seconds=30)
    assert large.covers(small) and not small.covers(large) and small.covers(small)
    assert Budget(seconds=None).covers(large) and not large.covers(Budget(seconds=None))
    assert not Budget(seconds=30, trials=4).covers(Budget(seconds=30, trials=8))
    assert not Budget(seconds=30, generations=2).covers(Budget(seconds=30))
    assert not Budget(patience=1).covers(Budget(patience=3))
    assert Budget(population=4).covers(Budget(population=12))  # the same effort in another shape


def test_a_result_cached_under_1s_does_not_answer_a_30s_request(tmp_path):
    g, store = _graph(), Cache(tmp_path)
    first = search(g, budget=Budget(seconds=1, **TINY), fitness="model", cache=store, progress=False)
    assert not first.from_cache and first.budget["seconds"] == 1
    larger = search(g, budget=Budget(seconds=30, **TINY), fitness="model", cache=store, progress=False)
    assert not larger.from_cache  # searched again ...
    assert any("smaller budget joined the final comparison" in n for n in larger.notes)  # ... seeded by it
    assert larger.time_s <= first.time_s  # the cached program was a contender: never worse than it
    assert len(store.entries()) == 1 and larger.budget["seconds"] == 30  # the larger entry replaced it
    again = search(g, budget=Budget(seconds=30, **TINY), fitness="model", cache=store, progress=False)
    smaller = search(g, budget=Budget(seconds=1, **TINY), fitness="model", cache=store, progress=False)
    assert again.from_cache and smaller.from_cache  # 30 s covers 30 s and 1 s
    assert smaller.graph.structural_hash() == larger.graph.structural_hash()


def test_rules_limits_seed_and_the_rest_of_the_identity_each_change_the_key():
    g = _graph()
    base = CompileConfig.parse(fitness="model")
    one = next(r.name for r in base.rule_specs() if r.family == "algebra")
    variants = {
        "rules": base.with_(rules=("algebra", "views")),
        "one rule": base.with_(rules=(one,)),
        "limits": base.with_(limits={"iterations": 2}),
        "limits nodes": base.with_(limits={"nodes": 1000}),
        "seed": base.with_(seed=1),
        "fitness": base.with_(fitness="measured"),
        "device": base.with_(device="cuda"),
        "backend": base.with_(backend="jax"),
        "reuse_layers": base.with_(reuse_layers=False),
        "state_in_place": base.with_(state_in_place=True),
    }
    digests = {name: stored.key(g, cfg).digest for name, cfg in variants.items()}
    assert stored.key(g, base).digest not in digests.values(), digests
    assert len(set(digests.values())) == len(digests), digests
    # the budget, progress and validation are not part of the identity; the program is
    for same in (base.with_(budget=1), base.with_(budget="2m"), base.with_(progress=False), base.with_(validate=False)):
        assert stored.key(g, same).digest == stored.key(g, base).digest
    assert stored.key(_graph(seed=1), base).digest == stored.key(g, base).digest  # weights: not structure
    other = GraphBuilder()
    x = other.input("x", (4, 8), "float32")
    assert stored.key(other.build([x.exp()]), base).digest != stored.key(g, base).digest
    key = stored.key(g, variants["limits"])
    assert key.fields()["knobs"] and '"iterations":2' in key.fields()["knobs"]


def test_a_search_under_other_limits_or_seed_is_not_answered_by_the_cache(tmp_path):
    g, store = _graph(), Cache(tmp_path)
    plan = Budget(seconds=None, **TINY)
    search(g, budget=plan, fitness="model", limits={"iterations": 2}, cache=store, progress=False)
    assert not search(g, budget=plan, fitness="model", cache=store, progress=False).from_cache
    assert not search(g, budget=plan, fitness="model", seed=5, cache=store, progress=False).from_cache
    assert search(g, budget=plan, fitness="model", limits={"iterations": 2}, cache=store, progress=False).from_cache
    assert len(store.entries()) == 3


def test_search_options_are_checked_as_the_config_checks_them():
    with pytest.raises(InputError, match="unknown option"):
        search(_graph(), budgett=3, progress=False)
    with pytest.raises(InputError, match="budget"):
        search(_graph(), budget="soon", progress=False)
    with pytest.raises(InputError, match="as keywords"):
        search(_graph(), "jax", progress=False)  # the old positional backend
    cfg = CompileConfig.parse(fitness="model", budget=Budget(seconds=None, **TINY), cache=False)
    res = search(_graph(), cfg, seed=3, progress=False)  # options change the config given
    assert res.seed == 3 and res.fitness == "model"


def test_the_key_is_the_same_in_a_fresh_process():
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.path.insert(0, 'tests/search'); from test_cache_budget import _graph; "
            "from egraft.search import CompileConfig, stored; "
            "print(stored.key(_graph(), CompileConfig.parse(fitness='model')).digest)")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == stored.key(_graph(), CompileConfig.parse(fitness="model")).digest


# --- a budget that is the whole compile's (Budget.started / Budget.after) ---------------------------------------

def test_the_search_share_takes_out_what_came_before_and_the_programs_after():
    from egraft.search.engine import MIN_SEARCH_SHARE, SEARCH_SHARE, search_seconds

    plan = Budget(seconds=60)
    assert search_seconds(plan, spent=5, program_s=1, finals=0) == pytest.approx(60 * SEARCH_SHARE - 5)
    after = Budget(seconds=60, after=4)
    assert search_seconds(after, spent=5, program_s=1, finals=2) == pytest.approx(60 * SEARCH_SHARE - 5 - 6)
    assert search_seconds(after, spent=40, program_s=5, finals=2) == pytest.approx(60 * MIN_SEARCH_SHARE)
    assert search_seconds(Budget(seconds=None, after=4), spent=40, program_s=5, finals=2) is None


def test_when_a_budget_started_and_what_follows_do_not_change_its_effort():
    plain, timed = Budget(seconds=30), Budget(seconds=30, after=4, started=12.5)
    assert plain.covers(timed) and timed.covers(plain)
    assert timed.effort() == plain.effort() and "started" not in timed.effort() and "after" not in timed.effort()


def test_a_search_counts_the_time_before_it_and_says_what_it_had(tmp_path):
    import time

    g, store = _graph(), Cache(tmp_path)
    started = time.perf_counter() - 100.0  # 100 s went before: the search gets its minimum share
    res = search(g, budget=Budget(seconds=8, after=3, started=started, **TINY), fitness="model", cache=store,
                 progress=False)
    note = next(n for n in res.notes if "of the 8 s budget" in n)
    assert "3 more program(s)" in note and "2 s of the 8 s budget" in note  # 25 % of 8 s
    assert set(res.budget) == set(Budget().effort())  # the report and the cache keep the effort alone
    again = search(g, budget=Budget(seconds=8, **TINY), fitness="model", cache=store, progress=False)
    assert again.from_cache  # the entry answers the same effort without the timing fields
