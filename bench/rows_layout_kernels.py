import os, sys, time, numpy as np, ml_dtypes
sys.path.insert(0, os.environ.get("ROOT", "/work/wt"))
os.sched_setaffinity(0, [int(os.environ.get("CORE", "1"))])
from egraft.runtime import llvm_kernels as lk
from egraft.runtime.derived import RECIPES
rows = int(os.environ.get("ROWS", "1"))
res = {}
for dtype, npdt in [("float32", np.float32), ("bfloat16", ml_dtypes.bfloat16)]:
    for (n, k) in [(4864, 896), (896, 4864), (1152, 896), (151936, 896)]:
        reps = max(1, int(3e8 // (n * k * np.dtype(npdt).itemsize)))  # ~300 MB of distinct weights: no cache reuse
        rng = np.random.default_rng(0)
        ws = [rng.standard_normal((n, k)).astype(npdt) for _ in range(reps)]
        x = rng.standard_normal((rows, k)).astype(np.float32)
        out = np.empty((rows, n), np.float32)
        width = 64
        ps = [RECIPES["panels"]({"width": width, "transposed": True}, w) for w in ws]
        sp = lk.KernelSpec(dtype, rows, k, ps[0].shape[0], width)
        sr = lk.KernelSpec(dtype, rows, k, n // width, width, "rows")
        fp, fr = lk.compiled(sp), lk.compiled(sr)
        tp, tr = [], []
        for it in range(15):
            for f, arrs, t in ((fp, ps, tp), (fr, ws, tr)) if it % 2 else ((fr, ws, tr), (fp, ps, tp)):
                t0 = time.perf_counter()
                for a in arrs:
                    f(x.ctypes.data, a.ctypes.data, out.ctypes.data)
                t.append((time.perf_counter() - t0) / len(arrs) * 1e3)
        mp, mr = np.median(tp), np.median(tr)
        gb = n * k * np.dtype(npdt).itemsize / 1e9
        print(f"{dtype:9} {n:6}x{k:5} rows={rows}: panels {mp:.3f} ms ({gb/mp*1e3:.1f} GB/s, p10-90 {np.percentile(tp,10):.3f}-{np.percentile(tp,90):.3f})  "
              f"rows {mr:.3f} ms ({gb/mr*1e3:.1f} GB/s, {np.percentile(tr,10):.3f}-{np.percentile(tr,90):.3f})  rows/panels {mr/mp:.2f}", flush=True)
        del ws, ps
