"""The search against the direct lowering, greedy extraction, torch eager and torch.compile, per workload.

For each workload (RMSNorm+Linear, LoRA, gated MLP, GQA attention, QK-norm
attention, the GPT-2 and Llama blocks of ``egraft.models``):

1. trace and saturate (timed);
2. ``egraft.search.search`` with a time budget (fitness: measured on this CPU);
3. random sampling at the same number of distinct trials (uniform genomes of
   the same genome space, each validated and timed like the search's);
4. the final comparison: direct lowering (input graph, JAX defaults),
   greedy extraction (JAX defaults), the searched program (its backend and
   knobs), torch eager, torch.compile (Inductor) -- warmed up, then timed
   interleaved: every round calls each variant ``--calls`` times in a
   rotating order; medians over all rounds and their spread (p10-p90 / median).

Threads are fixed before torch/jax load (as bench/cpu_backends.py does: one
thread pins the process to one core).  Writes a JSON file per run and prints
a Markdown table.  ``--gpt2-compile`` also times trace + saturate + search of
a 12-layer GPT-2-small-sized stack (batch 1, sequence 128), with the share of
the budget its baseline and final comparison took (``measuring_share``).

``--device cuda`` searches on the GPU (the backends that run there, Triton
first), times with ``do_bench`` (CUDA events: ``--calls`` is not used) and adds
``torch.compile(mode="max-autotune")`` as the variant "torch.compile
max-autotune"; without a CUDA device visible to torch it exits with status 2
before doing anything.  ``--quick``: rmsnorm_linear, gated_mlp and gpt2_block,
8 s of search each, 3 rounds.  An option given explicitly overrides both.

``--out FILE`` writes bench/envelope.py's envelope, ``settings`` and one row
per workload: the trace, saturation, search and random-sampling seconds, the
search's stages, counts and final contenders, ``n_trials`` (distinct
candidates run) and ``trials`` (every trial in order: ``[index, time_s or
null, status, block]``), ``median_s`` / ``spread`` / ``speedup_over_eager``
per variant, ``timings`` (per variant, a timing: median, spread, n, samples),
``verdicts`` (``egraft.measure.compare`` of the searched program against each
other variant), ``roofline_bound_s`` (the cost model's bound of the searched
program), ``flops`` and ``bytes`` (the cost model's count for one call of the
input graph, lowered directly) and the ratios of the table.

    python3 bench/search.py [--threads 1] [--size mid|bench] [--budget 40] [--rounds 9] [--only NAME ...]
                            [--device cpu|cuda] [--quick] [--gpt2-compile] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import envelope  # noqa: E402
from cpu_backends import MID, _set_threads  # noqa: E402

WORKLOADS = ["rmsnorm_linear", "lora_linear", "gated_mlp", "gqa_attention", "qknorm_attention", "gpt2_block",
             "llama_block"]
QUICK_WORKLOADS = ["rmsnorm_linear", "gated_mlp", "gpt2_block"]
MAX_AUTOTUNE = "torch.compile max-autotune"  # the CUDA-only peer variant


def _model(name, size):
    from egraft.models import MODELS

    spec = MODELS[name]
    if size == "mid":
        sizes, ins = MID[name]
        model = spec.factory(**sizes, seed=0)
        return model, spec.example_inputs(model, batch=ins["batch"], seq=ins["seq"], seed=0)
    model = spec.build(size, seed=0)
    return model, spec.example_inputs(model, seed=0, size=size)


def _random_sampling(space, task, backends, graph, trials, seed):
    """Best validated time of `trials` uniformly random genomes (distinct programs), timed like the search's."""
    import random

    from egraft.search.candidate import evaluate_one
    from egraft.search.genome import GenomeSpace

    gs = GenomeSpace(space, space.greedy_choice(), backends, graph)
    rng = random.Random(seed)
    seen, best, tried = set(), math.inf, 0
    attempts = 0
    while tried < trials and attempts < trials * 20:
        attempts += 1
        cand = gs.candidate(gs.random(rng))
        if cand.key in seen:
            continue
        seen.add(cand.key)
        tried += 1
        out = evaluate_one(task, cand)
        if out.ok:
            best = min(best, out.time_s)
    return best, tried


def _on(device, x):
    """A tensor argument moved to `device` (anything else as it is)."""
    return x.to(device) if hasattr(x, "to") else x


