"""Time egraft.trace on a 12-layer GPT-2-small-sized model (hidden 768, 12 heads, seq 128, batch 1).

Prints the median of 3 runs, split into torch.export (+ core-ATen decomposition)
and egraft's lowering.  Target: under 10 s in total.

    python3 bench/trace_time.py [--runs 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from egraft.frontend.tracer import export_program, lower_program

    try:
        from egraft.models import make

        model, inputs = make("gpt2_stack", size="bench")
        what = "egraft.models gpt2_stack (bench size)"
    except (ImportError, KeyError):
        import transformers

        cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, use_cache=False)
        model = transformers.GPT2Model(cfg).eval()
        inputs = (torch.randint(0, cfg.vocab_size, (1, 128)),)
        what = "transformers GPT2Model n_layer=12"
    print(f"model: {what}; inputs {[tuple(i.shape) for i in inputs]}; "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    export_s, lower_s, nodes = [], [], 0
    for _ in range(args.runs):
        t0 = time.perf_counter()
        ep = export_program(model, inputs)
        t1 = time.perf_counter()
        g = lower_program(ep)
        t2 = time.perf_counter()
        export_s.append(t1 - t0)
        lower_s.append(t2 - t1)
        nodes = len(g.nodes)
    e, lo = statistics.median(export_s), statistics.median(lower_s)
    print(f"graph: {nodes} IR nodes, {len(g.weight_ids)} weights")
    print(f"export+decompose median {e:.2f} s   lowering median {lo:.2f} s   total {e + lo:.2f} s   (runs={args.runs})")


if __name__ == "__main__":
    main()
