"""Greedy generation on this CPU: HF eager, HF static cache + Inductor, vLLM, and egraft two ways.

For each model (a Llama-style 4 layers x 512, intermediate 1408, 8 heads /
4 KV heads, vocab 8192; a GPT-2-small-sized 12 x 768, vocab 50257; both
float32 with random weights from a fixed seed, no EOS) and each system:

* ``hf_eager``: ``model.generate`` with transformers' DynamicCache (the reference);
* ``hf_static_inductor``: ``model.forward = torch.compile(model.forward)``,
  ``generate(..., cache_implementation="static", max_cache_len=MAX_LENGTH)``;
* ``vllm``: vLLM's CPU build from its own virtual environment (``--vllm-venv``,
  ``$EGRAFT_VLLM_VENV``, else /work/vllmenv or .venv-vllm), weights saved by
  this script, prefix caching off, ``ignore_eos``;
* ``egraft_dynamo``: ``torch.compile(model.forward, backend="egraft")`` + the static cache;
* ``egraft_compile``: ``egraft.compile(model, device="cpu", max_batch=4,
  max_length=640).generate(input_ids, attention_mask, max_new_tokens=64, do_sample=False)``.

Each system runs in its own process per thread count (bench/generate_worker.py),
pinned before torch starts (``egraft.measure.fix_threads``: 1 thread on one
core, 2 on both), so its peak RSS (``VmHWM``) is its own.  Per (batch,
prompt length) in 1, 4 x 16, 128, 512: the first call's time (the first
config's is the model's compile; each later one adds a bucket), then
``--rounds`` rounds with the configs' order rotating, each timing
``generate(max_new_tokens=1)`` (the prefill) and ``generate(64)``; decode
tokens/s = batch x 63 / (the round's difference).  Medians over rounds and
their spread (p10-p90 or IQR over the median, ``egraft.measure.summarize``).
Every system's tokens are compared with HF eager's at the same thread count;
mismatches are reported with the first position that differs.  Each worker
starts with empty compile caches (Inductor's, egraft's search cache,
vLLM's AOT cache, Triton's: a fresh directory each), so first calls are
cold compiles.  vLLM: float32, ``max_num_seqs`` 4, a batch's prompts in one
step (``max_num_batched_tokens`` = 4 x 640), ``VLLM_CPU_KVCACHE_SPACE=1``
(GiB, preallocated: part of its peak RSS), threads bound to the pinned
cores (``VLLM_CPU_OMP_THREADS_BIND``), the engine in the worker's process.
A warning egraft raises (``EgraftFallbackWarning``: a graph ran in PyTorch)
is counted in the row and named in the table.

The decode bound: the bytes a step must read (bench/generate_models.py: the
weights except unused embedding rows, and the KV cache up to the current
length) over this machine's read bandwidth, measured here (the faster of numpy
sums and BLAS matrix-vector products over a 256 MiB array on the same
pinned cores, median of --bw-repeats: bench/generate_worker.py).

    python3 bench/generate.py [--threads 1 2] [--systems ...] [--models ...] [--rounds 5] [--out FILE]
    python3 bench/generate.py --quick        # tiny Llama, prompt 16, batch 1, 8 tokens, one core
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from generate_models import FULL_MODELS, MODELS, decode_bound, parameter_counts  # noqa: E402
from generate_worker import SYSTEMS  # noqa: E402
from machine import git_commit, host, host_line  # noqa: E402

REFERENCE = "hf_eager"
# every worker compiles with empty caches (a fresh directory each), so first calls are cold compiles:
# Inductor's FX graph / AOTAutograd caches, egraft's search cache, vLLM's AOT compile cache, Triton's
COLD_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "EGRAFT_CACHE_DIR": "egraft", "VLLM_CACHE_ROOT": "vllm",
               "TRITON_CACHE_DIR": "triton"}
LABELS = {"hf_eager": "HF eager (dynamic cache)", "hf_static_inductor": "HF static cache + Inductor",
          "vllm": "vLLM (CPU)", "egraft_dynamo": "egraft via torch.compile + static cache",
          "egraft_compile": "egraft.compile(...).generate"}


def default_venv() -> str:
    env = os.environ.get("EGRAFT_VLLM_VENV")
    if env:
        return env
    return "/work/vllmenv" if os.path.isdir("/work/vllmenv") else os.path.join(ROOT, ".venv-vllm")


def _worker(args: list[str], python: str, timeout: float, log) -> dict:
    """Run generate_worker.py with `args`; its JSON result, or a "not run" status naming why there is none."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = f.name
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    cache = tempfile.mkdtemp(prefix="egraft-bench-cache-")
    for var, sub in COLD_CACHES.items():
        env[var] = os.path.join(cache, sub)
    cmd = [python, os.path.join(HERE, "generate_worker.py"), *args, "--result", result]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = e.stdout or "", e.stderr or "", None
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    wall = time.perf_counter() - t0
    if log is not None:
        log.write(f"$ {shlex.join(cmd)}\n{out if isinstance(out, str) else out.decode()}"
                  f"{err if isinstance(err, str) else err.decode()}\n")
        log.flush()
    try:
        with open(result) as f:
            res = json.load(f)
    except (OSError, ValueError):
        err = err if isinstance(err, str) else err.decode()
        last = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        why = f"timed out after {timeout:.0f} s" if rc is None else f"worker exited with {rc}: {last[0][:300]}"
        res = {"status": f"not run: {why}"}
    finally:
        if os.path.exists(result):
            os.unlink(result)
    res["wall_s"] = wall
    return res


