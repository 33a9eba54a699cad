"""The `egraft` command line.

Verbs available now:

* ``egraft models`` — list the reference workloads in ``egraft.models``.
* ``egraft trace MODEL [--input SHAPE:DTYPE ...] [--dump] [--check]`` — lower a
  model to the IR, print its summary, and (``--check``) compare the IR's
  reference evaluation with eager PyTorch on random inputs.  MODEL is a
  workload name from ``egraft models`` or ``package.module:factory`` (a
  callable returning an ``nn.Module``; then ``--input`` is required).

``compile``, ``inspect``, ``run`` and ``bench`` arrive with the search and
artifact stages; until then they are not offered.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from .errors import EgraftError


def parse_input_spec(text: str):
    """'2x8x64:float32' (or '2,8,64:float32'; dtype defaults to float32) -> (shape, dtype)."""
    shape_s, _, dtype = text.partition(":")
    dtype = dtype or "float32"
    try:
        shape = tuple(int(p) for p in shape_s.replace(",", "x").split("x") if p)
    except ValueError:
        raise EgraftError(f"bad --input {text!r}: write SHAPE:DTYPE, e.g. 2x8x64:float32") from None
    return shape, dtype


def _load_model(spec: str, inputs: list[str], seed: int):
    import torch

    from .ir import dtypes

    if ":" not in spec:
        from .models import MODELS

        if spec not in MODELS:
            raise EgraftError(f"unknown workload {spec!r}; `egraft models` lists them, or pass module:factory")
        w = MODELS[spec]
        model = w.build("tiny", seed=seed)
        return model, tuple(w.example_inputs(model, seed=seed))
    mod_name, _, fn_name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise EgraftError(f"cannot load {spec!r}: {e}") from None
    if not inputs:
        raise EgraftError("a module:factory model needs --input SHAPE:DTYPE for each model input")
    model = factory().eval()
    gen = torch.Generator().manual_seed(seed)
    args = []
    for text in inputs:
        shape, dt = parse_input_spec(text)
        tdt = getattr(torch, dtypes.check(dt))
        if dtypes.is_float(dt):
            args.append(torch.randn(shape, generator=gen).to(tdt))
        else:
            args.append(torch.randint(0, 8, shape, generator=gen).to(tdt))
    return model, tuple(args)


def cmd_models(args) -> int:
    from .models import MODELS

    for name, w in MODELS.items():
        print(f"{name:26s} {w.description}")
    return 0


def cmd_trace(args) -> int:
    import numpy as np
    import torch

    from . import trace
    from .ir import evaluate
    from .testing import rel_err

    model, inputs = _load_model(args.model, args.input, args.seed)
    t0 = time.perf_counter()
    graph = trace(model, inputs)
    dt = time.perf_counter() - t0
    print(graph.summary())
    print(f"  traced in {dt:.2f} s")
    if args.dump:
        print(graph.dump())
    if args.check:
        with torch.no_grad():
            want = model(*inputs)
        want = [want] if isinstance(want, torch.Tensor) else list(torch.utils._pytree.tree_leaves(want))
        got = evaluate(graph, list(inputs))
        worst = max(rel_err(g, w.detach().float().numpy()) for g, w in zip(got, want))
        ok = worst <= 1e-4
        print(f"  reference interpreter vs eager PyTorch: max relative error {worst:.2e} ({'ok' if ok else 'MISMATCH'})")
        return 0 if ok else 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="egraft", description="equality-saturation tensor compiler")
    sub = p.add_subparsers(dest="verb", required=True)
    sub.add_parser("models", help="list the reference workloads").set_defaults(fn=cmd_models)
    t = sub.add_parser("trace", help="lower a model to the IR and print its summary")
    t.add_argument("model", help="workload name or package.module:factory")
    t.add_argument("--input", action="append", default=[], help="SHAPE:DTYPE of one model input, e.g. 2x8x64:float32")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--dump", action="store_true", help="print every IR node")
    t.add_argument("--check", action="store_true", help="compare against eager PyTorch on random inputs")
    t.set_defaults(fn=cmd_trace)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except EgraftError as e:
        print(f"egraft: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
