"""Every benchmark under one protocol, one command: ``python -m bench`` (``make results``, ``make results-quick``).

Runs each benchmark of bench/ in a process of its own (each pins itself
before torch and jax start: ``egraft.measure.fix_threads``, 1 thread on one
core or 2 on both; interleaves the variants it compares; reports medians
with their spread; and decides "faster" only through
``egraft.measure.compare``, the project's one conclusion rule), keeps each
one's raw JSON under ``docs/results/raw/``, measures the machine (read
bandwidth and peak FLOP/s on the cores used), and writes the page:
``docs/results.md``, ``docs/results.json`` and the plots under
``docs/results/``, and the headline block of the README.

* ``python -m bench``: the full run (1-2 hours on a 2-core machine, by hand);
* ``python -m bench --quick``: small settings, under 10 minutes;
* ``python -m bench --only search-1t generate``: those steps only; the
  other sections keep their last raw results, each section says its date;
* ``python -m bench --page-only``: rebuild the page from the raw results;
* ``python -m bench --device cuda``: the Triton backend against eager,
  Inductor and Inductor max-autotune on the GPU (stops with a clear
  message where no GPU is visible).

A step that fails is named on the page and makes the exit status 1; the
rest of the page is still written.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import machine  # noqa: E402


@dataclass(frozen=True)
class Step:
    """One benchmark run: its raw file's name, the script and its arguments, and what it measures."""

    name: str
    script: str
    args: tuple[str, ...]
    what: str
    minutes: float  # about how long it takes here, for the progress line
    threads: int = 1

    def command(self, out: str) -> list[str]:
        return [sys.executable, os.path.join(HERE, self.script), *self.args, "--out", out]

    def shown(self) -> str:
        return shlex.join(["python3", f"bench/{self.script}", *self.args])


# bench/*.py that are not steps: the suite's own parts and the benchmarks' helpers, and those run by hand
PARTS = {"__init__.py", "__main__.py", "suite.py", "machine.py", "ingest.py", "page.py", "page_sizes.py", "plots.py",
         "envelope.py", "generate_worker.py", "generate_models.py", "real_models.py"}
BY_HAND = {
    "cpu_backends.py": "the direct JAX lowering against eager and Inductor, which the search step measures as its "
                       "'direct' variant; kept for its per-library diagnostics (--settle, egraft(torch) vs (jax))",
    "gpu_check.py": "the Triton backend's tests on a GPU, then timings; a correctness check first, run where a GPU is",
    "gpu_generate.py": "a real-size model compiled for a GPU: compile stages, tokens against transformers, decode "
                       "against HF eager, save and load; run where a GPU is (bench/gpu_all.sh runs it with the above)",
    "real_size.py": "models at deployed sizes (135 M, 494 M; fp32 and bf16): compile time and peak memory, artifact "
                    "size, load time and memory, decode against HF eager; about an hour, its JSON read by hand",
    "quant_modes.py": "egraft's quantisation modes (int8, int4, w8a8) at a deployed size, each compiled apart and "
                      "all timed in one process, interleaved: about 10 minutes, its JSON read by hand",
    "prefill_plan.py": "a prompt's chunks planned for the least cost against the exact ladder, on a saved generation at a deployed size (minutes a run; compiles the model first where no artifact is given)",
    "step_profile.py": "where a decode step's time goes: its XLA operations by kind from JAX's profiler (the "
                       "generated products, attention, cache copies), one process; shares, not speed-ups",
    "peers.py": "real_models.py's models against llama.cpp (its own venv: make llamacpp-venv) and HF eager, one core "
                "and two, in one process per thread count; about an hour, its JSON read by hand",
    "gpu_artifacts.py": "each backend's program compiled for a GPU, saved, and loaded by a fresh process there; run "
                        "where a GPU is",
    "gpu_dispatch.py": "what a compiled JAX call costs apart from its work (arguments, kernel launches); run where a "
                       "GPU is",
    "rows_layout_kernels.py": "the generated CPU product reading a weight where it is stored against its column "
                              "panels, per product of the 494 M model (minutes), its table read by hand",
}


