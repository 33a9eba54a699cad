"""A prompt's prefill planned for the least cost against the exact ladder, on a saved generation.

``StepSpec.plan`` feeds a prompt in chunks of the ladder planned for the
least cost (a call of ``T`` tokens costing ``CALL_ROWS + T`` rows: 15 tokens
are one call of 16 with a column of filler); before, it took the largest
chunk that fits each time, exactly (15 = 4 + 4 + 4 + 1 + 1 + 1: six calls).
This loads ``--artifact`` (a saved generation; a path that does not exist is
compiled into from ``--model`` in ``--dtype``, ``bench/real_models.py``'s
random weights, and kept) in this process pinned to one core with one
thread, and for each prompt length times ``generate(prompt,
max_new_tokens=1)`` (the prefill and one sampled token) with the plan and
with the exact ladder, interleaved, ``--rounds`` rounds: medians, their
ranges and the ratio exact / planned, and whether both give the same token.

    python3 bench/prefill_plan.py --artifact DIR [--model qwen2-0.5b] [--dtype bfloat16]
                                  [--lengths 3 15 20 60 100] [--rounds 7] [--out prefill_plan.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def exact_ladder(n: int, chunks: tuple[int, ...]) -> tuple[int, ...]:
    """The plan before: the largest chunk that fits, each time (no filler)."""
    out = []
    while n > 0:
        out.append(max(c for c in chunks if c <= n))
        n -= out[-1]
    return tuple(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", required=True)
    p.add_argument("--model", default="qwen2-0.5b")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--budget", default="60s")
    p.add_argument("--lengths", type=int, nargs="+", default=[3, 15, 20, 60, 100])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--core", type=int, default=None, help="the core to pin to (default: the last allowed)")
    p.add_argument("--out", default="prefill_plan.json")
    a = p.parse_args(argv)

    from egraft.measure import fix_threads

    os.sched_setaffinity(0, [a.core if a.core is not None else max(os.sched_getaffinity(0))])
    fix_threads(1)
    import numpy as np
    import torch

    import egraft
    from bench import machine, real_models
    from egraft.runtime import step_spec

    if not os.path.exists(a.artifact):
        model = real_models.build(a.model, a.dtype)
        egraft.compile(model, device="cpu", backend="jax", max_batch=1, max_length=real_models.MAX_LENGTH,
                       budget=a.budget, progress=True).save(a.artifact)
        del model
    art = egraft.load(a.artifact)
    chunks = tuple(art.spec.chunks)
    lengths = [n for n in a.lengths if n < art.spec.max_length]
    rng = np.random.default_rng(0)
    prompts = {n: torch.tensor(rng.integers(10, art.spec.vocab_size - 10, (1, n)), dtype=torch.int64)
               for n in lengths}
    planned = step_spec.chunk_plan
    variants = {"planned": planned, "exact": exact_ladder}

    def run(name: str, n: int):
        step_spec.chunk_plan = variants[name]
        try:
            t = time.perf_counter()
            out = art.generate(prompts[n], max_new_tokens=1, do_sample=False)
            return time.perf_counter() - t, int(out[0, -1])
        finally:
            step_spec.chunk_plan = planned

    rows = []
    for n in lengths:
        tokens = {v: run(v, n)[1] for v in variants}  # warm: each program the plans call has run once
        times = {v: [] for v in variants}
        for r in range(a.rounds):
            for v in (list(variants) if r % 2 else list(variants)[::-1]):
                times[v].append(run(v, n)[0] * 1e3)
        med = {v: statistics.median(t) for v, t in times.items()}
        row = {"prompt": n, "plan": list(planned(n, chunks)), "exact": list(exact_ladder(n, chunks)),
               "median_ms": med, "range_ms": {v: [min(t), max(t)] for v, t in times.items()},
               "exact_over_planned": med["exact"] / med["planned"], "same_token": tokens["planned"] == tokens["exact"]}
        rows.append(row)
        print(f"prompt {n:4}: planned {row['plan']} {med['planned']:8.1f} ms  exact {row['exact']} "
              f"{med['exact']:8.1f} ms  {row['exact_over_planned']:.2f}x  same token: {row['same_token']}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "host": machine.host(), "artifact": a.artifact,
                   "chunks": list(chunks), "call_rows": step_spec.CALL_ROWS,
                   "rounds": a.rounds, "command": " ".join(["python3", "bench/prefill_plan.py"] + sys.argv[1:]),
                   "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
