"""Time front-end tracing of a 12-layer GPT-2-small-size stack (hidden 768, 12 heads).

Reports torch.export + core-ATen decomposition time, and egraft.trace time
once egraft.trace exists.

    python3 bench/bench_trace.py [--layers 12] [--batch 1] [--seq 128]
"""

from __future__ import annotations

import argparse
import time

import torch

from egraft.models import MODELS


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    spec = MODELS["gpt2_stack"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=spec.bench["n_layers"])
    parser.add_argument("--batch", type=int, default=spec.bench_inputs["batch"])
    parser.add_argument("--seq", type=int, default=spec.bench_inputs["seq"])
    a = parser.parse_args()

    model = spec.build("bench", n_layers=a.layers)
    args = spec.example_inputs(model, batch=a.batch, seq=a.seq, size="bench")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"gpt2_stack: {a.layers} layers, {n_params / 1e6:.1f} M params, "
          f"input {tuple(args[0].shape)}")

    ep, t = _timed(lambda: torch.export.export(model, args).run_decompositions())
    n_nodes = sum(1 for n in ep.graph.nodes if n.op == "call_function")
    print(f"torch.export + run_decompositions: {t:.2f} s, {n_nodes} ATen nodes")

    import egraft

    trace = getattr(egraft, "trace", None)
    if trace is None:
        print("egraft.trace: not available yet")
        return
    g, t = _timed(lambda: trace(model, args))
    print(f"egraft.trace: {t:.2f} s -> {g!r:.200}")


if __name__ == "__main__":
    main()
