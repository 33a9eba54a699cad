"""GPU check for the Triton backend: correctness on the GPU, then timings against torch.

Usage (on a machine with an NVIDIA GPU)::

    python bench/gpu_check.py                # tests + benchmark table
    python bench/gpu_check.py --no-tests     # benchmark only
    python bench/gpu_check.py --models mlp gated_mlp --size tiny

1. Runs the backend correctness tests (tests/backends) with
   EGRAFT_TEST_DEVICE=cuda, so every Triton test (ops, models, knobs, PTX)
   runs compiled on the GPU instead of in the interpreter.
2. Times egraft's Triton kernels against torch eager and torch.compile on the
   attention / MLP workloads of egraft.models at bench sizes
   (triton.testing.do_bench, median of repeats, L2 flushed between runs) and
   prints one table; each egraft result is validated against eager first.

Exits cleanly with a message when no GPU is present.  Uses only APIs present
in torch >= 2.4, triton >= 3.0 (checked against torch 2.11 / triton 3.6).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ["gated_mlp", "gqa_attention", "qknorm_attention", "rmsnorm_linear", "lora_linear", "mlp",
             "gpt2_block", "llama_block"]


def gpu_available() -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("gpu_check: TRITON_INTERPRET=1 is set; unset it to use the GPU.")
        return False
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed.")
        return False
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU is available here; nothing to check (this script needs an NVIDIA GPU).")
        return False
    return True


def run_tests(extra) -> int:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["EGRAFT_TEST_DEVICE"] = "cuda"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "backends"), *extra]
    print("gpu_check: running", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env, cwd=ROOT)


def _median_ms(fn) -> float:
    import triton.testing

    r = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5])
    return float(r[0] if isinstance(r, (list, tuple)) else r)


HEADER = (f"{'workload':18} {'kernels':>7} {'rel err':>9} {'egraft ms':>10} {'eager ms':>9} {'compile ms':>10} "
          f"{'eager/egraft':>12} {'compile/egraft':>14}")


def _row(r) -> str:
    if len(r) == 2:
        return f"{r[0]:18} {r[1]}"
    name, nk, err, te, tt, tc = r
    return f"{name:18} {nk:7d} {err:9.2e} {te:10.3f} {tt:9.3f} {tc:10.3f} {tt / te:12.2f} {tc / te:14.2f}"


def bench(names, size: str):
    import torch

    import egraft
    from egraft.backends import lower
    from egraft.models import MODELS
    from egraft.testing import rel_err

    trace = getattr(egraft, "trace", None)
    if trace is None:
        from egraft.frontend.tracer import trace
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    print(HEADER, flush=True)
    for name in names:
        spec = MODELS[name]
        model = spec.build(size, seed=0)
        args = spec.example_inputs(model, seed=0, size=size)
        try:
            g = trace(model, args)
            ex = lower(g, "triton", "cuda")
        except Exception as e:  # report and keep going: one table for all workloads
            rows.append((name, f"lower failed: {type(e).__name__}: {str(e)[:80]}"))
            print(_row(rows[-1]), flush=True)
            continue
        model = model.cuda()
        dargs = [a.cuda() for a in args]
        with torch.no_grad():
            want = model(*dargs)
            got = ex(*dargs)[0]
            err = rel_err(got.float().cpu().numpy(), want.float().cpu().numpy())
            t_egraft = _median_ms(lambda: ex(*dargs))
            t_eager = _median_ms(lambda: model(*dargs))
            try:
                cm = torch.compile(model)
                cm(*dargs)
                t_comp = _median_ms(lambda: cm(*dargs))
            except Exception as e:
                print(f"gpu_check: torch.compile failed on {name}: {type(e).__name__}: {e}")
                t_comp = float("nan")
        rows.append((name, len(ex.kernels), err, t_egraft, t_eager, t_comp))
        print(_row(rows[-1]), flush=True)  # as it ends: a run stopped by a time limit keeps its rows
    print()
    print(HEADER)
    for r in rows:
        print(_row(r))
    bad = [r for r in rows if len(r) == 2 or not r[2] <= 1e-3]
    if bad:
        print(f"\ngpu_check: {len(bad)} workload(s) failed or disagree with eager beyond 1e-3: {[r[0] for r in bad]}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-tests", action="store_true", help="skip the correctness tests")
    ap.add_argument("--no-bench", action="store_true", help="skip the timings")
    ap.add_argument("--models", nargs="*", default=WORKLOADS)
    ap.add_argument("--size", default="bench", choices=["tiny", "bench"])
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    a = ap.parse_args(argv)
    if not gpu_available():
        return 0
    sys.path.insert(0, str(ROOT))
    rc = 0
    if not a.no_tests:
        rc |= run_tests(a.pytest_args)
    if not a.no_bench:
        rc |= bench(a.models, a.size)
    return rc


if __name__ == "__main__":
    sys.exit(main())
