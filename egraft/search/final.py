"""The search's final comparison: every contender validated as a whole program, then timed interleaved.

The contenders, in order of preference on a tie: the direct lowering, each
seeded extraction (greedy and cost-model best, per candidate backend), the
genetic search's winner, its late-knob variants, and a cached result from a
smaller budget.  Each one not yet validated as this whole program is lowered
and checked against the reference first (a spliced program is only as right
as the whole); one that fails is left out with a note.  The survivors are
timed in rotating turns (:func:`egraft.measure.interleaved`, so all see the
same machine), and the lowest median wins: no contender is then concluded
faster than the chosen one by the project's one verdict
(:func:`egraft.measure.compare`), since that needs the other's median
interval wholly below the chosen one's.  The chosen program's verdict against
the direct lowering is kept; ``noisy`` when a spread above
``egraft.measure.timing.COLLAPSE`` kept it from concluding.  Under
``fitness="model"`` the contenders' roofline estimates decide (nothing runs).

Checking a contender compiles it whole (a 30-layer model: tens of seconds
on one core), so the checks keep to what the budget has left (`check_s`):
the contenders checked already (the direct lowering) cost nothing, the
search's winner is checked first and always, and each other one only while
the seconds left cover another check as long as the last one took; one
left out is named in a note.

The timing is sized to the allowance the budget keeps for it: ``ROUNDS``
turns with as many calls as fit (at most ``MAX_CALLS``), counting a warm-up
call per turn (``interleaved`` makes fewer: it skips them for slow programs
after the first round).
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..measure import compare, interleaved
from ..measure.memory import mark
from ..measure.timing import COLLAPSE
from .candidate import (Candidate, Executables, Task, bound, evaluate_one, own_state, repeatable, saved_state,
                        torch_inputs)

ROUNDS = 5
MAX_CALLS = 7  # per turn; fewer when the allowance is short (a 12-layer model: 0.1 s a call)


@dataclass(frozen=True)
class Contender:
    label: str  # "direct", "greedy/jax", "model/torch", "searched", "late torch.mode=inductor", "cached"
    cand: Candidate
    checked_s: float | None = None  # validated as this whole program: a warm call's seconds (None: not yet)


@dataclass(frozen=True)
class Final:
    """What the final comparison found: the chosen contender and each contender's time."""

    chosen: Contender
    time_s: float
    spread: float
    estimate_s: float
    baseline_time_s: float
    baseline_spread: float
    verdict: dict
    noisy: bool
    rows: list[dict]
    notes: list[str]
    executable: Any = None  # the chosen program's executable (None under the cost model)
    stages: dict = field(default_factory=dict)  # seconds: final_check, final_timing


def calls_per_turn(allowance_s: float | None, per_turn_s: float) -> int:
    """Calls per turn so that ROUNDS turns of every contender (each with a warm-up call) fit the allowance."""
    if allowance_s is None or not math.isfinite(per_turn_s) or per_turn_s <= 0:
        return MAX_CALLS
    return max(1, min(MAX_CALLS, int(allowance_s / (ROUNDS * per_turn_s)) - 1))


def run(task: Task, contenders: Sequence[Contender], memo: Executables, allowance_s: float | None,
        check_s: float | None = None) -> Final:
    """Check the contenders not yet checked (within `check_s` seconds, None: all), time the survivors, choose
    (see the module docstring)."""
    t = _time.perf_counter()
    notes: list[str] = []
    unique: list[Contender] = []
    seen: set[str] = set()
    for c in contenders:
        if c.cand.key not in seen:
            seen.add(c.cand.key)
            unique.append(c)
    kept: dict[int, Contender] = {}
    spent, last = 0.0, None  # seconds the checks took, and the last one's
    # the checked first (free), then the search's winner, then the others in their order of preference
    for i in sorted(range(len(unique)), key=lambda i: (unique[i].checked_s is None, unique[i].label != "searched")):
        c = unique[i]
        if c.checked_s is None:
            if last is not None and check_s is not None and spent + last > check_s:
                notes.append(f"{c.label}: not compared: checking it whole takes about {last:.0f} s and the budget "
                             f"had {max(0.0, check_s - spent):.0f} s left")
                continue
            t1 = _time.perf_counter()
            out = evaluate_one(task, c.cand, memo=memo, timed=False)
            last = _time.perf_counter() - t1
            spent += last
            if not out.ok:
                notes.append(f"{c.label}: the whole program {out.status} ({out.message[:200]}); not compared")
                continue
            c = Contender(c.label, c.cand, out.time_s)
        kept[i] = c
    alive = [kept[i] for i in sorted(kept)]
    ests = [bound(c.cand.graph, c.cand.backend, c.cand.knobs, task.device) for c in alive]
    stages = {"final_check": _time.perf_counter() - t}
    mark("final_check")
    if task.fitness == "model":
        k = min(range(len(alive)), key=lambda i: (ests[i] if math.isfinite(ests[i]) else math.inf, i))
        rows = [_row(c, e, 0.0, e) for c, e in zip(alive, ests)]
        return Final(alive[k], ests[k], 0.0, ests[k], ests[0], 0.0, {}, False, rows, notes, None, stages)
    t = _time.perf_counter()
    exes = [memo.get(c.cand, task.device) for c in alive]
    tin = torch_inputs(own_state(task.reference, task.inputs[0]))
    saved = saved_state(task)  # one snapshot of the state for every contender (a KV cache: hundreds of MB)
    fns = {str(i): repeatable(task.reference, ex, tin, saved) for i, ex in enumerate(exes)}
    known = [c.checked_s for c in alive if c.checked_s and math.isfinite(c.checked_s)]
    per_turn = sum(known) + (len(alive) - len(known)) * max(known, default=0.0)
    # the allowance also caps the rounds: a check call's time (per_turn) can understate a timed call's
    timings = interleaved(fns, task.device, ROUNDS, calls_per_turn(allowance_s, per_turn),
                          jax={str(i) for i, c in enumerate(alive) if c.cand.backend == "jax"}, budget_s=allowance_s)
    ts = [timings[str(i)] for i in range(len(alive))]
    stages["final_timing"] = _time.perf_counter() - t
    mark("final_timing")
    k = min(range(len(alive)), key=lambda i: (ts[i].median, i))
    verdict = compare(ts[k], ts[0])
    noisy = max(ts[k].spread, ts[0].spread) > COLLAPSE
    rows = [_row(c, x.median, x.spread, e) for c, x, e in zip(alive, ts, ests)]
    return Final(alive[k], ts[k].median, ts[k].spread, ests[k], ts[0].median, ts[0].spread, verdict, noisy, rows,
                 notes, exes[k], stages)


def _row(c: Contender, time_s: float, spread: float, estimate_s: float) -> dict:
    return {"label": c.label, "backend": c.cand.backend, "key": c.cand.key, "time_s": time_s, "spread": spread,
            "estimate_s": estimate_s}


__all__ = ["Contender", "Final", "MAX_CALLS", "ROUNDS", "calls_per_turn", "run"]
