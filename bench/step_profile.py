"""Where a decode step's time goes: every XLA operation of a compiled generation's decode step, by kind.

A speed-up of the decode step needs to know what the step spends: this
compiles ``--model`` (``bench/real_models.py``'s models, random weights) in ``--dtype``
with ``--quantize`` for the JAX backend in a child process pinned to one core, or takes
``--artifact`` (a saved generation; a path that does not exist yet is
compiled into and kept), then loads it in a process pinned to
one core with one thread (``egraft.measure.fix_threads``), generates
``--new`` tokens to warm it, times that untraced (``--rounds`` times, the
median), and generates them once more under JAX's profiler.  Every XLA
operation the decode steps ran (the executions after the prompt's) is summed
by kind, its HLO name without the trailing number: ``ffi_call`` is egraft's
generated CPU product (``egraft.runtime.llvm_kernels``), ``ynn_fusion`` a
dot XLA hands to YNNPACK (the attention's), ``slice_bitcast_fusion`` a copy
of the cache slots a step reads, and so on.  It prints milliseconds per step
and share of the step by kind, the step's XLA time and its wall time
(untraced, from Python: what is outside XLA is the loop, sampling and
argument passing).

Shares, not speed-ups: one process, no baseline.  The JAX backend's programs
only (a torch or Triton step runs no XLA operations: refused).  Tracing costs
a little; the untraced wall time is beside it.

    python3 bench/step_profile.py [--model llama-135m] [--dtype float32] [--quantize int8] [--budget 60s] [--new 32]
                                  [--artifact DIR] [--out step_profile.json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench import real_models, real_size  # noqa: E402  (the models and the prompt; the child runner)

MARKERS = ("ThunkExecutor", "end:", "ThreadpoolListener")  # the executor's own events, not operations


def child_compile(a) -> dict:
    import egraft

    model = real_models.build(a.model, a.dtype)
    t0 = time.perf_counter()
    cm = egraft.compile(model, device="cpu", backend="jax", max_batch=1, max_length=real_models.MAX_LENGTH,
                        budget=a.budget, progress=False, quantize=None if a.quantize == "none" else a.quantize)
    compile_s = time.perf_counter() - t0
    cm.save(a.artifact)
    return {"compile_s": compile_s}


def by_kind(planes, decode_steps: int) -> tuple[dict, list[float]]:
    """The operations of the last `decode_steps` executions in a profile's planes: (kind -> [total ns, count],
    each execution's ns).  XLA's CPU client threads are the lines named ``tf_XLA...``."""
    events = sorted((e.start_ns, e.duration_ns, e.name) for p in planes for ln in p.lines
                    if ln.name.startswith("tf_XLA") for e in ln.events)
    runs = [(s, d) for s, d, n in events if n == "ThunkExecutor::Execute"][-decode_steps:]
    kinds: dict[str, list] = collections.defaultdict(lambda: [0, 0])
    i = 0
    for s, d, n in events:
        if n.startswith(MARKERS):
            continue
        while i < len(runs) and s >= runs[i][0] + runs[i][1]:
            i += 1
        if i < len(runs) and runs[i][0] <= s:
            k = kinds[re.sub(r"\.\d+$", "", n)]
            k[0] += d
            k[1] += 1
    return dict(kinds), [d for _, d in runs]


def child_profile(a) -> dict:
    import egraft
    import jax
    from jax.profiler import ProfileData

    art = egraft.load(a.artifact)
    backends = {json.load(open(m))["target"]["backend"]
                for m in glob.glob(os.path.join(a.artifact, "step_*", "manifest.json"))}
    if backends != {"jax"}:
        return {"error": f"the artifact's step programs are {sorted(backends)}: only the JAX backend's run XLA "
                         "operations that JAX's profiler names"}
    ids = real_models.prompt(art.spec.vocab_size)
    prefill_calls = len(art.spec.plan(ids.shape[1]))

    def gen():
        t = time.perf_counter()
        out = art.generate(ids, max_new_tokens=a.new, do_sample=False)
        return time.perf_counter() - t, out.shape[1] - ids.shape[1]

    gen()
    walls = [gen()[0] for _ in range(a.rounds)]
    with tempfile.TemporaryDirectory(prefix="egraft-profile-") as d:
        jax.profiler.start_trace(d)
        traced_s, made = gen()
        jax.profiler.stop_trace()
        (path,) = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        steps = made - 1  # the prompt's calls give the first token, each decode step one more
        kinds, runs = by_kind(ProfileData.from_file(path).planes, steps)
    if len(runs) != steps:
        return {"error": f"the profile holds {len(runs)} decode executions, {steps} expected"}
    step_ms = statistics.median(runs) / 1e6
    xla_ms = sum(v[0] for v in kinds.values()) / 1e6 / steps
    rows = sorted(((k, v[0] / 1e6 / steps, v[1] / steps) for k, v in kinds.items()), key=lambda r: -r[1])
    return {"decode_steps": steps, "prefill_calls": prefill_calls, "tokens": made,
            "wall_s_untraced": statistics.median(walls), "wall_s_traced": traced_s,
            "execute_ms_median": step_ms, "execute_ms_mean": sum(runs) / 1e6 / steps, "operations_ms": xla_ms,
            "kinds": [{"kind": k, "ms_per_step": round(ms, 4), "per_step": round(n, 1),
                       "share_of_operations": round(ms / xla_ms, 4)} for k, ms, n in rows]}


def _run(kind: str, a, core: int) -> dict:
    args = ["--child", kind, "--model", a.model, "--dtype", a.dtype, "--quantize", a.quantize, "--budget", a.budget,
            "--new", str(a.new), "--rounds", str(a.rounds), "--artifact", a.artifact, "--core", str(core)]
    return real_size.run_script(sys.executable, __file__, args)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-135m", choices=sorted(real_models.MODELS))
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--quantize", default="int8", choices=["none", "int8", "int4", "w8a8"])
    p.add_argument("--budget", default="60s")
    p.add_argument("--new", type=int, default=32, help="tokens generated (decode steps: one fewer)")
    p.add_argument("--rounds", type=int, default=5, help="untraced generations timed (their median is reported)")
    p.add_argument("--artifact", help="a saved generation to profile, compiled into and kept if the path does not exist "
                                       "(default: compile --model into a temporary one)")
    p.add_argument("--core", type=int, default=None, help="the core the processes are pinned to (default: the last)")
    p.add_argument("--out", default="step_profile.json")
    p.add_argument("--child", choices=["compile", "profile"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.new < 2:
        p.error("--new must be at least 2 (one decode step)")
    core = a.core if a.core is not None else sorted(os.sched_getaffinity(0))[-1]
    if a.child:
        from egraft.measure import fix_threads

        os.sched_setaffinity(0, [core])
        fix_threads(1)
        print(json.dumps(child_compile(a) if a.child == "compile" else child_profile(a)))
        return 0
    from bench.machine import host

    with tempfile.TemporaryDirectory(prefix="egraft-step-profile-") as d:
        compiled = None
        if a.artifact is None or not os.path.exists(a.artifact):
            a.artifact = a.artifact or os.path.join(d, "artifact")
            os.environ["EGRAFT_CACHE_DIR"] = os.path.join(d, "cache")  # a new user's machine
            compiled = _run("compile", a, core)
            if "error" in compiled:
                print(compiled["error"], file=sys.stderr)
                return 1
        got = _run("profile", a, core)
    if "error" in got:
        print(got["error"], file=sys.stderr)
        return 1
    doc = {"date": time.strftime("%Y-%m-%d"), "host": host(),
           "command": " ".join(["python3", "bench/step_profile.py"] + list(argv if argv is not None else sys.argv[1:])),
           "model": a.model, "dtype": a.dtype, "quantize": a.quantize, "compile": compiled, "profile": got}
    print(f"decode step: {got['execute_ms_median']:.2f} ms in XLA (median of {got['decode_steps']}), of which "
          f"operations {got['operations_ms']:.2f} ms; generate {got['wall_s_untraced']:.3f} s untraced "
          f"({got['tokens']} tokens)")
    for r in got["kinds"][:15]:
        print(f"  {r['ms_per_step']:8.3f} ms/step  {100 * r['share_of_operations']:5.1f} %  "
              f"x{r['per_step']:<6} {r['kind']}")
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