def run_one(name, size, budget, rounds, calls, seed, device="cpu"):
    import torch

    import egraft
    from egraft.backends import lower, resolve
    from egraft.measure import compare, interleaved
    from egraft.rewrites import saturate
    from egraft.search import Budget, Space, search
    from egraft.search.candidate import Task
    from egraft.search.cost import estimate
    from egraft.search.engine import candidate_backends

    model, args = _model(name, size)
    t0 = time.perf_counter()
    graph = egraft.trace(model, args)
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    sat = saturate(graph)
    t_sat = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = search(graph, budget=Budget(seconds=budget), saturation=sat, seed=seed, cache=False, progress=False,
                 device=device)
    t_search = time.perf_counter() - t0
    space = Space.from_egraph(sat)
    n_trials = sum(res.counts.get(k, 0) for k in ("timed", "rejected", "failed"))
    task = Task(graph, device, "measured", seed)
    ga_best = min([t.time_s for t in res.trials if t.status == "timed"], default=math.inf)
    t0 = time.perf_counter()
    rnd_best, rnd_n = _random_sampling(space, task, candidate_backends("auto", device), graph, n_trials, seed)
    t_random = time.perf_counter() - t0

    direct = resolve("auto", device)  # the direct lowering's backend: the device's first candidate (jax on a CPU)
    work = estimate(graph, direct, None, device)
    greedy = space.greedy()
    exes = {"direct": lower(graph, direct, device), "greedy": lower(greedy, direct, device),
            "searched": lower(res.graph, res.backend, device, res.knobs)}
    if device != "cpu":  # the torch variants run where the programs do (the trace above read the CPU model)
        model, args = copy.deepcopy(model).to(device), tuple(_on(device, a) for a in args)
    with torch.no_grad():
        want = model(*args)
    compiled = torch.compile(model)
    variants = {"eager": lambda: model(*args), "torch.compile": lambda: compiled(*args)}
    if device == "cuda":
        autotuned = torch.compile(copy.deepcopy(model), mode="max-autotune")
        variants[MAX_AUTOTUNE] = lambda: autotuned(*args)
    for k, ex in exes.items():
        variants[k] = (lambda ex=ex: ex(*args))
    with torch.no_grad():
        for k, fn in variants.items():  # warm-up (compiles), and a correctness check of every variant
            for _ in range(2):
                out = fn()
            got = out[0] if isinstance(out, (list, tuple)) else out
            ref = want[0] if isinstance(want, (list, tuple)) else want
            err = float((got.float() - ref.float()).abs().max() / (ref.float().abs().max() + 1e-30))
            if not err < 1e-3:
                raise AssertionError(f"{name}: {k} disagrees with eager (max rel err {err:.2e})")
        timings = interleaved(variants, device, rounds, calls)
    stats = {k: (t.median, t.spread) for k, t in timings.items()}
    eager = stats["eager"][0]
    row = {
        "workload": name, "size": size, "trace_s": t_trace, "saturate_s": t_sat, "search_s": t_search,
        "random_s": t_random, "search_stages": res.stages, "noisy_final": res.noisy, "n_trials": n_trials,
        "random_trials": rnd_n, "ga_best_s": ga_best,
        "random_best_s": rnd_best, "rank_correlation": res.rank_correlation, "backend": res.backend,
        "knobs": res.knobs, "direct_backend": direct, "roofline_bound_s": res.estimate_s,
        "flops": work.flops, "bytes": work.bytes, "counts": res.counts,
        "median_s": {k: v[0] for k, v in stats.items()}, "spread": {k: v[1] for k, v in stats.items()},
        "speedup_over_eager": {k: eager / v[0] for k, v in stats.items()},
        "timings": {k: envelope.timing(t) for k, t in timings.items()},
        "verdicts": {k: compare(timings["searched"], t) for k, t in timings.items() if k != "searched"},
        "trials": [[t.index, t.time_s, t.status, t.block] for t in sorted(res.trials, key=lambda t: t.index)],
        "final_contenders": [(c["label"], c["time_s"]) for c in res.compared], **measuring_share(res, budget),
    }
    row["roofline_ratio"] = stats["searched"][0] / res.estimate_s if res.estimate_s > 0 else math.nan
    row["searched_over_direct"] = stats["direct"][0] / stats["searched"][0]
    row["searched_over_greedy"] = stats["greedy"][0] / stats["searched"][0]
    row["searched_over_compile"] = stats["torch.compile"][0] / stats["searched"][0]
    if MAX_AUTOTUNE in stats:
        row["searched_over_max_autotune"] = stats[MAX_AUTOTUNE][0] / stats["searched"][0]
    return row


def gpt2_compile(budget, seed, device="cpu"):
    import egraft
    from egraft.models import MODELS
    from egraft.rewrites import saturate
    from egraft.search import Budget, search

    spec = MODELS["gpt2_stack"]
    model = spec.build("bench", seed=0)
    args = spec.example_inputs(model, seed=0, size="bench")
    t0 = time.perf_counter()
    g = egraft.trace(model, args)
    t1 = time.perf_counter()
    sat = saturate(g)
    t2 = time.perf_counter()
    res = search(g, budget=Budget(seconds=budget), saturation=sat, seed=seed, cache=False, progress=False,
                 device=device)
    t3 = time.perf_counter()
    return {"trace_s": t1 - t0, "saturate_s": t2 - t1, "search_s": t3 - t2, "total_s": t3 - t0,
            "stages": res.stages, **measuring_share(res, budget), "blocks": res.blocks,
            "speedup_over_direct": res.speedup, "noisy": res.noisy, "counts": res.counts,
            "final_contenders": [(c["label"], c["time_s"]) for c in res.compared]}


