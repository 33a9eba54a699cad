"""CPU: egraft's JAX backend vs torch eager and torch.compile (Inductor), per workload.

Every egraft.models workload (at "mid" sizes that run in milliseconds to a
second on a 2-core machine, or the registry's "bench" sizes) and tiny-layer
transformers GPT-2 / Llama / BERT.  For each: trace with egraft.trace,
lower to JAX (default knobs), compile torch.compile; warm everything up
(compile time excluded), then time the variants *interleaved*, one call
each per round in a rotating order, and report medians and ratios to eager.

Threads are fixed before torch or jax load: torch.set_num_threads(T), OMP/MKL
at T; XLA's CPU pools follow the process's CPU affinity, so T below the core
count pins the process to T cores (T=1 also sets
--xla_cpu_multi_thread_eigen=false, which alone does not stop XLA's YNNPACK
dots from using every core); numpy/BLAS at 1 (unused in the timed loop).  On
the 2-core CI machine T=2 gives both libraries both cores.

Interleaving torch and XLA calls on 2 cores makes them contend: torch's
libgomp workers spin-wait (milliseconds) after each parallel op and hold the
second core that XLA's pool needs next (measured T=2 mlp: egraft(jax) 4.1 ms
interleaved, 2.5 ms with GOMP_SPINCOUNT=10000, ~2.3 ms alone).  ``--settle``
runs each variant per round as one untimed call then SETTLE_BLOCK timed
back-to-back calls, so most timed calls see their own library's steady state,
as a loop calling one framework does (a sleep instead measured worse: idle
vCPUs wake slowly).  Without it the numbers include the cross-library cost.

``egraft(torch)`` is a call with torch tensors in and out (DLPack, what a
user sees); ``egraft(jax)`` is ``run_jax`` on device arrays.

    python3 bench/cpu_backends.py [--threads 2] [--size mid|bench] [--reps 30] [--only NAME ...] [--no-compile] [--settle]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


SETTLE_BLOCK = 4  # timed calls per variant per round with --settle (after one untimed call)


def _set_threads(n: int) -> None:
    """n threads and n pinned cores, before torch and jax start (egraft.measure.fix_threads says why)."""
    from egraft.measure import fix_threads

    if len(fix_threads(n)) > n:
        print(f"warning: cannot pin to {n} cores; XLA may use all {os.cpu_count()}", file=sys.stderr)


# "mid" sizes: the bench shapes scaled down so one forward takes ~1-100 ms on 2 cores
MID = {
    "mlp": ({"d": 512, "hidden": 2048}, {"batch": 64, "seq": 1}),
    "gpt2_block": ({"hidden": 256, "heads": 4}, {"batch": 2, "seq": 128}),
    "gpt2_stack": ({"n_layers": 4, "hidden": 256, "heads": 4}, {"batch": 1, "seq": 128}),
    "llama_block": ({"hidden": 256, "heads": 8, "kv_heads": 2, "intermediate": 704}, {"batch": 2, "seq": 128}),
    "resnet_block": ({"in_channels": 32, "out_channels": 64, "stride": 2}, {"batch": 4, "seq": 32}),
    "rmsnorm_linear": ({"hidden": 512, "out": 512}, {"batch": 2, "seq": 128}),
    "lora_linear": ({"hidden": 512, "out": 512, "rank": 16}, {"batch": 2, "seq": 128}),
    "gated_mlp": ({"hidden": 256, "intermediate": 704}, {"batch": 2, "seq": 128}),
    "gqa_attention": ({"hidden": 256, "heads": 8, "kv_heads": 2}, {"batch": 2, "seq": 128}),
    "qknorm_attention": ({"hidden": 256, "heads": 8, "kv_heads": 2}, {"batch": 2, "seq": 128}),
    "mask_attention": ({"hidden": 256, "heads": 8, "kv_heads": 2, "mask": "bool"}, {"batch": 2, "seq": 128}),
    "mask_attention_additive": ({"hidden": 256, "heads": 8, "kv_heads": 2, "mask": "additive"}, {"batch": 2, "seq": 128}),
}


def _workloads(size):
    from egraft.models import MODELS

    for name, spec in MODELS.items():
        if size == "mid" and name in MID:
            sizes, ins = MID[name]
            model = spec.factory(**sizes, seed=0)
            args = spec.example_inputs(model, batch=ins["batch"], seq=ins["seq"], seed=0)
        else:
            model = spec.build(size if size != "mid" else "tiny", seed=0)
            args = spec.example_inputs(model, seed=0, size=size if size != "mid" else "tiny")
        yield name, model, args, {}


def _hf_workloads():
    import torch

    try:
        from egraft.models import hf
    except ImportError:
        return
    ids = torch.randint(0, 1000, (2, 128), generator=torch.Generator().manual_seed(0))
    sizes = dict(layers=4, hidden=256, vocab=1000, positions=256)
    for name, kind, extra in (("hf_gpt2", "gpt2", dict(heads=4, lm_head=True)),
                              ("hf_llama", "llama", dict(heads=8, kv_heads=2, intermediate=704, lm_head=True)),
                              ("hf_bert", "bert", dict(heads=4, intermediate=1024))):
        model, kwargs = hf.build(kind, **sizes, **extra)
        yield name, model, (ids,), kwargs


def _block(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, (list, tuple)):
        for o in out:
            _block(o)
    elif hasattr(out, "block_until_ready"):
        out.block_until_ready()
    return out


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def run_one(name, model, args, kwargs, reps, use_compile, extra, settle=False):
    import jax
    import torch

    import egraft
    from egraft.backends import lower
    from egraft.models.hf import flat_outputs
    from egraft.testing import rel_err

    t0 = time.perf_counter()
    g = egraft.trace(model, args, kwargs)
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    ex = lower(g, "jax", "cpu")
    t_lower = time.perf_counter() - t0
    variants = {}
    with torch.no_grad():
        want = flat_outputs(model(*args, **kwargs))
    got = ex(*args)
    err = max(rel_err(a.numpy(), b.numpy()) for a, b in zip(got, want))

    def eager():
        with torch.no_grad():
            return model(*args, **kwargs)

    variants["eager"] = eager
    t_compile = float("nan")
    if use_compile:
        cm = torch.compile(model)

        def compiled():
            with torch.no_grad():
                return cm(*args, **kwargs)

        t0 = time.perf_counter()
        compiled()
        compiled()
        t_compile = time.perf_counter() - t0
        variants["inductor"] = compiled
    variants["egraft(torch)"] = lambda: ex(*args)
    jin = [jax.device_put(x.numpy().astype("int32") if str(x.dtype) == "torch.int64" else x.numpy()) for x in args]
    variants["egraft(jax)"] = lambda: ex.run_jax(jin)
    if "constants" in extra:
        exc = lower(g, "jax", "cpu", {"weights": "constants"})
        variants["egraft(jax,const-w)"] = lambda: exc.run_jax(jin)
    for fn in variants.values():  # warm up
        for _ in range(3):
            _block(fn())
    times = {k: [] for k in variants}
    deadline = time.perf_counter() + 60.0
    names = list(variants)
    for r in range(reps):
        # rotate the order each round: every variant runs after every other equally often
        # (running right after torch eager costs any variant cache and allocator effects)
        for k in names[r % len(names):] + names[:r % len(names)]:
            fn = variants[k]
            if settle:  # a block of back-to-back calls; the first absorbs the switch from the other library
                _block(fn())
            for _ in range(SETTLE_BLOCK if settle else 1):
                t0 = time.perf_counter()
                _block(fn())
                times[k].append(time.perf_counter() - t0)
        if r >= 5 and time.perf_counter() > deadline:
            break
    med = {k: _median(v) for k, v in times.items()}
    return {"name": name, "err": err, "trace_s": t_trace, "lower_s": t_lower, "compile_s": t_compile,
            "med": med, "min": {k: min(v) for k, v in times.items()}, "stats": ex.stats, "rounds": len(times["eager"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", choices=["mid", "bench", "tiny"], default="mid")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (its compiles take minutes)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--constants", action="store_true", help="also time the weights-as-constants knob")
    ap.add_argument("--settle", action="store_true",
                    help="per round: one untimed then SETTLE_BLOCK timed calls per variant (less cross-library contention)")
    a = ap.parse_args()
    _set_threads(a.threads)
    import torch

    torch.set_num_threads(a.threads)
    import jax

    print(f"threads={a.threads} cores={os.cpu_count()} pinned={len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'} settle={a.settle} torch={torch.__version__} jax={jax.__version__} XLA_FLAGS={os.environ['XLA_FLAGS']!r}")
    loads = list(_workloads(a.size)) + ([] if a.no_hf else list(_hf_workloads()))
    rows = []
    for name, model, args, kwargs in loads:
        if a.only and name not in a.only:
            continue
        try:
            res = run_one(name, model, args, kwargs, a.reps, not a.no_compile, {"constants"} if a.constants else set(),
                          a.settle)
        except Exception as e:  # report and go on: one broken workload should not hide the rest
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        rows.append(res)
        m = res["med"]
        cols = "  ".join(f"{k}={v * 1e3:.2f}ms (min {res['min'][k] * 1e3:.2f})" for k, v in m.items())
        print(f"{name}: {cols}  err={res['err']:.1e}  trace={res['trace_s']:.1f}s lower={res['lower_s']:.1f}s "
              f"inductor-compile={res['compile_s']:.1f}s stats={res['stats']}", flush=True)
    if not rows:
        return
    keys = list(rows[0]["med"])
    print()
    head = f"{'workload':<26}" + "".join(f"{k:>15}" for k in keys) + "".join(
        f"{k + '/eager':>22}" for k in keys if k != "eager")
    print(head)
    for r in rows:
        m = r["med"]
        line = f"{r['name']:<26}" + "".join(f"{m.get(k, float('nan')) * 1e3:>13.3f}ms" for k in keys)
        line += "".join(f"{m.get(k, float('nan')) / m['eager']:>22.2f}" for k in keys if k != "eager")
        print(line)
    print("(median ms per forward; ratio < 1 means faster than torch eager)")
    slow = [r["name"] for r in rows if r["med"]["egraft(torch)"] > r["med"]["eager"]]
    print("egraft(torch) slower than eager on:", ", ".join(slow) if slow else "none")


if __name__ == "__main__":
    sys.exit(main())
