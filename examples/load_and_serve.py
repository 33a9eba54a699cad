"""Serving a saved artifact: load once, answer concurrent requests, and call it inside torch.compile as one op.

    python examples/load_and_serve.py                    # compile a GPT-2 block (10 s search), save, serve it
    python examples/load_and_serve.py --artifact DIR     # serve an artifact you saved (egraft compile -o DIR)
    python examples/load_and_serve.py --small            # tiny block, the cost model instead of timing

1. ``egraft.load(DIR)`` checks the manifest and every file's SHA-256 and
   loads the program once; it imports none of the compiler.
2. A thread pool serves requests with the one loaded artifact (it keeps no
   state between calls, so concurrent calls are safe); each answer is
   checked against the same request answered alone, and, when the model was
   compiled here, against the model in eager PyTorch.
3. ``art.register_op()`` makes the artifact a torch custom op; inside a
   ``torch.compile``'d function Dynamo sees it as one node and never runs it
   while tracing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import egraft
from egraft.measure import TOLERANCE, rel_err
from egraft.measure.inputs import random_array


def compile_and_save(small: bool, budget: float):
    """Compile a GPT-2 block from egraft.models and save it; returns (artifact directory, model)."""
    from egraft.models import MODELS
    from egraft.search import Budget

    spec = MODELS["gpt2_block"]
    model = spec.build("tiny", seed=0, hidden=32 if small else 128)
    example = spec.example_inputs(model, batch=4, seq=16, seed=1)
    opts = {"budget": Budget(seconds=None, trials=3, population=3), "fitness": "model"} if small else {"budget": budget}
    cm = egraft.compile(model, device="cpu", example_inputs=example, **opts)
    out = cm.save(tempfile.mkdtemp(prefix="egraft-serve-"))
    print(f"compiled {type(model).__name__} for {list(cm.executables)} and saved it to {out}")
    return out, model


def request(art, seed: int) -> list[np.ndarray]:
    """A request's inputs: random arrays of the artifact's input shapes (integers as ids in [0, 100))."""
    rng = np.random.default_rng(seed)
    return [random_array(s.shape, s.dtype, rng, *((0, 100) if "int" in s.dtype else ())) for s in art.input_specs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", default=None, help="serve this artifact directory instead of compiling one")
    ap.add_argument("--budget", type=float, default=10.0, help="search seconds when compiling here")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--small", action="store_true", help="tiny model, cost-model search, fewer requests")
    args = ap.parse_args(argv)
    n = 16 if args.small else args.requests

    directory, model = (args.artifact, None) if args.artifact else compile_and_save(args.small, args.budget)

    # 1. load once, at server start
    art = egraft.load(directory)
    print(f"loaded {art!r}")

    # 2. serve n requests from a thread pool, all with the one artifact
    reqs = [request(art, seed) for seed in range(n)]
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        answers = list(pool.map(lambda xs: art(*xs), reqs))  # numpy in, numpy out
    took = time.perf_counter() - t
    alone = [art(*xs) for xs in reqs]  # the same requests, one at a time
    same = all(np.array_equal(a, b) for a, b in zip(answers, alone))
    print(f"served {n} requests on {args.threads} threads in {took * 1e3:.1f} ms; answers equal to the same "
          f"requests served one at a time: {same}")
    ok = same
    if model is not None:  # compiled here: the model itself is the reference
        with torch.no_grad():
            err = max(rel_err(a, model(*map(torch.from_numpy, xs)).numpy()) for a, xs in zip(answers, reqs))
        ok &= err <= TOLERANCE["float32"]
        print(f"max relative error against the model in eager PyTorch: {err:.1e} (allowed {TOLERANCE['float32']:.0e})")

    # 3. the artifact as a custom op, called from a torch.compile'd function
    op = art.register_op("served_model")  # torch.ops.egraft.served_model; flat outputs (here one tensor)

    def serve_step(*xs):
        return torch.softmax(op(*xs), dim=-1)  # post-processing around the artifact, compiled by torch

    def show_graph(gm, example_inputs):  # a torch.compile backend that prints what Dynamo captured
        print("the graph Dynamo captured (the artifact is one node):\n    " + gm.code.strip().replace("\n", "\n    "))
        if args.small:
            return gm.forward  # run the captured graph as is
        from torch._inductor.compile_fx import compile_fx  # what torch.compile's default backend does

        return compile_fx(gm, example_inputs)

    step = torch.compile(serve_step, backend=show_graph, fullgraph=True)
    xs = [torch.from_numpy(x) for x in reqs[0]]
    got, want = step(*xs), torch.softmax(art(*xs), dim=-1)  # torch tensors in: torch tensors out
    err = rel_err(got.numpy(), want.numpy())
    ok &= err <= TOLERANCE["float32"]
    print(f"torch.compile(serve_step) with torch.ops.egraft.served_model inside: relative error against the "
          f"artifact called directly {err:.1e}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