def measuring_share(res, budget):
    """Seconds of the search's own measuring (baseline, final check and timing) and their share of `budget`."""
    s = sum(res.stages.get(k, 0.0) for k in ("baseline", "final_check", "final_timing"))
    return {"measuring_s": s, "measuring_share": s / budget if budget else math.nan}


def _ms(s):
    return f"{s * 1e3:.3g}" if math.isfinite(s) else "-"


def table(rows):
    lines = ["| workload | eager ms | torch.compile | direct | greedy | searched | searched / direct | "
             "searched / greedy | searched / compile | search s | trials | GA best / random best | rho | "
             "roofline ratio |", "|" + "---|" * 14]
    for r in rows:
        sp, m = r["speedup_over_eager"], r["median_s"]
        spr = r["spread"]
        lines.append(
            f"| {r['workload']} | {_ms(m['eager'])} ±{spr['eager']:.0%} | {sp['torch.compile']:.2f}x | "
            f"{sp['direct']:.2f}x | {sp['greedy']:.2f}x | {sp['searched']:.2f}x ±{spr['searched']:.0%} | "
            f"{r['searched_over_direct']:.2f} | {r['searched_over_greedy']:.2f} | {r['searched_over_compile']:.2f} | "
            f"{r['search_s']:.1f} | {r['n_trials']} | {r['random_best_s'] / r['ga_best_s']:.2f} | "
            f"{r['rank_correlation']:.2f} | {r['roofline_ratio']:.1f} |")
    geo = {k: math.exp(sum(math.log(r[k]) for r in rows) / len(rows))
           for k in ("searched_over_direct", "searched_over_greedy", "searched_over_compile")}
    lines.append(f"\ngeometric means: searched/direct {geo['searched_over_direct']:.2f}x, searched/greedy "
                 f"{geo['searched_over_greedy']:.2f}x, searched/torch.compile {geo['searched_over_compile']:.2f}x")
    if all("searched_over_max_autotune" in r for r in rows):
        g = math.exp(sum(math.log(r["searched_over_max_autotune"]) for r in rows) / len(rows))
        lines.append(f"searched/torch.compile max-autotune {g:.2f}x (geometric mean)")
    return "\n".join(lines)


def _cuda_problem() -> str | None:
    """Why `--device cuda` cannot run here (None: it can); torch is imported to ask."""
    from egraft.measure import available

    if not available("cuda"):
        return ("--device cuda: no CUDA device is visible to torch (torch.cuda.is_available() is False); "
                "run on a machine with an NVIDIA GPU, or use --device cpu")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return ("--device cuda: TRITON_INTERPRET=1 is set, so Triton would run its kernels in its interpreter "
                "instead of on the GPU; unset TRITON_INTERPRET")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--size", choices=["mid", "bench"], default="mid")
    ap.add_argument("--budget", type=float, default=None, help="search seconds per workload (default 40; --quick: 8)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of the final comparison (default 9; --quick: 3)")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help=f"workloads (default all; --quick: {' '.join(QUICK_WORKLOADS)})")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--quick", action="store_true", help="small settings: a check that the benchmark works")
    ap.add_argument("--gpt2-compile", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    envelope.fill(a, quick={"budget": 8.0, "rounds": 3, "only": QUICK_WORKLOADS},
                  full={"budget": 40.0, "rounds": 9, "only": WORKLOADS})
    _set_threads(a.threads)
    if a.device == "cuda":
        problem = _cuda_problem()
        if problem:
            print(f"search.py: {problem}", file=sys.stderr)
            sys.exit(2)
    import torch

    torch.set_num_threads(a.threads)
    if a.device == "cuda":  # fp32 matmuls in fp32 everywhere: the variants are checked against eager
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    import jax

    workloads = a.only or WORKLOADS
    info = {"date": time.strftime("%Y-%m-%d"), "threads": a.threads, "size": a.size, "budget_s": a.budget,
            "device": a.device, "cores": sorted(os.sched_getaffinity(0)), "torch": torch.__version__,
            "jax": jax.__version__}
    print(json.dumps(info), flush=True)
    rows = []
    for name in workloads:
        row = run_one(name, a.size, a.budget, a.rounds, a.calls, a.seed, a.device)
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    out = envelope.envelope("search", "search.py", sys.argv[1:], quick=a.quick, device=a.device, threads=a.threads)
    out["settings"] = {"size": a.size, "budget_s": a.budget, "rounds": a.rounds, "calls": a.calls, "seed": a.seed,
                       "workloads": workloads, "gpt2_compile": a.gpt2_compile}
    out["rows"] = rows
    if a.gpt2_compile:
        out["gpt2_12_layers"] = gpt2_compile(a.budget, a.seed, a.device)
        print(json.dumps(out["gpt2_12_layers"], default=str), flush=True)
    if rows:
        print(table(rows))
    if a.out:
        envelope.write(a.out, out)


if __name__ == "__main__":
    main()
