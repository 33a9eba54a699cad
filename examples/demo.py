"""egraft demo: trace a GPT-2-style block, grow its e-graph, extract, run it on XLA, and time it.

What it shows, stage by stage (each checked against eager PyTorch):

1. ``egraft.trace``: the model lowered to the primitive IR, with its summary;
2. ``egraft.rewrites.saturate``: the e-graph of equivalent programs and its stats;
3. ``Space.greedy``: one program extracted by the default cost model, checked in float64;
4. ``egraft.backends.lower(..., "jax", "cpu")``: that program as one XLA executable,
   timed against torch eager (median of interleaved runs, 2 threads each).

The genetic search that times many candidates is a later stage;
this demo reports the greedy extraction honestly as what it is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=2")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import egraft  # noqa: E402
from egraft.backends import lower  # noqa: E402
from egraft.ir import evaluate  # noqa: E402
from egraft.models import MODELS  # noqa: E402
from egraft.rewrites import Limits, saturate  # noqa: E402
from egraft.search import Space  # noqa: E402
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
    args = ap.parse_args(argv)
    torch.set_num_threads(2)

    spec = MODELS[args.model]
    sizes = {"hidden": args.hidden} if "hidden" in spec.tiny else {}
    model = spec.build("tiny", seed=0, **sizes)
    inputs = spec.example_inputs(model, batch=args.batch, seq=args.seq, seed=1)
    with torch.no_grad():
        want = model(*inputs)
    want_np = [want.numpy()] if isinstance(want, torch.Tensor) else [w.numpy() for w in want]
    print(f"== {args.model}: inputs {[tuple(x.shape) for x in inputs]}")

    t0 = time.perf_counter()
    graph = egraft.trace(model, inputs)
    print(f"\n[1] trace ({time.perf_counter() - t0:.2f} s)\n{graph.summary()}")
    err = max(rel_err(g, w) for g, w in zip(evaluate(graph, list(inputs)), want_np))
    print(f"    reference interpreter vs eager PyTorch: relative error {err:.1e}")

    res = saturate(graph, limits=Limits(seconds=args.seconds))
    print(f"\n[2] saturate\n{res.summary()}")

    space = Space.from_egraph(res)
    chosen = space.greedy()
    x64 = [x.double().numpy() if x.is_floating_point() else x.numpy() for x in inputs]
    err64 = max(rel_err(g, w) for g, w in zip(evaluate(chosen, x64, dtype=np.float64),
                                              evaluate(graph, x64, dtype=np.float64)))
    print(f"\n[3] greedy extraction: {len(graph)} -> {len(chosen)} nodes; idioms used: "
          f"{ {op: c for op, c in chosen.op_counts().items() if op in egraft.ir.IDIOMS} }")
    print(f"    float64 check against the traced program: relative error {err64:.1e}")

    t0 = time.perf_counter()
    ex = lower(chosen, backend="jax", device="cpu")
    got = ex(*[x.numpy() for x in inputs])
    build_s = time.perf_counter() - t0
    err = max(rel_err(g, w) for g, w in zip(got, want_np))
    print(f"\n[4] JAX/XLA executable built in {build_s:.2f} s; vs eager PyTorch: relative error {err:.1e}")
    if err > 1e-4:
        print("    MISMATCH: not timing a wrong program")
        return 1

    np_inputs = [x.numpy() for x in inputs]
    run_jax = getattr(ex, "run_jax", None)
    if run_jax is not None:
        import jax

        dev_inputs = [jax.device_put(x) for x in np_inputs]
        egraft_fn = lambda: jax.block_until_ready(run_jax(dev_inputs))  # noqa: E731
    else:
        egraft_fn = lambda: ex(*np_inputs)  # noqa: E731
    with torch.no_grad():
        eager_fn = lambda: model(*inputs)  # noqa: E731
        for _ in range(3):
            egraft_fn(), eager_fn()
        t_e, t_x = [], []
        for _ in range(args.repeats):  # interleaved, so both see the same machine state
            t_e.append(median_ms(eager_fn, 1))
            t_x.append(median_ms(egraft_fn, 1))
    me, mx = statistics.median(t_e), statistics.median(t_x)
    verdict = "faster" if me > mx else "SLOWER"
    print(f"\n== gained: torch eager {me:.3f} ms, egraft (greedy, JAX/XLA) {mx:.3f} ms -> speed-up "
          f"{me / mx:.2f}x, egraft is {verdict} (median of {args.repeats} interleaved runs, 2 threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
