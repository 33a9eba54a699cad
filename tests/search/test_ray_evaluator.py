"""RayEvaluator on a local Ray: the local evaluator's outcomes, shipping, dead workers, start/stop."""

import math
import sys
import time

import numpy as np
import pytest
import ray

from egraft.errors import SearchError
from egraft.ir import GraphBuilder
from egraft.search.candidate import Candidate, Task, bound, knob_items
from egraft.search.evaluators import LocalEvaluator
from egraft.search.ray_evaluator import NEEDS_RAY, RayEvaluator

W = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)


def _graph(wrong: bool = False, w: np.ndarray = W):
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    y = b.input("y", (4,), "float32")
    h = ((x - y) if wrong else (x + y)) @ b.weight("w", w)
    return b.build([h.softmax(-1)])


def _cands():
    g = _graph()
    lib, prim = knob_items({"idioms": "library"}), knob_items({"idioms": "primitive"})
    return [Candidate(g, "jax", lib), Candidate(g, "jax", prim),
            Candidate(_graph(wrong=True), "jax", lib),  # another operation, the same shapes
            Candidate(_graph(w=W * 2), "jax", lib),  # the weight's name bound to other values
            Candidate(_graph(), "jax", prim)]  # the original weight again, after the other one


def _bounds(cands, task):
    return [bound(c.graph, c.backend, c.knobs, task.device) for c in cands]


@pytest.fixture(scope="module")
def ev():
    was_up = ray.is_initialized()
    e = RayEvaluator(workers=2, init_kwargs={"num_cpus": 4})  # more CPUs than actors: room for a second evaluator
    assert e._started == (not was_up)
    yield e
    e.close()
    assert ray.is_initialized() == was_up  # shut down exactly when it started Ray


def test_model_fitness_outcomes_equal_the_local_evaluators(ev):
    task = Task(_graph(), "cpu", "model")
    cands = _cands()
    got = ev.run(task, cands, _bounds(cands, task))
    want = LocalEvaluator(workers=0).run(task, cands, _bounds(cands, task))
    assert [o.status for o in want] == ["estimated", "estimated", "rejected", "rejected", "estimated"]
    for a, b in zip(got, want):
        assert (a.key, a.status, a.time_s, a.message, a.spread) == (b.key, b.status, b.time_s, b.message, b.spread)
        assert a.estimate_s == b.estimate_s or (math.isnan(a.estimate_s) and math.isnan(b.estimate_s))
    # the same task again is not shipped again; a second task (another block) is
    ev.run(task, cands[:1], _bounds(cands[:1], task))
    assert len(ev._shipped) == 1
    other = Task(_graph(wrong=True), "cpu", "model")
    assert [o.status for o in ev.run(other, cands[:3], _bounds(cands[:3], other))] == \
        ["rejected", "rejected", "estimated"]
    assert len(ev._shipped) == 2


def test_measured_statuses_agree_with_the_local_evaluator(ev):
    task = Task(_graph(), "cpu", "measured")
    cands = _cands()
    got = ev.run(task, cands, _bounds(cands, task))
    want = LocalEvaluator(workers=0).run(task, cands, _bounds(cands, task))
    assert [o.key for o in got] == [o.key for o in want]
    assert [o.status for o in got] == [o.status for o in want] == ["timed", "timed", "rejected", "rejected", "timed"]
    assert all(o.time_s > 0 and math.isfinite(o.time_s) for o in got if o.ok)


def _kill(actor) -> None:
    """Kill `actor` and wait until it is dead (``ray.kill`` only asks: a call right after may still reach it)."""
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - RayActorError (or a timeout): it is gone
            return
        time.sleep(0.05)
    raise AssertionError("a killed Ray actor still answers after 30 s")


def test_a_dead_worker_is_replaced_and_a_killer_candidate_fails(ev, monkeypatch):
    task = Task(_graph(), "cpu", "model")
    cands = _cands()[:3]
    want = [o.status for o in ev.run(task, cands, _bounds(cands, task))]  # the actors are up
    for a in ev._actors:  # dead before the batch: the candidates are not to blame
        _kill(a)
    assert [o.status for o in ev.run(task, cands, _bounds(cands, task))] == want
    born_dead = ev._new_actor

    def dead():
        a = born_dead()
        _kill(a)
        return a
    for a in ev._actors:
        _kill(a)
    monkeypatch.setattr(ev, "_new_actor", dead)  # every replacement dies too: as if the candidate killed it
    (out,) = ev.run(task, cands[:1], _bounds(cands[:1], task))
    assert out.status == "failed" and "died" in out.message and out.key == cands[0].key
    monkeypatch.undo()
    ev._actors = [ev._new_actor() for _ in ev._actors]
    assert [o.status for o in ev.run(task, cands, _bounds(cands, task))] == want


def test_an_error_in_the_worker_is_the_candidates_failure(ev, monkeypatch):
    import egraft.search.ray_evaluator as mod

    to_dict = mod.graph_to_dict
    cands = _cands()[1:3]  # each its own graph object
    monkeypatch.setattr(mod, "graph_to_dict", lambda g: {**to_dict(g), "format": 99} if g is cands[0].graph else
                        to_dict(g))  # the worker cannot rebuild this one (IRError)
    task = Task(_graph(wrong=True), "cpu", "model")
    bad, ok = ev.run(task, cands, [math.nan, math.nan])
    assert (bad.status, bad.key, ok.status) == ("failed", cands[0].key, "estimated")
    assert bad.message.startswith("IRError: graph record has format 99")


def test_close_leaves_a_ray_it_did_not_start_running(ev):
    other = RayEvaluator(workers=1)  # Ray is already up (the fixture's)
    assert not other._started
    task = Task(_graph(), "cpu", "model")
    cands = _cands()[:2]
    assert [o.status for o in other.run(task, cands, _bounds(cands, task))] == ["estimated", "estimated"]
    other.close()
    assert ray.is_initialized()
    assert other.run(task, [], []) == []


def test_more_workers_than_the_cluster_holds_is_a_clear_error(ev):
    big = RayEvaluator(workers=64)
    with pytest.raises(SearchError, match="workers="):
        big.run(Task(_graph(), "cpu", "model"), _cands()[:1], [math.nan])
    big.close()


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SearchError) as err:
        RayEvaluator()
    assert str(err.value) == NEEDS_RAY == "the Ray evaluator needs Ray: pip install 'egraft[ray]'"


def test_a_whole_search_on_ray_agrees_with_the_local_one(ev):
    """Same seed and the cost model's fitness: the same program, knobs and trials on both evaluators."""
    from egraft.rewrites import Limits, saturate
    from egraft.search import Budget, search

    g = _graph()
    sat = saturate(g, limits=Limits(repeated_layers=False))
    plan = Budget(seconds=None, trials=12, population=6)
    runs = [search(g, budget=plan, saturation=sat, fitness="model", seed=3, evaluator=e, cache=False,
                   progress=False) for e in (LocalEvaluator(workers=0), ev)]
    assert runs[0].graph.structural_hash() == runs[1].graph.structural_hash()
    assert runs[0].knobs == runs[1].knobs and runs[0].time_s == runs[1].time_s
    assert [(t.key, t.status) for t in runs[0].trials] == [(t.key, t.status) for t in runs[1].trials]