def _generate_args(quick: bool, vllm_venv: str | None) -> tuple[str, ...]:
    venv = ("--vllm-venv", vllm_venv) if vllm_venv else ()
    if quick:  # vLLM's engine start alone is minutes here: the quick mode leaves it to the full run
        return ("--quick", "--systems", "hf_eager", "hf_static_inductor", "egraft_compile", *venv)
    return venv


def plan(quick: bool, device: str, vllm_venv: str | None = None) -> list[Step]:
    """The steps of one run, in order."""
    q = ("--quick",) if quick else ()
    if device == "cuda":
        return [
            Step("trace", "trace_time.py", (*q, "--threads", "1"), "egraft.trace of a 12-layer GPT-2 stack", 0.5),
            Step("saturation", "saturation.py", q or ("--reps", "3"), "saturation time against depth", 1),
            Step("search-cuda", "search.py", (*q, "--device", "cuda", "--threads", "1"),
                 "the search (Triton) against eager, Inductor and Inductor max-autotune on the GPU", 4 if quick else 12),
        ]
    steps = [
        Step("trace", "trace_time.py", (*q, "--threads", "1"), "egraft.trace of a 12-layer GPT-2 stack", 0.5),
        Step("saturation", "saturation.py", q or ("--reps", "3"), "saturation time and e-graph size against depth",
             0.5 if quick else 2),
        Step("compile_depth", "compile_depth.py", q, "compile time by phase against depth (1 to 24 layers)",
             2.5 if quick else 8),
        Step("search-1t", "search.py", q + ("--threads", "1") + (() if quick else ("--budget", "40", "--gpt2-compile")),
             "the search against direct, greedy, eager and Inductor, one core", 2 if quick else 9),
    ]
    if not quick:
        steps.append(Step("search-2t", "search.py", ("--threads", "2", "--budget", "40"),
                          "the search against direct, greedy, eager and Inductor, both cores", 8, threads=2))
    steps += [
        Step("call_overhead", "call_overhead.py", q or ("--repeats", "100", "--calls", "200"),
             "per-call overhead against bare jax.jit and torch eager", 0.5 if quick else 2),
        Step("generate", "generate.py", _generate_args(quick, vllm_venv),
             "greedy generation against HF eager, HF static + Inductor and vLLM", 3 if quick else 60,
             threads=1 if quick else 2),
    ]
    return steps


def no_gpu_message() -> str | None:
    """Why ``--device cuda`` cannot run here, or None when a CUDA device is visible to torch."""
    try:
        import torch
    except ImportError:
        return "results on cuda need torch with CUDA; torch is not installed"
    if torch.cuda.is_available():
        return None
    return ("`make results DEVICE=cuda` needs an NVIDIA GPU visible to torch, and torch.cuda.is_available() is "
            f"False here (torch {torch.__version__}). Run it on a machine with a GPU and a CUDA build of torch, "
            "or run `make results` for this CPU.")


