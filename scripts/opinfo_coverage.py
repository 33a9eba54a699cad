"""How much of PyTorch's OpInfo database egraft.trace lowers correctly.

For each op in ``torch.testing._internal.common_methods_invocations.op_db``,
the first few float32 CPU samples are wrapped in a module (tensor arguments
become inputs; every non-tensor argument and keyword is captured in the
module), traced with egraft, evaluated with the reference interpreter and
compared with eager PyTorch.  Each op gets one status:

  passed         every sample that torch.export could capture matched eager
  wrong          some sample's result differs (or the lowering raised an internal error)
  unsupported    some sample reached an ATen op with no lowering rule (the op is listed)
  export-failed  torch.export could not capture any sample
  skipped        no usable sample (non-tensor outputs, complex dtypes, random ops, ...)

Runnable by hand, not part of CI (it takes minutes):

    python3 scripts/opinfo_coverage.py [--samples 3] [--jobs 2] [--ops add,mul] [--verbose]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import warnings
from collections import Counter

STATUS_ORDER = ("wrong", "unsupported", "export-failed", "skipped", "passed")
TOL = 1e-4


def _check_sample(op, sample):
    """(status, detail) for one sample."""
    import numpy as np
    import torch
    from torch.utils import _pytree as pytree

    from egraft.errors import EgraftError, TraceError, UnsupportedOpError
    from egraft.ir import evaluate
    from egraft.ir.evaluate import to_numpy
    from egraft.frontend.tracer import export_program, lower_program
    from egraft.testing import rel_err

    structure = (sample.input, tuple(sample.args), dict(sample.kwargs))
    leaves, spec = pytree.tree_flatten(structure)
    tensor_pos = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = [leaves[i].detach().clone() for i in tensor_pos]
    if not tensors:
        return "skipped", "no tensor arguments"
    if any(t.is_complex() or t.dtype not in _SUPPORTED for t in tensors):
        return "skipped", "argument dtype egraft does not support"

    class Wrapped(torch.nn.Module):
        def forward(self, *ts):
            vals = list(leaves)
            for i, t in zip(tensor_pos, ts):
                vals[i] = t
            inp, args, kwargs = pytree.tree_unflatten(vals, spec)
            return op.op(inp, *args, **kwargs)

    if "empty" in op.name:
        return "skipped", "result contents unspecified (uninitialised memory)"
    model = Wrapped()
    try:
        with torch.no_grad():
            want = model(*[t.clone() for t in tensors])
            again = model(*[t.clone() for t in tensors])
    except Exception as e:
        return "skipped", f"eager failed: {type(e).__name__}"
    want_leaves = pytree.tree_leaves(want)
    if not want_leaves or not all(isinstance(w, torch.Tensor) for w in want_leaves):
        return "skipped", "non-tensor output"
    if any(w.layout != torch.strided for w in want_leaves) or any(t.layout != torch.strided for t in tensors):
        return "skipped", "sparse tensors"
    if any(w.is_complex() or w.dtype not in _SUPPORTED for w in want_leaves):
        return "skipped", "output dtype egraft does not support"
    if not all(torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True))
               for a, b in zip(want_leaves, pytree.tree_leaves(again))):
        return "skipped", "nondeterministic op"
    try:
        ep = export_program(model, tensors)
    except TraceError as e:
        return "export-failed", str(e).splitlines()[0][:160]
    except EgraftError as e:
        return "export-failed", str(e).splitlines()[0][:160]
    try:
        g = lower_program(ep)
        got = evaluate(g, [to_numpy(t) for t in tensors])
    except UnsupportedOpError as e:
        return "unsupported", e.op
    except Exception as e:  # an internal error in a rule is a wrong lowering
        return "wrong", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if len(got) != len(want_leaves):
        return "wrong", f"{len(got)} outputs, eager has {len(want_leaves)}"
    for k, (a, w) in enumerate(zip(got, want_leaves)):
        w = to_numpy(w)
        if a.shape != w.shape or a.dtype != w.dtype:
            return "wrong", f"output {k}: {a.shape}:{a.dtype} vs torch {w.shape}:{w.dtype}"
        if np.issubdtype(w.dtype, np.floating):
            err = rel_err(a, w)
            if not err <= TOL:
                return "wrong", f"output {k}: relative error {err:.3g}"
        elif not np.array_equal(a, w):
            return "wrong", f"output {k} ({w.dtype}) differs"
    return "passed", ""


_SUPPORTED = None


def _run_op(args):
    """Worker: status and details for one op (by index into op_db)."""
    index, n_samples = args
    global _SUPPORTED
    warnings.filterwarnings("ignore")
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    torch.set_num_threads(1)
    if _SUPPORTED is None:
        _SUPPORTED = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool}
    op = op_db[index]
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    results = []
    try:
        samples = op.sample_inputs("cpu", torch.float32, requires_grad=False)
        for k, sample in enumerate(samples):
            if k >= n_samples:
                break
            try:
                results.append(_check_sample(op, sample))
            except Exception as e:
                results.append(("wrong", f"harness: {type(e).__name__}: {str(e)[:120]}"))
    except Exception as e:
        results.append(("skipped", f"no samples: {type(e).__name__}"))
    if not results:
        return name, "skipped", "no float32 samples", []
    statuses = [s for s, _ in results]
    captured = [r for r in results if r[0] not in ("export-failed", "skipped")]
    if not captured:
        status = "export-failed" if "export-failed" in statuses else "skipped"
    else:
        status = min((s for s, _ in captured), key=STATUS_ORDER.index)
    detail = next((d for s, d in results if s == status), "")
    return name, status, detail, results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=3, help="samples per op (the first N)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    ap.add_argument("--ops", default="", help="comma-separated op names to check (default: all)")
    ap.add_argument("--verbose", action="store_true", help="print every sample's status")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = {s.strip() for s in args.ops.split(",") if s.strip()}
    indices = [i for i, op in enumerate(op_db) if not wanted or op.name in wanted]
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.jobs, maxtasksperchild=50) as pool:
        rows = pool.map(_run_op, [(i, args.samples) for i in indices], chunksize=4)
    width = max(len(r[0]) for r in rows)
    print(f"{'op':<{width}}  status         detail")
    for name, status, detail, results in sorted(rows, key=lambda r: (STATUS_ORDER.index(r[1]), r[0])):
        print(f"{name:<{width}}  {status:<13}  {detail}")
        if args.verbose:
            for s, d in results:
                print(f"{'':<{width}}    - {s}: {d}")
    counts = Counter(r[1] for r in rows)
    missing = Counter(r[2] for r in rows if r[1] == "unsupported")
    print()
    print("totals: " + ", ".join(f"{s} {counts.get(s, 0)}" for s in STATUS_ORDER) + f"  (of {len(rows)} ops, "
          f"{args.samples} samples each, {time.time() - t0:.0f} s)")
    if missing:
        print("most common missing lowerings: " + ", ".join(f"{op} ({n})" for op, n in missing.most_common(15)))


if __name__ == "__main__":
    main()
