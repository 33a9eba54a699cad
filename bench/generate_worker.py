"""One measurement of bench/generate.py, in its own process: one system x one model x one thread count.

A process of its own per system, so its peak RSS (``VmHWM``) is that
system's alone and its threads are fixed before torch starts.  Modes:

* ``run``: build the model (or load it, for vLLM), set the system up, then
  time greedy generations (see :func:`measure`) and write raw samples,
  tokens and memory as JSON to ``--result``.  Any error is written there as
  ``status: "not run: <stage>: <error's first line>"`` (exit status 0: the
  parent reports it in the row); the traceback goes to stderr.
* ``bandwidth``: seconds per read of a 256 MiB float32 array split over the
  pinned threads, by the faster of a numpy sum (one stream) and a BLAS
  matrix-vector product (many rows read at once, as a decode step's products
  read them); numpy and BLAS release the GIL.
* ``save``: write a model's weights and config to ``--model-dir`` for vLLM.

It runs under the vLLM virtual environment too, so egraft is imported only
when there (the pinning falls back to the same rule by hand).

    python3 bench/generate_worker.py run --system hf_eager --model llama-tiny --threads 1 --prompts 16 \\
        --batches 1 --new-tokens 8 --rounds 2 --max-length 128 --result /tmp/r.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_models import MODELS, SEED, build  # noqa: E402

SYSTEMS = ("hf_eager", "hf_static_inductor", "vllm", "egraft_dynamo", "egraft_compile")


def pin(n: int) -> list[int]:
    """`n` threads on `n` pinned cores, before torch starts (egraft.measure.fix_threads; by hand without egraft)."""
    try:
        from egraft.measure import fix_threads
    except ImportError:  # the vLLM venv: the same rule (the last n cores) without egraft's dependencies
        cores = sorted(os.sched_getaffinity(0))
        if n > len(cores):
            raise RuntimeError(f"cannot measure on {n} cores: this process may use {len(cores)} ({cores})")
        for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[k] = str(n)
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        os.sched_setaffinity(0, cores[len(cores) - n:])
        return sorted(os.sched_getaffinity(0))
    return list(fix_threads(n))


def memory() -> dict:
    """This process's RSS high-water mark and now (``/proc/self/status``), and its largest child's peak, in bytes."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(val.split()[0]) * 1024
    except OSError:
        out["VmHWM"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["children_maxrss"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return out


def prompt(batch: int, length: int, vocab: int, seed: int = SEED) -> list[list[int]]:
    """The same token ids in every process and every environment (numpy's generator, seeded by the shape)."""
    import numpy as np

    return np.random.default_rng([seed, batch, length]).integers(1, vocab, size=(batch, length)).tolist()


# --- the systems: setup() -> gen(ids, new_tokens) -> new token ids per sequence ------------------------------

def _hf_gen(model, **extra):
    import torch

    def gen(ids, n):
        x = torch.tensor(ids, dtype=torch.long)
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                             num_beams=1, pad_token_id=0, **extra)
        return out[:, x.shape[1]:].tolist()

    return gen


def setup_hf_eager(model, a):
    return _hf_gen(model)  # DynamicCache: transformers' default


def _static(a):
    # one cache size for every prompt (transformers would otherwise size it per call and grow it), and no
    # automatic compile by transformers on top of ours
    return dict(cache_implementation="static", max_cache_len=a.max_length, disable_compile=True)


def setup_hf_static_inductor(model, a):
    import torch

    model.forward = torch.compile(model.forward)
    return _hf_gen(model, **_static(a))


def setup_egraft_dynamo(model, a):
    import torch

    model.forward = torch.compile(model.forward, backend="egraft")
    return _hf_gen(model, **_static(a))


def setup_egraft_compile(model, a):
    import torch

    import egraft

    cm = egraft.compile(model, device="cpu", max_batch=a.max_batch, max_length=a.max_length)

    def gen(ids, n):
        x = torch.tensor(ids, dtype=torch.long)
        out = cm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)
        seq = getattr(out, "sequences", out)  # prompt + new tokens per sequence, as transformers returns them
        return [list(map(int, row))[x.shape[1]:] for row in (seq.tolist() if hasattr(seq, "tolist") else seq)]

    gen.compiled = cm.generation.describe()  # the programs, their compile seconds, the searches (into the row)
    return gen


def setup_vllm(model, a):  # `model` is None: vLLM loads the weights bench/generate.py saved
    cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB (its least); far above what 4 x 640 positions need
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0]))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its RSS is ours
    from vllm import LLM, SamplingParams

    # no prefix cache: the timed calls repeat their prompts and would otherwise skip the prefill; a whole
    # batch's prompts in one step (by default vLLM chunks a prefill at max_model_len tokens), as HF runs them
    llm = LLM(model=a.model_dir, dtype="float32", max_model_len=a.max_length, max_num_seqs=a.max_batch,
              max_num_batched_tokens=a.max_batch * a.max_length, enable_prefix_caching=False,
              skip_tokenizer_init=True, seed=a.seed)

    def gen(ids, n):
        sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": row} for row in ids], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return gen


