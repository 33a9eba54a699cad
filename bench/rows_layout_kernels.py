"""The generated CPU product reading a weight where it is stored (layout "rows") against its column panels.

For each weight shape of the 494 M Qwen2-architecture model (the gate/up
product 4864 x 896, the down product 896 x 4864, the QKV product 1152 x 896,
the output layer 151936 x 896) and of the 1.2 B Llama-architecture model
(2048 x 2048, 8192 x 2048, 2048 x 8192), in float32 and bfloat16: enough distinct
random weights to fill about 300 MB (so none stays in cache), ``x [rows, K]``
times each in turn, with the panel layout (``[N / 64, K, 64]``, a copy) and
the rows layout (the ``[N, K]`` weight itself; at more than one row of x
in transposed tiles, or in blocks of dots where the tiles' rows would share
an L1 set: ``runtime.llvm_tiles``, the ``form`` column), called directly (no XLA).
One pinned core, one thread; the two layouts interleaved, ``--turns`` turns
each, medians with their p10-p90 and the ratio of the medians.

    python3 bench/rows_layout_kernels.py [--rows 1 4 16 64] [--turns 15] [--core 1] [--out rows_layout.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPES = [(4864, 896), (896, 4864), (1152, 896), (151936, 896),  # (N, K): the weight as nn.Linear stores it
          (2048, 2048), (8192, 2048), (2048, 8192)]
WIDTH = 64


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--turns", type=int, default=15)
    p.add_argument("--core", type=int, default=None, help="the core to pin to (default: the last allowed)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    from egraft.measure import fix_threads

    os.sched_setaffinity(0, [a.core if a.core is not None else max(os.sched_getaffinity(0))])
    fix_threads(1)
    import ml_dtypes
    import numpy as np

    from egraft.runtime import llvm_kernels as lk
    from egraft.runtime.derived import RECIPES
    from egraft.runtime.llvm_tiles import tiles_alias

    out_rows = []
    for rows in a.rows:
        for dtype, npdt in (("float32", np.float32), ("bfloat16", ml_dtypes.bfloat16)):
            for n, k in SHAPES:
                count = max(1, int(3e8 // (n * k * np.dtype(npdt).itemsize)))
                rng = np.random.default_rng(0)
                ws = [rng.standard_normal((n, k)).astype(npdt) for _ in range(count)]
                x = rng.standard_normal((rows, k)).astype(np.float32)
                out = np.empty((rows, n), np.float32)
                ps = [RECIPES["panels"]({"width": WIDTH, "transposed": True}, w) for w in ws]
                panels = lk.compiled(lk.KernelSpec(dtype, rows, k, ps[0].shape[0], WIDTH))
                stored = lk.compiled(lk.KernelSpec(dtype, rows, k, n // WIDTH, WIDTH, "rows"))
                times = {"panels": [], "rows": []}
                for turn in range(a.turns):
                    order = [("panels", panels, ps), ("rows", stored, ws)]
                    for name, f, arrs in order if turn % 2 else order[::-1]:
                        t0 = time.perf_counter()
                        for arr in arrs:
                            f(x.ctypes.data, arr.ctypes.data, out.ctypes.data)
                        times[name].append((time.perf_counter() - t0) / len(arrs) * 1e3)
                med = {m: float(np.median(v)) for m, v in times.items()}
                form = "one row" if rows == 1 else "dots" if tiles_alias(lk.KernelSpec(dtype, rows, k, 1, WIDTH,
                                                                                        "rows")) else "tiles"
                row = {"rows": rows, "dtype": dtype, "n": n, "k": k, "form": form, "median_ms": med,
                       "p10_p90_ms": {m: [float(np.percentile(v, 10)), float(np.percentile(v, 90))]
                                      for m, v in times.items()},
                       "rows_over_panels": med["rows"] / med["panels"]}
                out_rows.append(row)
                print(f"rows={rows:3} {dtype:9} {n:6} x {k:5}: panels {med['panels']:.3f} ms, rows {med['rows']:.3f} ms"
                      f" ({row['rows_over_panels']:.2f}x, {form})", flush=True)
                del ws, ps
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "command": " ".join(["python3", "bench/rows_layout_kernels.py"]
                       + list(argv if argv is not None else sys.argv[1:])), "rows": out_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
