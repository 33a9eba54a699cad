"""Per-call overhead of a JAX executable against the bare compiled function.

A two-input elementwise graph (16x24 float32) is lowered with
``egraft.backends.lower(g, "jax", "cpu")`` and timed, per call, as:

* bare ``jax.jit`` on numpy inputs (jax array out, synchronised once per round),
* bare jit on numpy, output read back with ``np.asarray`` (what the executable
  returns for numpy: the floor for "executable, numpy"),
* bare jit on jax device arrays,
* bare jit on torch tensors through the cheapest conversion: ``tensor.numpy()``
  in (jax array out), and both ways (``torch.from_numpy(np.array(out))`` out:
  the floor for "executable, torch"),
* the egraft executable on numpy arrays and on torch tensors,
* torch eager,
* ``egraft.compile``'s ``CompiledModel`` of the same product (JAX backend), its
  own executable called directly, and the artifact it saves loaded back with
  ``egraft.load`` (torch and numpy in): what the user-facing wrappers add per
  call.  Executable and artifact call through the same runner
  (``egraft.runtime.jax_runner``);
* the torch backend's executable of the same graph and its artifact loaded
  back (``egraft.runtime.torch_runner`` under both), torch in.

The variants are interleaved round by round (the order reversed every other
round); each round times ``--calls`` calls of one variant, and the per-call
time of a variant is the median over ``--repeats`` rounds (spread: p10-p90).
Pins the process to one core, one torch thread and single-threaded XLA
(flags set before jax is imported).

``--quick`` takes 30 rounds of 50 calls.  ``--out FILE`` writes
bench/envelope.py's envelope, then ``variants`` (name: a timing of seconds
per call, one sample per round), ``overheads`` (``what`` a wrapper adds:
``variant``'s median minus ``baseline``'s, in ``seconds``), ``shape``,
``graph`` and ``settings`` (rounds, calls, core).

    python3 bench/call_overhead.py [--repeats 200] [--calls 200] [--core 1] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import envelope  # noqa: E402

# (what it measures, variant, baseline): what a wrapper adds per call over the floor below it
OVERHEADS = (
    ("the egraft executable over bare jit, numpy in", "egraft executable, numpy", "bare jit, numpy in"),
    ("the egraft executable over bare jit with its output read back, numpy in", "egraft executable, numpy",
     "bare jit, numpy in, np.asarray"),
    ("the egraft executable over bare jit's cheapest torch crossing", "egraft executable, torch",
     "bare jit, torch in/out"),
    ("CompiledModel's call over its own executable", "CompiledModel, torch", "CompiledModel's executable, torch"),
    ("a loaded artifact over the CompiledModel's executable, torch in", "egraft.load artifact, torch",
     "CompiledModel's executable, torch"),
    ("a loaded artifact over the egraft executable, numpy in", "egraft.load artifact, numpy",
     "egraft executable, numpy"),
    ("a loaded torch-backend artifact over its executable", "torch-backend artifact, torch",
     "torch-backend executable, torch"),
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", "--rounds", dest="repeats", type=int, default=None,
                    help="interleaved rounds: timed samples per variant (default 200; --quick: 30)")
    ap.add_argument("--calls", type=int, default=None, help="calls per round (default 200; --quick: 50)")
    ap.add_argument("--core", type=int, default=None, help="CPU to pin to (default: the first allowed)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds and calls: a check that the benchmark works")
    ap.add_argument("--out", default=None, help="write the results to this JSON file")
    args = ap.parse_args()
    envelope.fill(args, quick={"repeats": 30, "calls": 50}, full={"repeats": 200, "calls": 200})

    core = args.core if args.core is not None else min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import numpy as np
    import torch

    torch.set_num_threads(1)
    import jax

    from egraft.backends import lower
    from egraft.ir import GraphBuilder

    shape = (16, 24)
    b = GraphBuilder()
    x, y = b.input("x", shape, "float32"), b.input("y", shape, "float32")
    g = b.build([x * y])
    ex = lower(g, "jax", "cpu")

    rng = np.random.default_rng(0)
    xn = rng.standard_normal(shape).astype(np.float32)
    yn = rng.standard_normal(shape).astype(np.float32)
    xt, yt = torch.from_numpy(xn.copy()), torch.from_numpy(yn.copy())
    xj, yj = jax.device_put(xn), jax.device_put(yn)

    bare = jax.jit(lambda a, c: a * c)

    def bare_np():
        return bare(xn, yn)

    def bare_np_read():
        return np.asarray(bare(xn, yn))

    def bare_dev():
        return bare(xj, yj)

    def bare_torch_in():  # zero-copy numpy views of the tensors (DLPack import measured ~30 us)
        return bare(xt.numpy(), yt.numpy())

    def bare_torch():  # the cheapest crossing both ways: numpy views in, a copy out
        return torch.from_numpy(np.array(bare(xt.numpy(), yt.numpy())))

    def ex_np():
        return ex(xn, yn)

    def ex_torch():
        return ex(xt, yt)

    def torch_eager():
        return xt * yt

    # the user-facing wrappers around the same program: egraft.compile's CompiledModel and a loaded artifact
    import tempfile

    import egraft

    class Mul(torch.nn.Module):
        def forward(self, a, c):
            return a * c

    cm = egraft.compile(Mul(), example_inputs=(xt, yt), backend="jax", budget="2s", progress=False)
    cm_ex = next(iter(cm.executables.values()))
    art_dir = tempfile.mkdtemp(prefix="egraft-overhead-")
    cm.save(art_dir)
    art = egraft.load(art_dir)

    def cm_torch():
        return cm(xt, yt)

    def cm_ex_torch():
        return cm_ex(xt, yt)

    def art_torch():
        return art(xt, yt)

    def art_np():
        return art(xn, yn)

    from egraft.backends.artifact import save_artifact

    tex = lower(g, "torch", "cpu")
    tart = egraft.load(save_artifact(tex, tempfile.mkdtemp(prefix="egraft-overhead-torch-")))

    def tex_torch():
        return tex(xt, yt)

    def tart_torch():
        return tart(xt, yt)

    variants = {
        "bare jit, numpy in": (bare_np, lambda r: r.block_until_ready()),
        "bare jit, numpy in, np.asarray": (bare_np_read, None),
        "bare jit, device arrays in": (bare_dev, lambda r: r.block_until_ready()),
        "bare jit, torch in (.numpy())": (bare_torch_in, lambda r: r.block_until_ready()),
        "bare jit, torch in/out": (bare_torch, None),
        "egraft executable, numpy": (ex_np, None),
        "egraft executable, torch": (ex_torch, None),
        "torch eager": (torch_eager, None),
        "CompiledModel's executable, torch": (cm_ex_torch, None),
        "CompiledModel, torch": (cm_torch, None),
        "egraft.load artifact, torch": (art_torch, None),
        "egraft.load artifact, numpy": (art_np, None),
        "torch-backend executable, torch": (tex_torch, None),
        "torch-backend artifact, torch": (tart_torch, None),
    }
    # correctness and warm-up
    want = xn * yn
    np.testing.assert_allclose(np.asarray(bare_np()), want, rtol=1e-6)
    np.testing.assert_allclose(ex_np()[0], want, rtol=1e-6)
    np.testing.assert_allclose(bare_torch().numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(ex_torch()[0].numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(cm_torch().numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(art_torch().numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(art_np(), want, rtol=1e-6)
    np.testing.assert_allclose(tex_torch()[0].numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(tart_torch()[0].numpy(), want, rtol=1e-6)
    for fn, _ in variants.values():
        for _ in range(200):
            fn()

    times = {k: [] for k in variants}
    clock = time.perf_counter
    n = args.calls
    for r in range(args.repeats):
        order = list(variants.items())
        if r % 2:
            order.reverse()
        for name, (fn, sync) in order:
            t0 = clock()
            for _ in range(n):
                out = fn()
            if sync is not None:
                sync(out)
            times[name].append((clock() - t0) / n)

    print(f"jax {jax.__version__}, torch {torch.__version__}, core {core}, "
          f"{args.repeats} rounds x {args.calls} calls, graph x*y {shape} float32")
    print(f"{'variant':34s} {'median us':>10s} {'p10':>8s} {'p90':>8s}")
    med = {}
    for name, ts in times.items():
        ts = sorted(t * 1e6 for t in ts)
        p10, p90 = ts[len(ts) // 10], ts[(len(ts) * 9) // 10]
        med[name] = statistics.median(ts)
        print(f"{name:34s} {med[name]:10.2f} {p10:8.2f} {p90:8.2f}")
    for _, ex_name, floor in OVERHEADS:
        print(f"{ex_name} - {floor}: {med[ex_name] - med[floor]:+.2f} us (medians)")
    if args.out:
        record = envelope.envelope("call_overhead", "call_overhead.py", sys.argv[1:], quick=args.quick,
                                   device="cpu", threads=1)
        record.update({
            "settings": {"rounds": args.repeats, "calls": args.calls, "core": core},
            "shape": list(shape), "graph": "x * y of two float32 inputs, lowered by egraft.backends.lower(g, 'jax')",
            "variants": {name: envelope.timing(ts) for name, ts in times.items()},
            "overheads": [{"what": what, "variant": v, "baseline": b,
                           "seconds": statistics.median(times[v]) - statistics.median(times[b])}
                          for what, v, b in OVERHEADS],
        })
        envelope.write(args.out, record)


if __name__ == "__main__":
    main()
