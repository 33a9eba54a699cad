"""What one call of a compiled JAX program costs on a GPU, apart from its work: arguments and kernel launches.

A decode step of the 494 M model on an H200 spent 4.7 of its 5.2 ms inside
XLA's call while reading its 1 GB of weights should take about 0.3 ms.  Two
suspects, measured apart with programs that do almost no work:

1. arguments: ``jit(f)(*arrays)`` with 1, 50, 300 and 600 small device
   arrays (the step passes about 340: its weights, caches and inputs), ``f``
   summing one element of each (one fused kernel);
2. launches: a chain of ``n`` small matrix products with a nonlinearity
   between them (each product its own kernel), n = 1, 100, 400, 1000, one
   argument.

Each: the median of ``--calls`` calls (after warm-up), the device synchronised
after each call (``block_until_ready``), and also the time of ``--calls``
calls issued back to back then synchronised once (what a pipelined caller
would see).  JSON to ``--out``; also runs on the CPU (``--device cpu``).

    python3 bench/gpu_dispatch.py [--device cuda] [--calls 200] [--out gpu_dispatch.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _time(fn, args, calls: int) -> dict:
    import jax

    for _ in range(10):
        jax.block_until_ready(fn(*args))
    each = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        each.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    outs = [fn(*args) for _ in range(calls)]
    jax.block_until_ready(outs)
    batch = (time.perf_counter() - t0) / calls
    return {"median_us": 1e6 * statistics.median(each), "p90_us": 1e6 * sorted(each)[int(0.9 * len(each))],
            "pipelined_us": 1e6 * batch}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", default="gpu_dispatch.json")
    a = p.parse_args(argv)
    import jax
    import jax.numpy as jnp

    dev = jax.devices("gpu" if a.device.startswith("cuda") else "cpu")[0]
    res: dict = {"device": str(dev), "jax": jax.__version__, "arguments": {}, "launches": {}}
    for n in (1, 50, 300, 600):
        arrays = [jax.device_put(jnp.full((64,), float(i), jnp.float32), dev) for i in range(n)]
        f = jax.jit(lambda *xs: sum(x[0] for x in xs))
        res["arguments"][n] = _time(f, arrays, a.calls)
        print("arguments", n, res["arguments"][n], flush=True)
    x = jax.device_put(jnp.ones((1, 256), jnp.float32), dev)
    w = jax.device_put(jnp.eye(256, dtype=jnp.float32) * 0.5, dev)
    for n in (1, 100, 400, 1000):
        def chain(x, w, n=n):
            for _ in range(n):
                x = jnp.tanh(x @ w)
            return x
        res["launches"][n] = _time(jax.jit(chain), (x, w), a.calls)
        print("launches", n, res["launches"][n], flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