def _run(step: Step, raw_dir: str, log_dir: str) -> dict:
    """Run one step; its raw JSON, or a record of why there is none."""
    out = os.path.join(raw_dir, f"{step.name}.json")
    log = os.path.join(log_dir, f"{step.name}.log")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    tmp = os.path.join(log_dir, f"{step.name}.json")  # moved in when complete; a benchmark's own logs stay there
    with open(log, "w") as f:
        p = subprocess.run(step.command(tmp), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    try:
        with open(tmp) as f:
            res = json.load(f)
        shutil.move(tmp, out)
    except (OSError, ValueError):
        with open(log) as f:
            tail = [ln for ln in f.read().strip().splitlines() if ln.strip()][-1:] or ["no output"]
        res = {"bench": step.name, "status": f"failed: exit status {p.returncode}: {tail[0][:300]}",
               "command": step.shown(), "date": time.strftime("%Y-%m-%d")}
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    if p.returncode != 0 and "status" not in res:
        res["status"] = f"failed: exit status {p.returncode} (see {log})"
    res["suite"] = {"step": step.name, "wall_s": wall, "what": step.what, "command": step.shown()}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return res


def read_raw(raw_dir: str) -> dict[str, dict]:
    """Every raw result under `raw_dir`, by step name."""
    out = {}
    if os.path.isdir(raw_dir):
        for fn in sorted(os.listdir(raw_dir)):
            if fn.endswith(".json"):
                with open(os.path.join(raw_dir, fn)) as f:
                    out[fn[:-5]] = json.load(f)
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small settings, under 10 minutes")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--only", nargs="+", default=None, metavar="STEP", help="run these steps only")
    ap.add_argument("--page-only", action="store_true", help="rebuild the page from the raw results, run nothing")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs"),
                    help="where results.md, results.json and results/ go (default: %(default)s)")
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"),
                    help="the README whose headline block is rewritten ('' for none)")
    ap.add_argument("--vllm-venv", default=None, help="vLLM's virtual environment for the generation benchmark")
    ap.add_argument("--list", action="store_true", help="print the steps and their commands, run nothing")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    steps = plan(a.quick, a.device, a.vllm_venv)
    names = [s.name for s in steps]
    if a.only:
        unknown = [n for n in a.only if n not in names]
        if unknown:
            print(f"python -m bench: unknown step(s) {unknown}; the steps of this mode are {names}", file=sys.stderr)
            return 2
        steps = [s for s in steps if s.name in a.only]
    if a.list:
        for s in steps:
            print(f"{s.name:14s} {s.shown()}    # {s.what}, about {s.minutes:g} min")
        return 0
    if a.device == "cuda" and not a.page_only:
        why = no_gpu_message()
        if why:
            print(f"python -m bench --device cuda: {why}", file=sys.stderr)
            return 2
    raw_dir = os.path.join(a.out_dir, "results", "raw")
    os.makedirs(raw_dir, exist_ok=True)
    failed = []
    command = "python -m bench" + (" " + shlex.join(argv) if argv else "")
    if not a.page_only:
        log_dir = tempfile.mkdtemp(prefix="egraft-results-logs-")
        threads = sorted({s.threads for s in steps} | {1})
        print(f"measuring the machine (read bandwidth, peak FLOP/s on {threads} thread(s)) ...", file=sys.stderr,
              flush=True)
        desc = machine.describe(threads, a.device)
        desc["command"], desc["mode"], desc["device"] = command, "quick" if a.quick else "full", a.device
        with open(os.path.join(raw_dir, "machine.json"), "w") as f:
            json.dump(desc, f, indent=1)
        total = sum(s.minutes for s in steps)
        print(f"{len(steps)} step(s), about {total:g} min; logs in {log_dir}", file=sys.stderr, flush=True)
        for i, s in enumerate(steps, 1):
            print(f"[{i}/{len(steps)}] {s.name}: {s.what} (about {s.minutes:g} min)\n    $ {s.shown()}",
                  file=sys.stderr, flush=True)
            res = _run(s, raw_dir, log_dir)
            state = res.get("status", "ok")
            if state != "ok":
                failed.append(s.name)
            print(f"    {state} in {res['suite']['wall_s']:.0f} s", file=sys.stderr, flush=True)
    import page

    raw = read_raw(raw_dir)
    if "machine" not in raw:
        print(f"python -m bench: no machine description in {raw_dir}: run without --page-only first",
              file=sys.stderr)
        return 2
    paths = page.write(raw, a.out_dir, a.readme or None)
    for p in paths:
        print(f"wrote {os.path.relpath(p, ROOT) if p.startswith(ROOT) else p}", file=sys.stderr)
    failed += [n for n, r in raw.items() if n != "machine" and r.get("status", "ok") != "ok" and n not in failed
               and (not a.only or n in a.only)]
    if failed:
        print(f"python -m bench: step(s) failed: {', '.join(failed)} (named on the page)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
