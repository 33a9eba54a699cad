"""egraft.compile from Python: one program per input shape, compiled when first needed.

    python examples/compile_api.py            # a Llama block, 10 s of search per shape
    python examples/compile_api.py --small    # tiny sizes, the cost model instead of timing (seconds)

A CompiledModel keeps one program per input *signature* (shapes, dtypes,
device), as torch.compile does: the example inputs' signature is compiled by
``egraft.compile``, any other on its first call.  Every program is checked
against eager PyTorch before it is used; here the outputs are checked again.
"""

from __future__ import annotations

import argparse
import time

import torch

import egraft
from egraft.models import MODELS
from egraft.measure import TOLERANCE, rel_err
from egraft.search import Budget


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=10.0, help="search seconds per input shape")
    ap.add_argument("--small", action="store_true", help="tiny model; rank candidates by the cost model")
    args = ap.parse_args(argv)

    spec = MODELS["llama_block"]  # RMSNorm, rotary embeddings, grouped-query attention, SwiGLU
    model = spec.build("tiny", seed=0, **({} if args.small else {"hidden": 128, "intermediate": 256}))
    short = spec.example_inputs(model, batch=2, seq=8, seed=1)    # (x,) with x of shape [2, 8, hidden]
    long = spec.example_inputs(model, batch=1, seq=16, seed=2)    # another shape: another program

    # fitness="model" ranks candidates with the roofline cost model instead of timing them: fast, less accurate
    opts = ({"budget": Budget(seconds=None, trials=3, population=3), "fitness": "model"} if args.small
            else {"budget": args.budget})
    t = time.perf_counter()
    cm = egraft.compile(model, device="cpu", example_inputs=short, **opts)
    print(f"egraft.compile compiled {list(cm.executables)} in {time.perf_counter() - t:.1f} s")

    for inputs in (short, long, long):  # the first call with `long` compiles its signature; the second does not
        t = time.perf_counter()
        got = cm(*inputs)
        took = time.perf_counter() - t
        with torch.no_grad():
            want = model(*inputs)
        err = rel_err(got.numpy(), want.numpy())
        print(f"cm(x of shape {list(inputs[0].shape)}) took {took * 1e3:8.1f} ms; relative error against eager "
              f"PyTorch {err:.1e} (allowed {TOLERANCE['float32']:.0e})")
        if err > TOLERANCE["float32"]:
            print("MISMATCH")
            return 1
    print(f"compiled signatures: {list(cm.executables)}\n")

    for name in cm.programs:  # measuring is explicit: against eager PyTorch only (inductor=True adds torch.compile)
        cm.measure(name, inductor=False)
    print(cm.report())  # one section per signature; reporting runs nothing
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