def versions(system: str) -> dict:
    out = {"python": sys.version.split()[0]}
    for mod in ("numpy", "torch", "transformers", "vllm", "jax", "egraft"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
    return out


# --- the measurement -------------------------------------------------------------------------------------

def measure(gen, configs, vocab, new_tokens, rounds):
    """First calls, then `rounds` rounds of (prefill, full generation) per config, configs rotating each round.

    The first call of each (batch, prompt) config, in the given order, is
    timed on its own: the first compiles the model, each later one adds what
    its new shape costs (a bucket).  Then one untimed prefill per config,
    and per round each config (order rotated, as egraft.measure.interleaved
    does) times ``gen(ids, 1)`` (the prefill and one token) and
    ``gen(ids, new_tokens)``; a round's decode step is their difference over
    new_tokens - 1.  Every full generation must repeat the first call's tokens.
    """
    recs = []
    for b, p in configs:
        ids = prompt(b, p, vocab)
        t0 = time.perf_counter()
        toks = gen(ids, new_tokens)
        recs.append({"batch": b, "prompt": p, "new_tokens": new_tokens, "first_call_s": time.perf_counter() - t0,
                     "tokens": toks, "prefill_s": [], "generate_s": [], "repeats_tokens": True, "_ids": ids})
    for r in recs:
        gen(r["_ids"], 1)
    for k in range(rounds):
        for r in recs[k % len(recs):] + recs[:k % len(recs)]:
            t0 = time.perf_counter()
            gen(r["_ids"], 1)
            t1 = time.perf_counter()
            toks = gen(r["_ids"], new_tokens)
            t2 = time.perf_counter()
            r["prefill_s"].append(t1 - t0)
            r["generate_s"].append(t2 - t1)
            r["repeats_tokens"] &= toks == r["tokens"]
    for r in recs:
        del r["_ids"]
    return recs


def run(a) -> dict:
    res = {"system": a.system, "model": a.model, "threads": a.threads, "status": "ok"}
    stage = "pinning"
    caught = []
    try:
        res["cores"] = pin(a.threads)
        stage = "import"
        model = None
        if a.system != "vllm":
            import torch
            import transformers  # noqa: F401 - imported before the timed setup

            torch.set_num_threads(a.threads)
            stage = "build"
            t0 = time.perf_counter()
            model = build(a.model, a.seed)
            res["build_s"] = time.perf_counter() - t0
            res["parameters"] = sum(p.numel() for p in model.parameters())
        stage = "setup"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            gen = globals()[f"setup_{a.system}"](model, a)
            res["setup_s"] = time.perf_counter() - t0
            res["memory_after_setup"] = memory()
            if getattr(gen, "compiled", None) is not None:
                res["compiled"] = gen.compiled
            stage = "generate"
            configs = [(b, p) for b in a.batches for p in a.prompts]
            res["configs"] = measure(gen, configs, MODELS[a.model]["vocab"], a.new_tokens, a.rounds)
    except BaseException as e:  # noqa: BLE001 - every failure becomes the row's "not run: ..."
        first = (str(e).strip().splitlines() or [""])[0][:300]
        res["status"] = f"not run: {a.system} {stage}: {type(e).__name__}: {first}".rstrip(": ")
        traceback.print_exc()
    res["memory"] = memory()
    res["versions"] = versions(a.system)
    res["warnings"] = _warning_summary(caught)
    return res


def _warning_summary(caught) -> list[dict]:
    """Distinct warnings (category, first line) with how often each came."""
    seen: dict = {}
    for w in caught or []:
        key = (w.category.__name__, (str(w.message).strip().splitlines() or [""])[0][:300])
        seen[key] = seen.get(key, 0) + 1
    return [{"category": c, "message": m, "count": n} for (c, m), n in seen.items()]


# the readers the read bandwidth is the fastest of: a numpy sum reads one stream (pairwise, 13-21 GB/s on one
# core of this project's host), a BLAS matrix-vector product reads many rows at once (48 GB/s there), as a
# decode step's products do; a bound divided by the slower one would be one the decode steps exceed
READERS = ("numpy sum", "BLAS gemv")
ROW = 4096  # float32 values per row of the gemv reader (16 KiB)


def bandwidth(a) -> dict:
    """Seconds per read of a 256 MiB float32 array, its slices split over the `threads` pinned threads, by each
    of :data:`READERS` (interleaved); ``seconds`` are the fastest reader's (by median), ``reader`` names it."""
    cores = pin(a.threads)
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor

    x = np.ones((256 << 20) // 4, dtype=np.float32)  # written once: every page is resident
    rows = x.reshape(-1, ROW)
    ones = np.ones(ROW, dtype=np.float32)
    parts = {"numpy sum": np.array_split(x, a.threads), "BLAS gemv": np.array_split(rows, a.threads)}
    read = {"numpy sum": lambda p: float(np.sum(p)), "BLAS gemv": lambda p: float((p @ ones).sum())}
    secs = {r: [] for r in READERS}
    with ThreadPoolExecutor(a.threads) as pool:
        def once(r):
            return sum(pool.map(read[r], parts[r]))  # numpy and BLAS release the GIL

        for r in READERS:
            for _ in range(2):
                once(r)
        for _ in range(a.repeats):
            for r in READERS:
                t0 = time.perf_counter()
                total = once(r)
                secs[r].append(time.perf_counter() - t0)
                if total != x.size:
                    raise AssertionError(f"the bandwidth read ({r}) summed {total}, not {x.size}")
    best = min(READERS, key=lambda r: sorted(secs[r])[len(secs[r]) // 2])
    return {"threads": a.threads, "cores": cores, "bytes": int(x.nbytes), "seconds": secs[best], "reader": best,
            "readers": secs, "numpy": np.__version__}


def save(a) -> dict:
    model = build(a.model, a.seed)
    model.save_pretrained(a.model_dir)
    return {"model": a.model, "model_dir": a.model_dir}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["run", "bandwidth", "save"])
    ap.add_argument("--system", choices=SYSTEMS)
    ap.add_argument("--model", choices=list(MODELS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, nargs="+", default=[16])
    ap.add_argument("--batches", type=int, nargs="+", default=[1])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=9, help="bandwidth: timed sums")
    ap.add_argument("--max-length", type=int, default=640)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--result", required=True)
    a = ap.parse_args(argv)
    out = {"run": run, "bandwidth": bandwidth, "save": save}[a.mode](a)
    with open(a.result, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
