"""What the search's memo of lowered candidates keeps: the pinned ones and the fastest timed, not the rest.

Every candidate executable holds compiled code and its folded weights, so a
memo that kept each one it lowered would hold one more copy per candidate;
these tests show a judged candidate that is neither pinned nor the fastest
so far is dropped at once.  And a program with state (a KV cache) is timed
from one snapshot of the task's state, shared by every contender, never a
copy per contender.
"""

from __future__ import annotations

import math

import numpy as np

from egraft.ir import GraphBuilder
from egraft.search.candidate import Candidate, Executables, Outcome, Task, evaluate_one, knob_items


def _graph(scale: float):
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    w = b.weight("w", rng.standard_normal((8, 8)).astype(np.float32))
    return b.build([(x @ w) * scale])


def _cands(n: int) -> list[Candidate]:  # n different programs on one backend
    return [Candidate(_graph(1.0 + k), "torch", knob_items({})) for k in range(n)]


def _timed(c: Candidate, s: float, status: str = "timed") -> Outcome:
    return Outcome(c.key, status, s if status == "timed" else math.inf)


def test_a_judged_candidate_is_kept_only_while_it_is_the_fastest():
    memo, (a, b, c, d) = Executables(), _cands(4)
    first = memo.get(a, "cpu")
    memo.judged(a, "cpu", _timed(a, 1.0))
    assert memo.size() == 1 and memo.get(a, "cpu") is first  # the fastest so far: kept, not lowered again
    memo.judged(a, "cpu", _timed(a, 1.0))
    memo.get(b, "cpu")
    memo.judged(b, "cpu", _timed(b, 2.0))  # slower: dropped
    assert memo.size() == 1
    memo.get(c, "cpu")
    memo.judged(c, "cpu", _timed(c, 0.5))  # faster: replaces the one it beat
    assert memo.size() == 1 and memo.get(a, "cpu") is not first
    memo.judged(a, "cpu", _timed(a, 1.0))
    memo.get(d, "cpu")
    memo.judged(d, "cpu", _timed(d, 0.0, "rejected"))
    assert memo.size() == 1


def test_pinned_candidates_stay_and_a_pinned_fastest_lets_the_unpinned_best_go():
    memo, (a, b, c) = Executables(), _cands(3)
    memo.hold([a.key])
    pinned = memo.get(a, "cpu")
    memo.judged(a, "cpu", _timed(a, 3.0))
    memo.get(b, "cpu")
    memo.judged(b, "cpu", _timed(b, 2.0))
    assert memo.size() == 2
    memo.get(c, "cpu", pin=True)
    memo.judged(c, "cpu", _timed(c, 1.0))  # the fastest is pinned: b is no longer worth keeping
    assert memo.size() == 2 and memo.get(a, "cpu") is pinned
    memo.release()
    assert memo.size() == 0


def test_a_checked_candidate_waits_for_its_timing():
    memo, (a,) = Executables(), _cands(1)
    ex = memo.get(a, "cpu")
    memo.judged(a, "cpu", _timed(a, 0.0, "checked"))
    assert memo.get(a, "cpu") is ex


def test_evaluate_one_leaves_only_the_fastest_in_the_memo():
    memo, cands = Executables(), _cands(4)
    outs = [evaluate_one(Task(c.graph, "cpu", "measured"), c, memo=memo) for c in cands]
    assert all(o.status == "timed" for o in outs), [o.message for o in outs]
    assert memo.size() == 1 and memo.best_s == min(o.time_s for o in outs)


def _counter():  # s <- s + x: each call moves the state on
    b = GraphBuilder()
    x = b.input("x", (64,), "float32")
    s = b.input("s", (64,), "float32", role="state")
    return b.build([s + x, s * 2.0], aliases={0: "s"})


def test_timed_calls_start_from_the_task_s_state_without_a_copy_of_it_per_contender(monkeypatch):
    import torch

    from egraft.backends import lower
    from egraft.search.candidate import repeatable, saved_state, torch_inputs

    g = _counter()
    task = Task(g, "cpu", "measured")
    drawn = [np.array(x, copy=True) for x in task.inputs[0]]
    saved = saved_state(task)
    assert [t.data_ptr() for t in saved] == [task.inputs[0][1].ctypes.data]  # a view of the task's array
    clones = []
    real_clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: clones.append(t) or real_clone(t, *a, **k))
    ex = lower(g, "torch", "cpu", {})
    tin = torch_inputs([np.array(x, copy=True) for x in task.inputs[0]])
    calls = [repeatable(g, ex, tin, saved) for _ in range(3)]
    for call in calls * 2:
        out = call()
        np.testing.assert_allclose(out[1].numpy(), drawn[1] * 2.0)  # every call starts from the drawn state
    assert clones == []
    out = evaluate_one(task, Candidate(g, "torch", knob_items({})), memo=Executables())
    assert out.status == "timed", out.message
    for x, want in zip(task.inputs[0], drawn):  # the task's input set is as drawn
        np.testing.assert_array_equal(x, want)


def test_the_final_comparison_snapshots_the_state_once_for_every_contender(monkeypatch):
    import torch

    from egraft.search import final

    def program(order: int):
        b = GraphBuilder()
        x = b.input("x", (64,), "float32")
        s = b.input("s", (64,), "float32", role="state")
        new = [s + x, x + s, (s + x) * 1.0][order]
        return b.build([new, s * 2.0], aliases={0: "s"})

    task = Task(program(0), "cpu", "measured")
    contenders = [final.Contender(f"c{k}", Candidate(program(k), "torch", knob_items({}))) for k in range(3)]
    assert len({c.cand.key for c in contenders}) == 3
    clones = []
    real_clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: clones.append(t.shape) or real_clone(t, *a, **k))
    fin = final.run(task, contenders, Executables(), allowance_s=0.5)
    assert len(fin.rows) == 3 and clones == []


def test_the_final_comparison_checks_the_search_winner_first_and_others_only_while_the_budget_lasts(monkeypatch):
    """Each unchecked contender is a whole-program compile and check: with no seconds left only the search's
    winner is checked (the others named in notes); with no limit every one is."""
    from egraft.search import final

    def program(order: int):
        b = GraphBuilder()
        x = b.input("x", (64,), "float32")
        return b.build([[x + 1.0, 1.0 + x, (x + 1.0) * 1.0, x * 1.0 + 1.0][order]])

    task = Task(program(0), "cpu", "measured")
    checked = []
    real = final.evaluate_one
    monkeypatch.setattr(final, "evaluate_one", lambda t, cand, **k: checked.append(cand.key) or real(t, cand, **k))
    direct = final.Contender("direct", Candidate(program(0), "torch", knob_items({})), 1e-6)
    others = [final.Contender(label, Candidate(program(k), "torch", knob_items({})))
              for k, label in ((1, "greedy/torch"), (2, "model/torch"), (3, "searched"))]
    fin = final.run(task, [direct, *others], Executables(), allowance_s=0.5, check_s=0.0)
    assert checked == [others[2].cand.key]
    assert [r["label"] for r in fin.rows] == ["direct", "searched"]
    assert sum("not compared" in n and "budget" in n for n in fin.notes) == 2, fin.notes
    checked.clear()
    fin = final.run(task, [direct, *others], Executables(), allowance_s=0.5, check_s=None)
    assert checked == [others[2].cand.key, others[0].cand.key, others[1].cand.key]
    assert [r["label"] for r in fin.rows] == ["direct", "greedy/torch", "model/torch", "searched"]
