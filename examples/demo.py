"""egraft demo: trace a GPT-2-style block, grow its e-graph, search it on this CPU, and time the winner.

What it shows, stage by stage (each checked against eager PyTorch):

1. ``egraft.trace``: the model lowered to the primitive IR, with its summary;
2. ``egraft.rewrites.saturate``: the e-graph of equivalent programs and its stats;
3. ``egraft.search.search``: the genetic search picks a program, a backend and
   its knobs by validating and timing candidates (small budget), and prints
   its report;
4. the chosen executable against torch eager, called the way a user calls it
   (torch tensors), timed interleaved on one pinned core with one thread for
   both, so the number does not depend on what else the machine is doing;
   a spread too large to conclude from is said, not hidden.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# one pinned core, one thread, for torch and XLA alike, fixed before either library starts its pools
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import egraft  # noqa: E402
from egraft.backends import lower  # noqa: E402
from egraft.ir import evaluate  # noqa: E402
from egraft.models import MODELS  # noqa: E402
from egraft.profiler import noisy, summarize  # noqa: E402
from egraft.rewrites import Limits, saturate  # noqa: E402
from egraft.search import search  # noqa: E402
from egraft.testing import rel_err  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2_block", choices=sorted(MODELS))
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=30.0, help="saturation time limit")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--budget", type=float, default=20.0, help="search seconds")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    spec = MODELS[args.model]
    sizes = {"hidden": args.hidden} if "hidden" in spec.tiny else {}
    model = spec.build("tiny", seed=0, **sizes)
    inputs = spec.example_inputs(model, batch=args.batch, seq=args.seq, seed=1)
    with torch.no_grad():
        want = model(*inputs)
    want_np = [want.numpy()] if isinstance(want, torch.Tensor) else [w.numpy() for w in want]
    print(f"== {args.model}: inputs {[tuple(x.shape) for x in inputs]} (one pinned core, one thread)")

    t0 = time.perf_counter()
    graph = egraft.trace(model, inputs)
    print(f"\n[1] trace ({time.perf_counter() - t0:.2f} s)\n{graph.summary()}")
    err = max(rel_err(g, w) for g, w in zip(evaluate(graph, list(inputs)), want_np))
    print(f"    reference interpreter vs eager PyTorch: relative error {err:.1e}")

    res = saturate(graph, limits=Limits(seconds=args.seconds))
    print(f"\n[2] saturate\n{res.summary()}")

    print(f"\n[3] search ({args.budget:.0f} s budget; a progress bar shows on a terminal)")
    found = search(graph, budget=args.budget, saturation=res, cache=False)
    print(found.report())
    chosen = found.graph
    x64 = [x.double().numpy() if x.is_floating_point() else x.numpy() for x in inputs]
    err64 = max(rel_err(g, w) for g, w in zip(evaluate(chosen, x64, dtype=np.float64),
                                              evaluate(graph, x64, dtype=np.float64)))
    print(f"    the chosen program ({len(chosen)} nodes; idioms used: "
          f"{ {op: c for op, c in chosen.op_counts().items() if op in egraft.ir.IDIOMS} }) "
          f"vs the traced one in float64: relative error {err64:.1e}")

    t0 = time.perf_counter()
    ex = lower(chosen, found.backend, "cpu", found.knobs)
    got = ex(*inputs)
    build_s = time.perf_counter() - t0
    err = max(rel_err(g.numpy(), w) for g, w in zip(got, want_np))
    print(f"\n[4] {found.backend} executable built in {build_s:.2f} s; vs eager PyTorch: relative error {err:.1e}")
    if err > 1e-4:
        print("    MISMATCH: not timing a wrong program")
        return 1
    with torch.no_grad():
        eager_fn = lambda: model(*inputs)  # noqa: E731
        egraft_fn = lambda: ex(*inputs)  # noqa: E731
        for _ in range(3):
            egraft_fn(), eager_fn()
        t_e, t_x = [], []
        for _ in range(args.repeats):  # interleaved, so both see the same machine state
            t_e.append(median_ms(eager_fn, 1) / 1e3)
            t_x.append(median_ms(egraft_fn, 1) / 1e3)
    te, tx = summarize(t_e), summarize(t_x)
    me, mx = te.median * 1e3, tx.median * 1e3
    verdict = "faster" if me > mx else "SLOWER"
    print(f"\n== gained: torch eager {me:.3f} ms ±{te.spread:.0%}, egraft ({found.backend}, searched) {mx:.3f} ms "
          f"±{tx.spread:.0%} -> speed-up {me / mx:.2f}x, egraft is {verdict} (median of {args.repeats} interleaved "
          "calls each, torch tensors in and out, one pinned core, one thread)")
    if noisy(te) or noisy(tx):
        print("   WARNING: the spread is above 10 %: the machine is too busy to conclude; run again when it is quiet")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
