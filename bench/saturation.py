"""Saturation time and e-graph size for GPT-2-style stacks (1..12 layers, hidden 768) and llama_block.

Usage: python bench/saturation.py [--layers 1 2 4 8 12] [--hidden 768] [--reps 1] [--no-llama] [--quick] [--out FILE]
Prints one row per (model, mode): mode "plain" saturates the whole graph
(Limits(repeated_layers=False)), "layered" (the default) saturates each distinct
layer once in egglog and stitches the copies in Python (rewrites/repeated.py,
rewrites/stitch.py).  Then, per mode, the time of every stack relative to the
1-layer stack: linear growth would be L x, the goal is far below it.
Times are medians over --reps runs (tracing excluded), 1 thread.

``--quick`` saturates the 1, 2 and 4-layer stacks (and llama_block) once each.
``--out FILE`` writes bench/envelope.py's envelope, then ``rows`` (per model
and mode: ``model``, ``layers``, ``mode``, ``ir_nodes``, ``enodes``,
``classes``, ``iterations``, ``stop``, and ``seconds``: a timing over the
reps) and ``relative_to_1_layer``: per mode, each stack's median over the
1-layer stack's (null without a 1-layer stack).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import envelope  # noqa: E402
import torch  # noqa: E402

import egraft  # noqa: E402
from egraft.models import MODELS  # noqa: E402
from egraft.rewrites import Limits, saturate  # noqa: E402

torch.set_num_threads(1)


def run(g, layered: bool, reps: int):
    lim = Limits(repeated_layers=layered, seconds=120.0)
    times, res = [], None
    for _ in range(reps):
        t = time.perf_counter()
        res = saturate(g, limits=lim)
        times.append(time.perf_counter() - t)
    return times, res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="default 1 2 4 8 12 (--quick: 1 2 4)")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--llama", action=argparse.BooleanOptionalAction, default=True,
                    help="also saturate llama_block at bench size (default: yes)")
    ap.add_argument("--quick", action="store_true", help="small settings: a check that the benchmark works")
    ap.add_argument("--out", default=None, help="write the results to this JSON file")
    args = ap.parse_args()
    envelope.fill(args, quick={"layers": [1, 2, 4]}, full={"layers": [1, 2, 4, 8, 12]})
    spec = MODELS["gpt2_stack"]
    rows = []  # (printed name, model, layers, graph)
    for n in args.layers:
        m = spec.factory(n_layers=n, hidden=args.hidden, heads=args.heads, seed=0)
        g = egraft.trace(m, spec.example_inputs(m, batch=1, seq=16))
        rows.append((f"gpt2_stack L={n}", "gpt2_stack", n, g))
    if args.llama:
        lspec = MODELS["llama_block"]
        lm = lspec.build("bench")
        rows.append(("llama_block (bench)", "llama_block", 1,
                     egraft.trace(lm, lspec.example_inputs(lm, batch=1, seq=16))))
    print(f"{'model':<22} {'mode':<8} {'ir nodes':>8} {'e-nodes':>8} {'e-classes':>9} {'iters':>5} "
          f"{'seconds':>8}  stop")
    secs: dict[tuple[str, bool], float] = {}
    records = []
    for name, model, n_layers, g in rows:
        for layered in (False, True):
            times, res = run(g, layered, args.reps)
            sec = statistics.median(times)
            secs[name, layered] = sec
            mode = "layered" if layered else "plain"
            records.append({"model": model, "layers": n_layers, "mode": mode, "ir_nodes": len(g.nodes),
                            "enodes": res.nodes, "classes": res.classes, "iterations": res.iterations,
                            "stop": res.stop_reason, "seconds": envelope.timing(times)})
            extra = "" if not res.layers else (
                f"  ({res.layers['templates']} templates, {res.layers['repeats']} repeats, "
                f"templates {res.layers['template_seconds']:.2f} s + stitch {res.layers['stitch_seconds']:.2f} s)")
            print(f"{name:<22} {mode:<8} {len(g.nodes):>8} {res.nodes:>8} {res.classes:>9} {res.iterations:>5} "
                  f"{sec:>8.2f}  {res.stop_reason}{extra}", flush=True)

    stacks = [(n, f"gpt2_stack L={n}") for n in args.layers]
    if stacks:
        n0, first = stacks[0]
        print(f"\ntime relative to L={n0} (linear growth would be L/{n0} x):")
        for layered in (False, True):
            ratios = "  ".join(f"L={n}: {secs[name, layered] / secs[first, layered]:.2f}x" for n, name in stacks)
            print(f"  {'layered' if layered else 'plain':<8} {ratios}")
    if args.out:
        one = "gpt2_stack L=1" if 1 in args.layers else None
        relative = {mode: ({str(n): secs[name, layered] / secs[one, layered] for n, name in stacks} if one else None)
                    for mode, layered in (("plain", False), ("layered", True))}
        record = envelope.envelope("saturation", "saturation.py", sys.argv[1:], quick=args.quick, device="cpu",
                                   threads=1)
        record.update({"settings": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                                    "reps": args.reps, "llama": args.llama, "seq": 16, "batch": 1},
                       "rows": records, "relative_to_1_layer": relative})
        envelope.write(args.out, record)


if __name__ == "__main__":
    main()
