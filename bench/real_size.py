"""Models at the sizes people serve: compile time and memory, artifact size, load time and memory, decode speed.

Random weights (seeded; nothing is downloaded) at the published shapes of two
small deployed models, in float32 and bfloat16.  Each model and dtype gets
its own empty egraft cache directory (``EGRAFT_CACHE_DIR``): no search result
or compiled program of an earlier run is reused.

* ``llama-135m``: the Llama architecture, 30 layers x 576, 9 / 3 heads,
  intermediate 1536, vocab 49152, tied embeddings (135 M parameters);
* ``qwen2-0.5b``: the Qwen2 architecture, 24 layers x 896, 14 / 2 heads,
  intermediate 4864, vocab 151936, tied embeddings, QKV biases (494 M);
* ``llama-1.2b`` (by name only): the Llama architecture, 16 layers x 2048,
  32 / 8 heads, intermediate 8192, vocab 128256, tied (1.24 B).

The output layer is scaled (x 8) so that greedy choices are clear, as a
trained model's are: random weights give near-tied logits that bfloat16
rounding flips.  Each model and dtype runs two fresh processes, both pinned
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

MODELS = {
    "llama-135m": dict(kind="llama", layers=30, hidden=576, heads=9, kv_heads=3, intermediate=1536, vocab=49152),
    "qwen2-0.5b": dict(kind="qwen2", layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864, vocab=151936),
    # the shapes of a 1.2 B Llama-architecture model (16 layers x 2048, 32 / 8 heads, vocab 128256, tied)
    "llama-1.2b": dict(kind="llama", layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256),
    "llama-tiny": dict(kind="llama", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256),  # --quick
}
SEED, PROMPT, MAX_LENGTH = 0, 16, 256


def build(name: str, dtype: str):
    import torch
    import transformers as T

    m = MODELS[name]
    common = dict(num_hidden_layers=m["layers"], hidden_size=m["hidden"], num_attention_heads=m["heads"],
                  num_key_value_heads=m["kv_heads"], intermediate_size=m["intermediate"], vocab_size=m["vocab"],
                  max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = (T.LlamaForCausalLM(T.LlamaConfig(**common)) if m["kind"] == "llama"
                 else T.Qwen2ForCausalLM(T.Qwen2Config(**common)))
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(8.0)  # (tied: the embedding too, which norms absorb)
    model = model.to(getattr(torch, dtype)).eval()
    gc = model.generation_config
    gc.eos_token_id = gc.bos_token_id = gc.pad_token_id = None
    return model


def step_bytes(model, context: float) -> float:
    """Bytes one batch-1 decode step of `model` reads: every weight once (an untied input embedding: one row;
    a quantised layer's stored values and scales) and the K and V cache over `context` positions, in the model's
    dtype."""
    # a tied table once (a torchao tensor is a wrapper whose own data_ptr says nothing: by identity)
    params = {id(p) if hasattr(p, "qdata") else p.data_ptr(): p for p in list(model.parameters()) + list(model.buffers())}
    total = sum(nbytes(p) for p in params.values())  # (a quantised layer's values: buffers)
    emb = model.get_input_embeddings().weight
    out = getattr(model.get_output_embeddings(), "weight", None)  # (None: a quantised output layer)
    if out is None or emb.data_ptr() != out.data_ptr():
        total -= (emb.shape[0] - 1) * emb.shape[1] * emb.element_size()
    c = model.config
    head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return total + 2 * c.num_hidden_layers * c.num_key_value_heads * head * emb.element_size() * context


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _prompt(vocab: int, rows: int = 1):
    import torch

    return torch.randint(0, vocab, (rows, PROMPT), generator=torch.Generator().manual_seed(SEED + 1))


def _quantize(a) -> str | None:
    """egraft.compile's quantize= for this run (None for a float model and for one quantised elsewhere)."""
    q = getattr(a, "quantize", "none")
    return q if q in ("int8", "int4", "w8a8") else None


def _model(a, peer: bool = False):
    """The model this run compiles, or with `peer` the one HF eager runs beside it: `a.model` in `a.dtype`; for
    ``--quantize torchao-*`` quantised by torchao (both); for ``gptq-int4`` / ``awq-int4`` written as that
    checkpoint (``egraft.testing.checkpoints``: 4-bit with zero points, groups of ``--group-size``, float16 other
    tensors) and read back by ``egraft.from_pretrained``, the peer being the float model of its dequantised
    weights (transformers cannot run the checkpoint without the GPTQ / AWQ library)."""
    import torch

    model = build(a.model, a.dtype)
    q = getattr(a, "quantize", "none") or "none"
    if q not in ("gptq-int4", "awq-int4"):
        return _torchao(model, a)
    import egraft
    from egraft.testing import checkpoints

    with tempfile.TemporaryDirectory(prefix="egraft-ckpt-") as d:
        meant = checkpoints.write(model, d, q.split("-")[0], group=getattr(a, "group_size", None) or 128)
        if peer:
            return checkpoints.float_model(model, meant).to(getattr(torch, a.dtype))
        return egraft.from_pretrained(d, dtype=getattr(torch, a.dtype))


def _torchao(model, a):
    """`model` quantised in place with torchao's weight-only config for ``--quantize torchao-int8 | torchao-int4``
    (int4: groups of ``--group-size``, default 128), as a user who quantised it with torchao hands it to egraft."""
    q = getattr(a, "quantize", "none") or "none"
    if not q.startswith("torchao"):
        return model
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    quantize_(model, Int8WeightOnlyConfig() if q == "torchao-int8" else
              IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(getattr(a, "group_size", None) or 128)))
    return model


def nbytes(t) -> int:
    """Bytes a step reads of `t`: a torchao quantised tensor's integers and scales (its zero points, all 0 in the
    forms egraft reads, are dropped), a plain tensor's elements."""
    parts = [t.qdata, t.scale] if hasattr(t, "qdata") else [t]
    return sum(p.numel() * p.element_size() for p in parts if p is not None)


def child_compile(a) -> dict:
    import torch

    import egraft
    from egraft.measure.memory import reset_peak

    model = _model(a)
    weights = sum(nbytes(t) for t in list(model.parameters()) + list(model.buffers()))
    before = _vm("VmRSS")
    reset = reset_peak()  # the peak from here on is the compile's (building the model can peak higher: a cast)
    t0 = time.perf_counter()
    cm = egraft.compile(model, device="cpu", max_batch=getattr(a, "batch", 1), max_length=MAX_LENGTH, budget=a.budget,
                        progress=False,
                        weight_copies=getattr(a, "weight_copies", "no") == "yes", quantize=_quantize(a),
                        group_size=getattr(a, "group_size", None) if _quantize(a) == "int4" else None)
    compile_s = time.perf_counter() - t0
    peak = _vm("VmHWM")
    t0 = time.perf_counter()
    cm.save(a.dir)
    save_s = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(a.dir) for f in fs)
    ids = _prompt(MODELS[a.model]["vocab"], getattr(a, "batch", 1))
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
    model = _model(a, peer=True)  # (torchao's: HF eager with torchao's layers; a checkpoint's: its float model)
    ids = _prompt(MODELS[a.model]["vocab"], getattr(a, "batch", 1))

    def hf(n):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=n, do_sample=False)

    def eg(n):
        return art.generate(ids, max_new_tokens=n, do_sample=False)

    systems = {"egraft": eg, "hf_eager": hf}
    if getattr(a, "inductor", False):
        systems["hf_static_inductor"] = _inductor(_model(a, peer=True), ids)
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
    sys.path.insert(0, ROOT)
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
