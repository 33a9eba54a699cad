"""Models at the sizes people serve: compile time and memory, artifact size, load time and memory, decode speed.

The models of ``bench/real_models.py`` (random weights at the shapes of a
135 M Llama, a 494 M Qwen2 and a 1.2 B Llama model), in float32 and
bfloat16.  Each model and dtype gets its own empty egraft cache directory
(``EGRAFT_CACHE_DIR``): no search result or compiled program of an earlier
run is reused.  Each model and dtype runs two fresh processes, both pinned
to one core with one thread before torch and jax start
(``egraft.measure.fix_threads``):

1. ``compile``: ``egraft.compile(model, device="cpu", max_batch=<--batch, 1>,
   max_length=256, budget=...)``; its wall time, the process's peak RSS
   (``VmHWM``, set back to the present RSS just before the compile, so that
   building the model does not count) against the weights' bytes, ``describe()`` (per-stage
   seconds, memory and which stage set the peak), then ``save`` and the artifact's size on disk, and
   greedy tokens against transformers' eager ``generate`` on the same model;
2. ``load``: ``egraft.load(dir)`` in a new process: its wall time and the RSS
   it added; a second load in another fresh process (a restarted server);
   and a cold load, in a fresh process with an empty cache directory (a
   machine that never compiled the programs: XLA compiles each one, where the
   first two read back what the compile left in XLA's persistent cache);
   then decode speed, the loaded artifact against HF eager
   (``model.generate``, the same dtype) in the same process, interleaved,
   ``--rounds`` rounds: prompt 16, ``generate(1)`` (prefill) and
   ``generate(1 + new)``; decode tokens/s = new / (the difference).  Medians
   and spreads (``egraft.measure.summarize``), a ratio only where
   ``egraft.measure.compare`` concludes.

    python3 bench/real_size.py [--models llama-135m qwen2-0.5b] [--dtypes float32 bfloat16] [--budget 60s]
                               [--quantize int8|int4|w8a8|torchao-int8|torchao-int4|gptq-int4|awq-int4 [--group-size 64]]
                               [--rounds 5] [--new 32] [--weight-copies no] [--out docs/results/raw/real_size.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench.real_models import MAX_LENGTH, MODELS, model_for, nbytes, prompt, quantize_mode  # noqa: E402

def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def child_compile(a) -> dict:
    import torch

    import egraft
    from egraft.measure.memory import reset_peak

    model = model_for(a)
    weights = sum(nbytes(t) for t in list(model.parameters()) + list(model.buffers()))
    before = _vm("VmRSS")
    reset = reset_peak()  # the peak from here on is the compile's (building the model can peak higher: a cast)
    t0 = time.perf_counter()
    cm = egraft.compile(model, device="cpu", max_batch=getattr(a, "batch", 1), max_length=MAX_LENGTH, budget=a.budget,
                        progress=False,
                        weight_copies=getattr(a, "weight_copies", "no") == "yes", quantize=quantize_mode(a),
                        group_size=getattr(a, "group_size", None) if quantize_mode(a) == "int4" else None)
    compile_s = time.perf_counter() - t0
    peak = _vm("VmHWM")
    t0 = time.perf_counter()
    cm.save(a.dir)
    save_s = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(a.dir) for f in fs)
    ids = prompt(MODELS[a.model]["vocab"], getattr(a, "batch", 1))
    got = cm.generate(ids, max_new_tokens=a.new, do_sample=False)
    with torch.no_grad():  # (quantised: the quantised model, eager, is the reference; torchao's: read as egraft's)
        want = (cm.model if cm.quantization else model).generate(ids, max_new_tokens=a.new, do_sample=False)
    same = got.tolist() == want.tolist()
    first = next((k for k, (x, y) in enumerate(zip(got[0].tolist(), want[0].tolist())) if x != y), None)
    alone = None
    if not same and len(ids) > 1:  # transformers' batch rounds each row's half-type products otherwise than one
        with torch.no_grad():      # row alone; each sequence run alone is the reference then (recorded so)
            ref = cm.model if cm.quantization else model
            alone = got.tolist() == torch.cat([ref.generate(ids[r:r + 1], max_new_tokens=a.new, do_sample=False)
                                               for r in range(len(ids))]).tolist()
    d = cm.generation.describe()
    return {"weights_bytes": weights, "rss_before_compile": before, "peak_reset": reset, "compile_s": compile_s,
            "peak_rss": peak,
            "peak_over_weights": peak / weights, "save_s": save_s, "artifact_bytes": size,
            "artifact_over_weights": size / weights, "tokens_equal": same, "first_difference": first,
            **({} if alone is None else {"tokens_equal_each_row_alone": alone}),
            "programs": d["programs"], "stages_s": d["stages_s"], "memory": d["memory"], "compile_memory": d["compile_memory"],
            "choices": d["choices"], **({"quantization": d["quantization"]} if "quantization" in d else {})}


def child_load(a) -> dict:
    import torch

    import egraft
    from egraft.measure import compare

    before = _vm("VmRSS")
    t0 = time.perf_counter()
    art = egraft.load(a.dir)
    load_s = time.perf_counter() - t0
    after = _vm("VmRSS")
    # a restarted process: the same load again in a fresh interpreter, while this one waits; and one with an empty
    # cache directory: a machine that never compiled these programs (XLA compiles each one)
    reload_s = _load_elsewhere(a.dir, {})
    with tempfile.TemporaryDirectory(prefix="egraft-cold-") as cold:
        cold_load_s = _load_elsewhere(a.dir, {"EGRAFT_CACHE_DIR": cold})
    model = model_for(a, peer=True)  # (torchao's: HF eager with torchao's layers; a checkpoint's: its float model)
    ids = prompt(MODELS[a.model]["vocab"], getattr(a, "batch", 1))

    def hf(n):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=n, do_sample=False)

    def eg(n):
        return art.generate(ids, max_new_tokens=n, do_sample=False)

    systems = {"egraft": eg, "hf_eager": hf}
    if getattr(a, "inductor", False):
        systems["hf_static_inductor"] = _inductor(model_for(a, peer=True), ids)
    first, tokens = {}, {}
    for name, f in systems.items():
        t0 = time.perf_counter()
        tokens[name] = f(1 + a.new).tolist()
        first[name] = time.perf_counter() - t0  # (Inductor's: its compile)
    steps, timed = time_decode(systems, a.rounds, a.new)
    return {"load_s": load_s, "reload_s": reload_s, "cold_load_s": cold_load_s,
            "rss_added_by_load": after - before, "rss_after_load": after,
            "first_call_s": first, **timed, "egraft_vs_hf_eager": compare(steps["egraft"], steps["hf_eager"]),
            **({"egraft_vs_hf_static_inductor": compare(steps["egraft"], steps["hf_static_inductor"]),
                "inductor_tokens_equal": tokens["hf_static_inductor"] == tokens["hf_eager"]}
               if "hf_static_inductor" in systems else {})}


def _inductor(model, ids):
    """``generate(n)`` of `model` as transformers' recipe compiles it: ``forward`` under ``torch.compile``
    (Inductor), a static KV cache of MAX_LENGTH (one shape for every step), transformers' own automatic compile
    off (it would compile again on top)."""
    import torch

    model.forward = torch.compile(model.forward)

    def gen(n):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=n, do_sample=False, cache_implementation="static",
                                  max_cache_len=MAX_LENGTH, disable_compile=True)

    return gen


def _load_elsewhere(directory: str, env: dict) -> float | None:
    """Seconds ``egraft.load(directory)`` takes in a fresh interpreter (pinned like this one) with `env` added."""
    code = "import time, egraft; t = time.perf_counter(); egraft.load(%r); print(time.perf_counter() - t)" % directory
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    return float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None


def time_decode(systems: dict, rounds: int, new: int) -> tuple[dict, dict]:
    """Interleaved `rounds` (the order rotates): each system's ``f(1)`` (the prefill and one token) and
    ``f(1 + new)``; decode time per token is the difference over `new`.  Returns the per-token summaries and
    ``decode_tok_s``, ``decode_spread`` and ``prefill_ms`` (medians)."""
    from egraft.measure import summarize

    decode = {n: [] for n in systems}
    prefill = {n: [] for n in systems}
    names = list(systems)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            f = systems[name]
            t0 = time.perf_counter()
            f(1)
            t1 = time.perf_counter()
            f(1 + new)
            t2 = time.perf_counter()
            prefill[name].append(t1 - t0)
            decode[name].append(((t2 - t1) - (t1 - t0)) / new)  # seconds per decode step
    steps = {n: summarize(v) for n, v in decode.items()}
    return steps, {"decode_tok_s": {n: 1.0 / t.median for n, t in steps.items()},
                   "decode_spread": {n: t.spread for n, t in steps.items()},
                   "prefill_ms": {n: 1e3 * float(sorted(v)[len(v) // 2]) for n, v in prefill.items()}}


def run_child(kind: str, a, directory: str) -> dict:
    return run_script(sys.executable, __file__, ["--child", kind, "--models", a.model, "--dtypes", a.dtype,
                                                 "--budget", a.budget,
                                                 "--weight-copies", getattr(a, "weight_copies", "no"),
                                                 "--quantize", getattr(a, "quantize", "none"),
                                                 *(["--group-size", str(a.group_size)] if getattr(a, "group_size", None)
                                                   else []),
                                                 "--batch", str(getattr(a, "batch", 1)),
                                                 *(["--inductor"] if getattr(a, "inductor", False) else []),
                                                 "--rounds", str(a.rounds), "--new",
                                                 str(a.new), "--dir", directory])


def run_script(python: str, script: str, args: list[str]) -> dict:
    """`script` run by `python` in a fresh process with this checkout first on its path: the JSON of its last
    line, or ``{"error": its stderr's end}`` (with Python's fault handler on, so a crash in native code says
    where, and the exit status or signal named)."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "PYTHONFAULTHANDLER": "1"}
    out = subprocess.run([python, os.path.abspath(script), *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        how = f"killed by signal {-out.returncode}" if out.returncode < 0 else f"exit status {out.returncode}"
        return {"error": f"{how}: {out.stderr[-3000:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["llama-135m", "qwen2-0.5b"])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--budget", default="60s")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "raw", "real_size.json"))
    p.add_argument("--inductor", action="store_true",
                   help="also time HF with a static cache under torch.compile (Inductor) beside egraft and HF eager "
                        "(torchao's layers under Inductor with --quantize torchao-*)")
    p.add_argument("--quick", action="store_true", help="the tiny Llama, 3 rounds, 8 tokens, budget 5s")
    p.add_argument("--weight-copies", choices=["yes", "no"], default="no",
                   help="egraft.compile's weight_copies (no, its default: every product reads its weight where it "
                        "is stored; yes: column panels, a second copy, where the search finds them faster)")
    p.add_argument("--group-size", type=int, choices=[32, 64, 128], default=None,
                   help="(--quantize int4 / torchao-int4) input columns per scale (egraft.compile's group_size)")
    p.add_argument("--batch", type=int, default=1,
                   help="sequences generated together (max_batch; the decode rate is per sequence)")
    p.add_argument("--quantize", choices=["none", "int8", "int4", "w8a8", "torchao-int8", "torchao-int4", "gptq-int4", "awq-int4"],
                   default="none",
                   help="egraft.compile's quantize (int8: weight-only, per output channel; the tokens are checked "
                        "against the quantised model's, HF eager stays the float model); torchao-int8 / torchao-int4: "
                        "the model quantised with torchao's weight-only configs first and compiled as it is (HF eager "
                        "then runs torchao's layers); gptq-int4 / awq-int4: the model written as that checkpoint "
                        "(zero points) and read by egraft.from_pretrained (HF eager runs its dequantised float model)")
    p.add_argument("--child", choices=["compile", "load"], help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        from egraft.measure import fix_threads

        fix_threads(1)  # before torch and jax start: one core, one thread
        a.model, a.dtype = a.models[0], a.dtypes[0]
        res = child_compile(a) if a.child == "compile" else child_load(a)
        print(json.dumps(res))
        return 0
    if a.quick:
        a.models, a.rounds, a.new, a.budget = ["llama-tiny"], 3, 8, "5s"
    measure_rows(a, "bench/real_size.py", argv)
    return 0


def measure_rows(a, script: str, argv, extend=None) -> None:
    """Per model and dtype, in a temporary directory: the compile child, the load child, then `extend(row,
    directory, artifact)` when the compile worked (a caller's own measurements); each row printed as it ends, all
    written to ``a.out`` with the date, the host and the command."""
    from bench.machine import host

    rows = []
    for model in a.models:
        for dtype in a.dtypes:
            a.model, a.dtype = model, dtype
            d = tempfile.mkdtemp(prefix="egraft-bench-")
            # a new user's machine: no search result or compiled program of an earlier run (egraft's cache
            # directory, the children's and the load's, is this row's own)
            os.environ["EGRAFT_CACHE_DIR"] = os.path.join(d, "cache")
            try:
                art = os.path.join(d, "artifact")
                row = {"model": model, "dtype": dtype, "budget": a.budget, "threads": 1,
                       "weight_copies": getattr(a, "weight_copies", "no") == "yes",
                       "quantize": getattr(a, "quantize", "none"), "group_size": getattr(a, "group_size", None),
                       "batch": getattr(a, "batch", 1), "inductor": getattr(a, "inductor", False)}
                row["compile"] = run_child("compile", a, art)
                ok = "error" not in row["compile"]
                row["load"] = run_child("load", a, art) if ok else {"error": "no artifact"}
                if ok and extend is not None:
                    extend(row, d, art)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            print(json.dumps(row), flush=True)
            rows.append(row)
    doc = {"date": time.strftime("%Y-%m-%d"), "host": host(),
           "command": " ".join(["python3", script] + list(argv or sys.argv[1:])), "rows": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