def _stats(samples):
    from egraft.measure import summarize

    t = summarize(samples)
    return {"median": t.median, "spread": t.spread, "n": t.n, "samples": list(t.samples)}


def measure_bandwidth(threads: int, repeats: int, log) -> dict:
    r = _worker(["bandwidth", "--threads", str(threads), "--repeats", str(repeats)], sys.executable, 300, log)
    if "seconds" not in r:
        raise SystemExit(f"could not measure the read bandwidth on {threads} cores: {r['status']}")
    gbs = [r["bytes"] / s for s in r["seconds"]]
    return {**r, "bytes_per_s": _stats(gbs)}


def _compare(tokens, ref) -> dict:
    """Do `tokens` equal the reference's, per sequence; the first differing position of each that does not."""
    if ref is None:
        return {"match": None}
    bad = []
    for i, (a, b) in enumerate(zip(tokens, ref)):
        if a != b:
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            bad.append({"sequence": i, "first_difference": k, "got": a[k:k + 4], "want": b[k:k + 4]})
    if len(tokens) != len(ref):
        bad.append({"sequence": None, "first_difference": None, "got": len(tokens), "want": len(ref)})
    return {"match": not bad, "mismatches": bad}


def summarize_row(row: dict, bw: dict, ref: dict | None) -> dict:
    """Medians, spreads, the decode bound and the token check for each config of one run."""
    if row["status"] != "ok":
        return row
    confs = row["configs"]
    ref_tokens = {(c["batch"], c["prompt"]): c["tokens"] for c in (ref or {}).get("configs", [])}
    for i, c in enumerate(confs):
        n = c["new_tokens"]
        steps = [(g - p) / (n - 1) for p, g in zip(c["prefill_s"], c["generate_s"])] if n > 1 else []
        c["prefill"] = _stats(c["prefill_s"])
        c["generate"] = _stats(c["generate_s"])
        if steps and min(steps) > 0:
            c["decode_step"] = _stats(steps)
            c["decode_tokens_per_s"] = _stats([c["batch"] / s for s in steps])
        elif steps:  # the table shows "-": no rate from a round whose noise exceeded its decode time
            c["decode_note"] = "a round's full generation was not slower than its prefill (noise): no decode rate"
        c["first_call_over_steady_s"] = c["first_call_s"] - c["generate"]["median"]
        c["role"] = "model's first call" if i == 0 else "extra bucket"
        bound = decode_bound(row["model"], c["batch"], c["prompt"], n, bw["bytes_per_s"]["median"])
        if "decode_tokens_per_s" in c:
            bound["fraction"] = c["decode_tokens_per_s"]["median"] / bound["tokens_per_s"]
        c["bound"] = bound
        c["check"] = _compare(c["tokens"], ref_tokens.get((c["batch"], c["prompt"])) if ref is not None else None)
        if not c.get("repeats_tokens", True):
            c["check"]["nondeterministic"] = True
    want = parameter_counts(row["model"])["total"]
    if row.get("parameters", want) != want:  # the bound's byte count would be wrong: say so in the row
        row["bound_note"] = f"the model has {row['parameters']} parameters, the bound counts {want}"
    row["first_call_s"] = row.get("setup_s", 0.0) + confs[0]["first_call_s"]
    extra = [c["first_call_over_steady_s"] for c in confs[1:]]
    row["extra_bucket_s"] = {"median": sorted(extra)[len(extra) // 2], "max": max(extra)} if extra else None
    row["peak_rss_bytes"] = row["memory"]["VmHWM"]
    row["tokens_match_reference"] = all(c["check"]["match"] is not False for c in confs)
    return row


# --- the report ---------------------------------------------------------------------------------------------

def _cell_ms(s):
    return f"{s['median'] * 1e3:.3g} ±{s['spread']:.0%}"


def _cell_rate(c):
    if "decode_tokens_per_s" not in c:
        return "-"
    d = c["decode_tokens_per_s"]
    return f"{d['median']:.4g} ±{d['spread']:.0%} ({c['bound']['fraction']:.0%})"


NOISE = ("DeprecationWarning", "FutureWarning")  # library housekeeping: kept in the JSON, left out of the table


def _label(r) -> str:
    fell = sum(w["count"] for w in r.get("warnings", []) if w["category"] == "EgraftFallbackWarning")
    return LABELS[r["system"]] + (f" ({fell} graph(s) ran in PyTorch, see warnings)" if fell else "")


def tables(out: dict) -> str:
    info = out["info"]
    lines = [f"Generation benchmark ({info['date']}, {info['machine']}); {info['versions_line']}.",
             f"Command: `{info['command']}`.",
             "Read bandwidth (the faster of a numpy sum and a BLAS gemv, 256 MiB): " + ", ".join(
                 f"{t} core{'s' if int(t) > 1 else ''} {b['bytes_per_s']['median'] / 1e9:.1f} GB/s "
                 f"±{b['bytes_per_s']['spread']:.0%} ({b.get('reader', 'numpy sum')})" for t, b in out["bandwidth"].items()) + ".", ""]
    cfg = info["config"]
    for model in cfg["models"]:
        pc = parameter_counts(model)
        for threads in cfg["threads"]:
            rows = [r for r in out["runs"] if r["model"] == model and r["threads"] == threads]
            lines.append(f"**{model}** ({pc['total'] / 1e6:.1f}M parameters, float32), {threads} thread"
                         f"{'s' if threads > 1 else ''}, {cfg['new_tokens']} new tokens: prefill ms, decode "
                         "tokens/s (median ±spread, and the share of the bandwidth bound)")
            lines.append("")
            head = ["system", "batch"] + [f"prefill {p}" for p in cfg["prompts"]] + \
                   [f"decode tok/s {p}" for p in cfg["prompts"]] + ["tokens = HF eager"]
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for r in rows:
                if r.get("bound_note"):
                    lines.append(f"| {LABELS[r['system']]} | bound wrong: {r['bound_note']} |" + " |" * (len(head) - 2))
                if r["status"] != "ok":
                    lines.append(f"| {LABELS[r['system']]} | {r['status']} |" + " |" * (len(head) - 2))
                    continue
                for b in cfg["batches"]:
                    cs = {c["prompt"]: c for c in r["configs"] if c["batch"] == b}
                    pre = [_cell_ms(cs[p]["prefill"]) for p in cfg["prompts"]]
                    dec = [_cell_rate(cs[p]) for p in cfg["prompts"]]
                    ok = [cs[p]["check"] for p in cfg["prompts"]]
                    mism = sum(len(c.get("mismatches", [])) for c in ok)
                    tok = ("reference" if r["system"] == REFERENCE else
                           "not checked (no HF eager run)" if any(c["match"] is None for c in ok) else
                           "yes" if all(c["match"] for c in ok) else f"**no**: {mism} sequence(s) differ")
                    if any(c.get("nondeterministic") for c in ok):
                        tok += " (not repeatable)"
                    lines.append(f"| {_label(r)} | {b} | " + " | ".join(pre + dec) + f" | {tok} |")
            lines.append("")
        lines.append(f"**{model}**: first call (setup + first generation, batch {cfg['batches'][0]} prompt "
                     f"{cfg['prompts'][0]}), each extra bucket's first call over its steady time (median / max), "
                     "peak RSS of the system's process")
        lines.append("")
        head = ["system", "threads", "first call s", "extra bucket s", "peak RSS MiB", "warnings"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (r for r in out["runs"] if r["model"] == model):
            if r["status"] != "ok":
                lines.append(f"| {LABELS[r['system']]} | {r['threads']} | {r['status']} | | | |")
                continue
            ex = r["extra_bucket_s"]
            extra = "-" if ex is None else f"{ex['median']:.2f} / {ex['max']:.2f}"
            shown = [w for w in r["warnings"] if w["category"] not in NOISE][:3]
            warn = "; ".join(f"{w['count']}x {w['category']}: {w['message'][:160]}" for w in shown)
            warn = warn.replace("|", "/")
            lines.append(f"| {LABELS[r['system']]} | {r['threads']} | {r['first_call_s']:.2f} | {extra} | "
                         f"{r['peak_rss_bytes'] / 2 ** 20:.0f} | {warn or '-'} |")
        lines.append("")
        lines += [compile_line(r) for r in out["runs"] if r["model"] == model and compile_line(r)]
    return "\n".join(lines)


def compile_line(r: dict) -> str:
    """egraft.compile's programs and their compile seconds against the searched (full decode) step's, or ''."""
    d = r.get("compiled") if r["status"] == "ok" else None
    if not d or "compile_s" not in d:
        return ""
    secs = d["compile_s"]
    searched = sum(secs[name] for name in d.get("searched", ()))
    if not searched:
        return ""
    total = sum(secs.values())
    return (f"{LABELS[r['system']]}, {r['threads']} thread(s): {d['programs']} programs compiled in {total:.0f} s, "
            f"{total / searched:.2f} times the searched decode step's {searched:.0f} s ({d['searches']} search).\n")


# --- the run ------------------------------------------------------------------------------------------------

def _versions_line(runs, commit) -> str:
    ref = next((r["versions"] for r in runs if r.get("versions") and r["system"] != "vllm"), {})
    parts = [f"{k} {ref[k]}" for k in ("torch", "transformers", "numpy", "python") if k in ref]
    vl = next((r["versions"] for r in runs if r["system"] == "vllm" and "vllm" in r.get("versions", {})), None)
    if vl:
        parts.append(f"vLLM {vl['vllm']} (its venv: torch {vl.get('torch', '?')})")
    return ", ".join(parts + [f"egraft {commit}"])


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny Llama, prompt 16, batch 1, 8 new tokens, one core")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=None)
    ap.add_argument("--threads", nargs="+", type=int, default=None)
    ap.add_argument("--prompts", nargs="+", type=int, default=None)
    ap.add_argument("--batches", nargs="+", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--bw-repeats", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per system process")
    ap.add_argument("--vllm-venv", default=default_venv(), help="vLLM's virtual environment (default: %(default)s)")
    ap.add_argument("--out", default=None, help="the JSON file (default: generate-<date>.json in the temporary "
                                                "directory; python -m bench keeps it under docs/results/raw/); "
                                                "the workers' log beside it")
    a = ap.parse_args(argv)
    quick = dict(models=["llama-tiny"], threads=[1], prompts=[16], batches=[1], new_tokens=8, rounds=3, bw_repeats=5)
    full = dict(models=list(FULL_MODELS), threads=[1, 2], prompts=[16, 128, 512], batches=[1, 4], new_tokens=64,
                rounds=5, bw_repeats=15)
    for k, v in (quick if a.quick else full).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.new_tokens < 2:
        ap.error("--new-tokens must be at least 2 (the decode rate is the steps after the first token)")
    a.systems = [REFERENCE] + [s for s in a.systems if s != REFERENCE] if REFERENCE in a.systems else a.systems
    a.max_batch = max(a.batches)
    a.max_length = -(-(max(a.prompts) + a.new_tokens) // 128) * 128  # 512 + 64 -> 640
    date = datetime.date.today().isoformat()
    if a.out is None:
        a.out = os.path.join(tempfile.gettempdir(), f"generate{'-quick' if a.quick else ''}-{date}.json")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    argv = sys.argv[1:] if argv is None else argv
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    log_path = os.path.splitext(a.out)[0] + ".log"
    commit = git_commit()
    cfg = {k: getattr(a, k) for k in ("systems", "models", "threads", "prompts", "batches", "new_tokens", "rounds",
                                      "max_batch", "max_length", "vllm_venv", "quick")}
    info = {"date": datetime.date.today().isoformat(), "machine": host_line(host()), "egraft_commit": commit,
            "command": shlex.join(["python3", "bench/generate.py", *argv]), "config": cfg}
    runs, model_dirs = [], {}
    vllm_python = os.path.join(a.vllm_venv, "bin", "python")
    with open(log_path, "w") as log:
        bw = {str(t): measure_bandwidth(t, a.bw_repeats, log) for t in a.threads}
        for t, b in bw.items():
            print(f"read bandwidth, {t} thread(s): {b['bytes_per_s']['median'] / 1e9:.1f} GB/s "
                  f"±{b['bytes_per_s']['spread']:.0%}", file=sys.stderr, flush=True)
        try:
            for model in a.models:
                for threads in a.threads:
                    ref = None
                    for system in a.systems:
                        row = _run_one(a, system, model, threads, vllm_python, model_dirs, log)
                        row = summarize_row(row, bw[str(threads)], ref if system != REFERENCE else None)
                        if system == REFERENCE and row["status"] == "ok":
                            ref = row
                        runs.append(row)
                        print(f"[{model}, {threads} thread(s)] {system}: {row['status']} ({row['wall_s']:.0f} s)",
                              file=sys.stderr, flush=True)
                        _write(a, info, bw, runs, commit, partial=True)  # an interrupted run keeps what it measured
        finally:
            for d in model_dirs.values():
                shutil.rmtree(d, ignore_errors=True)
    out = _write(a, info, bw, runs, commit, partial=False)
    print(out["table"])
    print(f"results: {a.out}; worker log: {log_path}", file=sys.stderr)
    return 0


def _write(a, info, bw, runs, commit, partial: bool) -> dict:
    """The results so far as JSON at ``a.out`` (``info.partial``: true until every run is in)."""
    info = {**info, "partial": partial, "versions": {r["system"]: r.get("versions", {}) for r in runs},
            "versions_line": _versions_line(runs, commit)}
    out = {"info": info, "bandwidth": bw, "models": {m: {**MODELS[m], **parameter_counts(m)} for m in a.models},
           "runs": runs}
    out["table"] = tables(out)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1, default=str)
    os.replace(tmp, a.out)
    return out


def _run_one(a, system, model, threads, vllm_python, model_dirs, log) -> dict:
    base = {"system": system, "model": model, "threads": threads}
    args = ["run", "--system", system, "--model", model, "--threads", str(threads), "--prompts",
            *map(str, a.prompts), "--batches", *map(str, a.batches), "--new-tokens", str(a.new_tokens),
            "--rounds", str(a.rounds), "--max-length", str(a.max_length), "--max-batch", str(a.max_batch)]
    python = sys.executable
    if system == "vllm":
        if not os.path.exists(vllm_python):
            return {**base, "status": f"not run: no vLLM virtual environment at {a.vllm_venv} ({vllm_python} is "
                                      "missing; pass --vllm-venv or set EGRAFT_VLLM_VENV)", "wall_s": 0.0}
        if model not in model_dirs:
            d = tempfile.mkdtemp(prefix=f"egraft-bench-{model}-")
            saved = _worker(["save", "--model", model, "--model-dir", d], sys.executable, 600, log)
            if "model_dir" not in saved:
                return {**base, "status": f"not run: saving the weights for vLLM failed: {saved['status']}",
                        "wall_s": saved["wall_s"]}
            model_dirs[model] = d
        args += ["--model-dir", model_dirs[model]]
        python = vllm_python
    return {**base, **_worker(args, python, a.timeout, log)}


if __name__ == "__main__":
    sys.exit(main())
