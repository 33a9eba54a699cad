"""Compile time of ``egraft.compile``, phase by phase, against the depth of a GPT-2-style stack.

For each depth L (default 1, 2, 4, 8, 12, 24 layers of ``egraft.models``'
``gpt2_stack``: hidden 768, 12 heads, batch 1, sequence 128, float32 hidden
states in) one compile runs in a fresh Python process with its own empty
``EGRAFT_CACHE_DIR`` (the search cache, the XLA cache of the compile
workers and the Triton kernels live there) and ``cache=False``, so nothing
is served from an earlier compile.  The process fixes its threads first
(``egraft.measure.fix_threads``, default one thread on one core), imports
torch, JAX and egraft's backends, builds the model, and only then times

    egraft.compile(model, example_inputs=x, budget=--budget, cache=False, progress=False)

(device "cpu", backend "auto", validation on).  The search gets the same
time budget at every depth, so its share stays comparable; it may overrun
the budget (its final comparison lowers and checks whole programs).

The phases are the pipeline's own timers, read from the compiled
program's ``stages`` (``CompiledModel.programs[...].stages``, the numbers
the report prints as "stages"); none is re-implemented here:

* ``trace``: torch.export, the core-ATen decomposition and the lowering to
  egraft's IR (``egraft.api.pipeline.build``);
* ``saturate``: equality saturation (timed by the search engine,
  ``SearchResult.stages["saturate"]``);
* ``search``: the rest of ``egraft.search.search``: the reference outputs,
  the direct lowering (baseline), the genetic search and the final
  comparison, which lowers, validates and times the contenders; the winner's
  executable is built here (``egraft.search.pipeline.compile_signature``);
* ``lower``: the pipeline taking the winner's executable from the search
  result (it lowers only a cache hit, so with the cache off it is ~0);
* ``validate``: the one check of the winner against eager PyTorch on the
  example inputs and a fresh random set;
* ``other``: what ``egraft.compile`` spends outside those timers (option
  parsing, input checks, drawing the fresh check inputs, the traced
  program's statistics, the call fast path): the measured total less the
  phases above.  This one is not a pipeline timer: it is the remainder of
  the wall time measured around the public call.

``total_s`` is the wall time of the ``egraft.compile`` call; the phases sum
to it.  ``total_cpu_s`` is the CPU time this process spent in that call:
well below the wall time, the core was shared with something else and the
row is not to be trusted.  Each row also carries the search engine's own split of its time
(``search_stages``: reference, baseline, search, final_check,
final_timing), and ``winner_lower_s``: the winner's program lowered again
from scratch with its backend and knobs, plus one call, after the compile
(timed around ``egraft.backends.lower``; not part of ``total_s``): what the
winner's own compile costs at this depth, which the pipeline never pays
separately.  Each process pays the same start-up costs inside the compile
(the first torch.export, XLA's first compile): they are part of a real
first compile and show up as the linear fit's intercept.

With ``--reps N`` each depth is compiled N times, each in its own process;
the row is the rep with the median total (so its phases still sum to its
total) and ``reps`` lists every rep.

Fits, per phase, for the total and for ``winner_lower_s``: least squares of
``t = a + b*L`` (R^2 of t) and of ``log t = log c + k log L`` (R^2 of log t;
no power law when some time is 0).  Prints a Markdown table and the fits;
``--out`` writes strict JSON (the envelope, ``model``, ``compile``,
``rows``, ``fits``).

    python3 bench/compile_depth.py [--layers 1 2 4 8 12 24] [--hidden 768] [--heads 12] [--seq 128]
                                   [--budget 10] [--threads 1] [--reps 1] [--quick] [--out FILE]

``--quick``: layers 1 2 4 8, hidden 256, 4 heads, sequence 64, budget 4 s
(a couple of minutes on one core); flags given explicitly win over it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # this checkout's egraft, in this process and (through PYTHONPATH) the compiles'
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envelope  # noqa: E402
FULL = {"layers": [1, 2, 4, 8, 12, 24], "hidden": 768, "heads": 12, "seq": 128, "budget": 10.0}
QUICK = {"layers": [1, 2, 4, 8], "hidden": 256, "heads": 4, "seq": 64, "budget": 4.0}
BATCH = 1
PIPELINE = ("trace", "saturate", "search", "lower", "validate")  # egraft.api.report.STAGES, in its order
PHASES = PIPELINE + ("other",)
REP_KEYS = ("phases", "total_s", "total_cpu_s", "search_stages", "winner_lower_s", "process_s")  # a rep's record
CHILD_TIMEOUT_S = 3 * 3600  # one compile; a 24-layer GPT-2-small compile takes minutes on one core


# --- the fit ----------------------------------------------------------------------------------------

def _r2(y: np.ndarray, fitted: np.ndarray) -> float:
    ss_res = float(np.sum((y - fitted) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def fit_growth(layers, seconds) -> dict:
    """Least-squares growth of `seconds` with `layers`: linear ``t = a + b*L`` and power ``t = c * L**k``.

    Returns ``{"linear": {"a", "b", "r2"}, "power": {"c", "k", "r2"}}``; the
    power law is fitted (and its R^2 taken) on ``log t`` against ``log L``.
    When some time is not positive there is no power law: its three values
    are None and ``note`` says why.  Needs at least two distinct depths.
    """
    L = np.asarray(layers, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if L.shape != t.shape or L.ndim != 1:
        raise ValueError(f"layers and seconds must be two lists of one length, got {L.shape} and {t.shape}")
    if len(np.unique(L)) < 2:
        raise ValueError(f"a growth needs at least two distinct depths, got {sorted(set(L.tolist()))}")
    if np.any(L <= 0) or not np.all(np.isfinite(t)):
        raise ValueError(f"depths must be positive and times finite, got layers {L.tolist()}, seconds {t.tolist()}")
    A = np.stack([np.ones_like(L), L], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
    out = {"linear": {"a": float(a), "b": float(b), "r2": _r2(t, A @ np.array([a, b]))}}
    if np.any(t <= 0):
        out["power"] = {"c": None, "k": None, "r2": None,
                        "note": "a time of 0 s at some depth: no power law"}
        return out
    P = np.stack([np.ones_like(L), np.log(L)], axis=1)
    y = np.log(t)
    (logc, k), *_ = np.linalg.lstsq(P, y, rcond=None)
    out["power"] = {"c": float(math.exp(logc)), "k": float(k), "r2": _r2(y, P @ np.array([logc, k]))}
    return out


# --- one compile (in its own process) ---------------------------------------------------------------

def compile_once(layers: int, hidden: int, heads: int, seq: int, budget: float, threads: int) -> dict:
    """One compile of the `layers`-deep stack in this process, timed (see the module docstring).

    Call it in a fresh process: threads are fixed here, before torch or JAX start.
    """
    from egraft.measure import fix_threads

    cores = fix_threads(threads)
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    import egraft
    from egraft.backends import candidates, lower
    from egraft.models import MODELS

    backends = candidates("auto", "cpu")  # imports the CPU backends (JAX, torch) before the clock starts
    spec = MODELS["gpt2_stack"]
    model = spec.factory(n_layers=layers, hidden=hidden, heads=heads, seed=0)
    x = spec.example_inputs(model, batch=BATCH, seq=seq, seed=0)
    t0, c0 = time.perf_counter(), time.process_time()
    cm = egraft.compile(model, example_inputs=x, budget=budget, cache=False, progress=False)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    (prog,) = cm.programs.values()
    stages = dict(prog.stages)
    unknown = sorted(set(stages) - set(PIPELINE))
    if unknown:
        raise RuntimeError(f"the pipeline timed stage(s) {unknown} this benchmark does not know; add them to "
                           "PIPELINE in bench/compile_depth.py")
    phases = {k: float(stages.get(k, 0.0)) for k in PIPELINE}
    phases["other"] = max(0.0, total - sum(phases.values()))  # stages are rounded to 0.1 ms
    res = prog.result
    t1 = time.perf_counter()
    again = lower(res.graph, res.backend, "cpu", dict(res.knobs))
    with torch.no_grad():
        again(*x)
    relower = time.perf_counter() - t1
    return {"layers": layers, "ir_nodes": int(prog.traced["nodes"]),
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "phases": phases, "total_s": total, "total_cpu_s": cpu,
            "search_stages": {k: float(v) for k, v in res.stages.items() if k != "saturate"},
            "winner_lower_s": relower,
            "winner": {"backend": res.backend, "knobs": dict(res.knobs), "nodes": len(res.graph.nodes)},
            "egraph": {k: res.saturation.get(k) for k in ("classes", "nodes", "iterations", "stop_reason")},
            "backends": list(backends), "cores": list(cores)}


def run_fresh(layers: int, a, threads: int) -> dict:
    """:func:`compile_once` in a fresh process with an empty cache directory; its record."""
    with tempfile.TemporaryDirectory(prefix="egraft-depth-") as tmp:
        out = os.path.join(tmp, "row.json")
        env = {**os.environ, "EGRAFT_CACHE_DIR": os.path.join(tmp, "cache"),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor"),
               "PYTHONPATH": os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
        cmd = [sys.executable, os.path.abspath(__file__), "--worker-out", out, "--layers", str(layers),
               "--hidden", str(a.hidden), "--heads", str(a.heads), "--seq", str(a.seq),
               "--budget", str(a.budget), "--threads", str(threads)]
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"the compile of the {layers}-layer stack ran over {CHILD_TIMEOUT_S} s; "
                             "try a smaller --budget or fewer --layers") from None
        if p.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"the compile of the {layers}-layer stack failed (exit status {p.returncode}):\n"
                             + (p.stderr or p.stdout)[-4000:])
        with open(out) as f:
            row = json.load(f)
    row["process_s"] = time.perf_counter() - t
    return row


# --- the report -------------------------------------------------------------------------------------

def _median_rep(reps: list[dict]) -> dict:
    """The rep whose total is the median (the lower middle one for an even count)."""
    order = sorted(range(len(reps)), key=lambda i: reps[i]["total_s"])
    return reps[order[(len(reps) - 1) // 2]]


def fits_of(rows: list[dict]) -> dict:
    layers = [r["layers"] for r in rows]
    series = {k: [r["phases"][k] for r in rows] for k in PHASES}
    series["total"] = [r["total_s"] for r in rows]
    series["winner_lower"] = [r["winner_lower_s"] for r in rows]
    return {k: fit_growth(layers, v) for k, v in series.items()}


def _num(x, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def markdown(doc: dict) -> str:
    m, c, rows, fits = doc["model"], doc["compile"], doc["rows"], doc["fits"]
    lines = [f"Compile time by phase against depth: {m['name']} (hidden {m['hidden']}, {m['heads']} heads, "
             f"batch {m['batch']}, sequence {m['seq']}); egraft.compile on {doc['device']}, backend auto, "
             f"search budget {c['budget_s']:g} s, {doc['threads']} thread(s) on core(s) "
             f"{','.join(map(str, doc['cores'])) or 'any'}, cache off, a fresh process per compile "
             f"({doc['date']}).", "",
             "| layers | IR nodes | parameters | " + " | ".join(f"{k} s" for k in PHASES)
             + " | total s | CPU s | winner re-lowered s |",
             "|" + "---:|" * (len(PHASES) + 6)]
    for r in rows:
        lines.append(f"| {r['layers']} | {r['ir_nodes']} | {r['parameters'] / 1e6:.2f}M | "
                     + " | ".join(f"{r['phases'][k]:.2f}" for k in PHASES)
                     + f" | {r['total_s']:.2f} | {r['total_cpu_s']:.2f} | {r['winner_lower_s']:.2f} |")
    lines += ["", "| phase | linear a (s) | linear b (s/layer) | linear R^2 | power c (s) | power k | power R^2 |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for k, f in fits.items():
        li, po = f["linear"], f["power"]
        lines.append(f"| {k} | {li['a']:.3f} | {li['b']:.4f} | {li['r2']:.3f} | {_num(po['c'], '.3f')} | "
                     f"{_num(po['k'], '.2f')} | {_num(po['r2'], '.3f')} |")
    t = fits["total"]
    if t["power"]["k"] is not None:
        lines += ["", f"total grows as L^{t['power']['k']:.2f} (R^2 {t['power']['r2']:.3f} on log t); linear: "
                      f"{t['linear']['a']:.2f} s + {t['linear']['b']:.3f} s per layer "
                      f"(R^2 {t['linear']['r2']:.3f})."]
    return "\n".join(lines)


# --- the command line -------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="depths (default 1 2 4 8 12 24)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size (default 768)")
    ap.add_argument("--heads", type=int, default=None, help="attention heads (default 12)")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default 128)")
    ap.add_argument("--budget", type=float, default=None, help="search budget per compile, seconds (default 10)")
    ap.add_argument("--threads", type=int, default=1, help="threads (and cores) per compile")
    ap.add_argument("--reps", type=int, default=1, help="compiles per depth, each in a fresh process")
    ap.add_argument("--quick", action="store_true", help="layers 1 2 4 8, hidden 256, 4 heads, seq 64, budget 4")
    ap.add_argument("--out", default=None, help="write the strict-JSON record here")
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)  # one compile, in this process
    a = ap.parse_args(argv)
    base = QUICK if a.quick else FULL
    for k, v in base.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.worker_out is None and len(set(a.layers)) < 2:
        ap.error(f"--layers needs at least two distinct depths to fit a growth, got {a.layers}")
    bad = [f"--{k} {getattr(a, k)}" for k in ("hidden", "heads", "seq", "threads", "reps") if getattr(a, k) < 1]
    bad += [f"--layers {n}" for n in a.layers if n < 1] + ([f"--budget {a.budget}"] if a.budget <= 0 else [])
    if bad:
        ap.error(f"{', '.join(bad)}: must be positive")
    if a.hidden % a.heads:
        ap.error(f"--heads {a.heads} must divide --hidden {a.hidden}")
    return a


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    if a.worker_out is not None:
        (layers,) = a.layers
        row = compile_once(layers, a.hidden, a.heads, a.seq, a.budget, a.threads)
        with open(a.worker_out, "w") as f:
            json.dump(row, f, allow_nan=False)
        return 0
    from egraft.measure import fix_threads  # (no torch or JAX in this process: the compiles run in children)

    cores = fix_threads(a.threads)  # the children inherit the cores and the thread settings
    rows = []
    for n in sorted(set(a.layers)):
        reps = []
        for k in range(a.reps):
            r = run_fresh(n, a, a.threads)
            reps.append(r)
            ph = ", ".join(f"{p} {r['phases'][p]:.2f}" for p in PHASES)
            rep = f" rep {k + 1}/{a.reps}" if a.reps > 1 else ""
            print(f"compile_depth: L={n}{rep}: total {r['total_s']:.2f} s, {r['total_cpu_s']:.2f} s CPU ({ph}); "
                  f"{r['ir_nodes']} IR nodes; winner {r['winner']['backend']}; process {r['process_s']:.1f} s",
                  file=sys.stderr, flush=True)
        row = dict(_median_rep(reps))
        row.pop("cores", None)
        if a.reps > 1:
            row["reps"] = [{k: r[k] for k in REP_KEYS} for r in reps]
        rows.append(row)
    backends = rows[0].pop("backends")
    for r in rows[1:]:
        r.pop("backends")
    doc = {**envelope.envelope("compile_depth", "compile_depth.py", argv, quick=a.quick, device="cpu",
                               threads=a.threads),
           "model": {"name": "gpt2_stack", "layers": [r["layers"] for r in rows], "hidden": a.hidden,
                     "heads": a.heads, "head_dim": a.hidden // a.heads, "mlp_ratio": 4, "batch": BATCH,
                     "seq": a.seq, "input": f"float32 hidden states [{BATCH}, {a.seq}, {a.hidden}]",
                     "description": "N GPT-2 pre-LN blocks (fused c_attn, causal SDPA, tanh-GELU MLP) "
                                    "+ final LayerNorm, egraft.models.gpt2_stack, seed 0"},
           "compile": {"call": "egraft.compile(model, example_inputs=x, budget=B, cache=False, progress=False)",
                       "device": "cpu", "backend": "auto", "candidates": backends, "budget_s": a.budget,
                       "cache": False, "validate": True, "reps": a.reps,
                       "process": "a fresh Python process per compile, with its own empty EGRAFT_CACHE_DIR",
                       "phases": list(PHASES)},
           "rows": rows, "fits": fits_of(rows)}
    text = markdown(doc)
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1, allow_nan=False)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
