"""Time egraft.trace on a 12-layer GPT-2-small-sized model (hidden 768, 12 heads, seq 128, batch 1).

Prints the median of 3 runs, split into torch.export (+ core-ATen decomposition)
and egraft's lowering.  Target: under 10 s in total.  ``--out FILE`` writes the
runs as JSON (bench/envelope.py's envelope, then ``model``: what was traced,
and ``export_s``, ``lower_s``, ``total_s``: timings over the runs, each
run's total being its export plus its lowering); ``--quick`` takes 2 runs.

    python3 bench/trace_time.py [--runs 3] [--threads 2] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import envelope  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=None, help="default 3 (--quick: 2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer runs: a check that the benchmark works")
    ap.add_argument("--out", default=None, help="write the results to this JSON file")
    args = ap.parse_args()
    envelope.fill(args, quick={"runs": 2}, full={"runs": 3})
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from egraft.frontend.tracer import export_program, lower_program

    try:
        from egraft.models import MODELS, make

        model, inputs = make("gpt2_stack", size="bench")
        what = "egraft.models gpt2_stack (bench size)"
        layers, hidden = MODELS["gpt2_stack"].bench["n_layers"], MODELS["gpt2_stack"].bench["hidden"]
    except (ImportError, KeyError):
        import transformers

        cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, use_cache=False)
        model = transformers.GPT2Model(cfg).eval()
        inputs = (torch.randint(0, cfg.vocab_size, (1, 128)),)
        what = "transformers GPT2Model n_layer=12"
        layers, hidden = cfg.n_layer, cfg.n_embd
    parameters = sum(p.numel() for p in model.parameters())
    print(f"model: {what}; inputs {[tuple(i.shape) for i in inputs]}; {parameters / 1e6:.1f}M parameters")
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
    if args.out:
        record = envelope.envelope("trace", "trace_time.py", sys.argv[1:], quick=args.quick, device="cpu",
                                   threads=args.threads)
        record.update({
            "settings": {"runs": args.runs},
            "model": {"what": what, "layers": layers, "hidden": hidden, "seq": int(inputs[0].shape[1]),
                      "batch": int(inputs[0].shape[0]), "parameters": parameters, "ir_nodes": nodes,
                      "weights": len(g.weight_ids)},
            "export_s": envelope.timing(export_s),
            "lower_s": envelope.timing(lower_s),
            "total_s": envelope.timing([a + b for a, b in zip(export_s, lower_s)]),
        })
        envelope.write(args.out, record)


if __name__ == "__main__":
    main()
