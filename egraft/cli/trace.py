"""``egraft models`` and ``egraft trace``: the workloads, and a model lowered to the IR."""

from __future__ import annotations

import time

from .common import leaves, load_model, run_model, to_numpy

TRACE_EXAMPLES = """examples:
  egraft trace gated_mlp --check
  egraft trace torch.nn:Tanh --input 3x5:float32 --dump
  egraft trace mymodels.py:build --input 1x16:int64 --int-high 1000 --check"""


def cmd_models(args) -> int:
    from ..models import MODELS

    for name, w in MODELS.items():
        print(f"{name:26s} {w.description}")
    return 0


def cmd_trace(args) -> int:
    from .. import trace
    from ..ir import evaluate
    from ..measure import rel_err

    model, inputs = load_model(args.model, args.input, args.seed, args.int_high)
    t0 = time.perf_counter()
    graph = trace(model, inputs)
    dt = time.perf_counter() - t0
    print(graph.summary())
    print(f"  traced in {dt:.2f} s")
    if args.dump:
        print(graph.dump())
    if args.check:
        want = leaves(run_model(model, inputs, args.int_high))
        got = evaluate(graph, list(inputs))
        worst = max(rel_err(g, to_numpy(w)) for g, w in zip(got, want))
        ok = worst <= 1e-4
        verdict = "ok" if ok else "MISMATCH"
        print(f"  reference interpreter vs eager PyTorch: max relative error {worst:.2e} ({verdict})")
        return 0 if ok else 1
    return 0


def add_parsers(verb) -> None:
    verb("models", cmd_models, help="list the reference workloads", description="List the reference workloads.",
         epilog="example:\n  egraft models")
    t = verb("trace", cmd_trace, help="lower a model to the IR and print its summary", epilog=TRACE_EXAMPLES,
             description="Lower a model to egraft's IR and print its summary; --check compares the IR's reference "
                         "evaluation with eager PyTorch on random inputs.")
    add_model_args(t)
    t.add_argument("--dump", action="store_true", help="print every IR node")
    t.add_argument("--check", action="store_true", help="compare against eager PyTorch on random inputs")


MODEL_HELP = ("workload name (egraft models), package.module:factory or path/to/file.py:factory (the factory "
              "returns the model or (model, example_inputs)), or a Hugging Face checkpoint directory (GPTQ and AWQ "
              "ones included)")


def add_model_args(p, positional: str = "model", metavar: str = "MODEL", help: str = MODEL_HELP) -> None:  # noqa: A002
    """MODEL, --input, --int-high, --seed: how every model-taking verb names its model and inputs."""
    from .common import INT_HIGH

    p.add_argument(positional, metavar=metavar, help=help)
    p.add_argument("--input", action="append", default=[], metavar="SHAPE:DTYPE",
                   help="one model input, e.g. 2x8x64:float32 or 1x128:int64 (repeat per input, in order)")
    p.add_argument("--int-high", type=int, default=INT_HIGH, metavar="N",
                   help=f"random integer inputs are drawn from [0, N) (default {INT_HIGH}; token ids < vocab)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's weights and random inputs")
