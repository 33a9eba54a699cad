"""egraft against llama.cpp and HF eager on the same random weights, in one process, one pinned core and two.

What a CPU user would run instead of egraft is llama.cpp.  This benchmark
puts the three side by side at deployed sizes (the models of
``bench/real_models.py``: random weights at the shapes of a 135 M Llama and a
494 M Qwen2, output layer scaled so greedy choices are clear):

1. ``compile`` and ``load`` (the project's environment): ``real_size.py``'s
   two children, one pinned core: compile time, peak RSS, artifact size and
   tokens; then load time and RSS (and a restarted load), and decode against
   HF eager;
2. ``gguf`` (llama.cpp's environment): the same model written with
   ``save_pretrained`` (a tiny SentencePiece tokenizer beside it, which the
   converter needs and the timing does not read) and converted by
   llama.cpp's own ``convert_hf_to_gguf.py`` at the model's precision:
   F32 for a float32 model, F16 and BF16 for a bfloat16 one;
3. ``measure`` (llama.cpp's environment, which also has egraft's
   dependencies): per thread count, a fresh process pinned to that many
   cores with one thread each for torch, XLA and llama.cpp
   (``egraft.measure.fix_threads``) loads the egraft artifact, the GGUF
   files and the transformers model, and times decode interleaved,
   ``--rounds`` rounds: prompt 16, the prefill plus one token and the
   prefill plus ``1 + new`` tokens, decode time per token the difference.
   Medians and spreads (``egraft.measure.summarize``); a ratio only where
   ``egraft.measure.compare`` concludes.  Then, in the same process, the
   read bandwidth on those cores (``generate_worker.bandwidth``: the faster
   of a numpy sum and a BLAS matrix-vector product) and the decode bound:
   that bandwidth over the bytes a step reads (``real_models.step_bytes``),
   with each system's share of it.  llama.cpp's greedy tokens (F32)
   and egraft's are checked against transformers'.

llama.cpp's environment: ``make llamacpp-venv`` (builds llama.cpp from the
package registry's source distribution, about 6 minutes on 2 cores).

With ``--vllm``, a second ``measure`` process per thread count runs in
vLLM's environment (``make vllm-venv``; ``$EGRAFT_VLLM_VENV`` names another):
egraft's artifact and HF eager again, beside vLLM's CPU build on the same
weights at the same dtype (saved with ``save_pretrained`` by that process,
vLLM's engine in the process, no prefix cache, its threads bound to the same
cores), interleaved the same way; each ratio is to the egraft run of the same
process.  Unquantised models only (vLLM's CPU quantised layers are other
functions and formats).

    python3 bench/peers.py [--models llama-135m qwen2-0.5b] [--dtypes float32 bfloat16] [--threads 1 2]
                           [--budget 60s] [--rounds 5] [--new 32] [--out docs/results/raw/peers.json]
                           [--quantize int8|int4|w8a8 [--group-size 64]] [--vllm]

With ``--quantize``, egraft's weight-only int8 / int4 model runs against
llama.cpp's Q8_0 / Q4_0 of the same float weights (whose dot products also
quantise the activations: not the same function), and egraft's lossy
``w8a8`` (int8 activations per row, integer products) against Q8_0;
egraft's tokens are checked against the quantised model's, and the decode
bound counts the quantised bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

# (the read bandwidth; the models and prompt; the compile child)
from bench import generate_worker, real_models, real_size  # noqa: E402

VENV = os.environ.get("EGRAFT_LLAMACPP_VENV", os.path.join(ROOT, ".venv-llamacpp"))
VLLM_VENV = os.environ.get("EGRAFT_VLLM_VENV", os.path.join(ROOT, ".venv-vllm"))
GGUF_TYPES = {"float32": ("f32",), "bfloat16": ("f16", "bf16"), "float16": ("f16",)}
QUANTISED = {"int8": "q8_0", "int4": "q4_0", "w8a8": "q8_0"}  # egraft's mode -> llama.cpp's type of the same bits


def _venv_python(venv: str = VENV, what: str = "llama.cpp", target: str = "llamacpp-venv",
                 variable: str = "EGRAFT_LLAMACPP_VENV") -> str:
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(os.path.join(venv, ".built")):
        raise SystemExit(f"{what}'s environment is not built at {venv}: run `make {target}` first "
                         f"(or set {variable} to one built elsewhere)")
    return py


def _converter() -> str:
    path = os.path.join(VENV, "llama.cpp", "convert_hf_to_gguf.py")
    if not os.path.exists(path):
        raise SystemExit(f"{path} is missing: `make llamacpp-venv` unpacks llama.cpp's converter there")
    return path


# ---------------------------------------------------------------------------------------------------------------
# children

def _tokenizer(directory: str) -> None:
    """A tiny SentencePiece model (byte fallback) in `directory`: the converter needs a tokenizer it knows."""
    import random

    import sentencepiece as spm

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(400)]
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=os.path.join(directory, "tokenizer"),
                                   vocab_size=512, byte_fallback=True, model_type="bpe", minloglevel=2)


def child_gguf(a) -> dict:
    """The model at its dtype, saved and converted to each GGUF type (quantised: llama.cpp's type of the same
    bits, Q8_0 by the converter, Q4_0 by llama.cpp's quantiser from the F32 file); returns {type: path}."""
    model = real_models.build(a.model, a.dtype)
    hf = os.path.join(a.dir, "hf")
    model.save_pretrained(hf)
    _tokenizer(hf)
    out = {}
    mode = real_models.quantize_mode(a)
    types = GGUF_TYPES[a.dtype] if mode is None else (QUANTISED[mode],) if mode != "int4" else ("f32",)
    for t in types:
        path = os.path.join(a.dir, f"model-{t}.gguf")
        r = subprocess.run([sys.executable, _converter(), hf, "--outtype", t, "--outfile", path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return {"error": f"convert_hf_to_gguf --outtype {t}: {r.stderr[-2000:]}"}
        out[t] = path
    shutil.rmtree(hf, ignore_errors=True)
    if mode == "int4":  # (the converter writes no Q4_0)
        import ctypes

        import llama_cpp

        t = QUANTISED[mode]
        src, path = out.pop("f32"), os.path.join(a.dir, f"model-{t}.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
        if llama_cpp.llama_model_quantize(src.encode(), path.encode(), ctypes.byref(params)) != 0:
            return {"error": "llama_model_quantize to Q4_0 failed"}
        os.remove(src)
        out[t] = path
    return out


def _llama_cpp(a, prompt: list[int]) -> dict:
    """llama.cpp's systems, one per GGUF file: ``run(n)`` evaluates the prompt and samples `n` greedy tokens.
    ``--no-extra-bufts``: its models loaded without its extra buffer types (AMX, repacked weights)."""
    import llama_cpp
    import llama_cpp.llama

    if a.no_extra_bufts:  # (the Llama class takes no such argument: its default model parameters, changed)
        default = llama_cpp.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama.llama_cpp.llama_model_default_params = params

    def system(llm):
        def run(n):
            llm.reset()
            llm.eval(prompt)
            toks = []
            for _ in range(n):
                tok = llm.sample(top_k=1, temp=0.0)
                toks.append(tok)
                if len(toks) < n:
                    llm.eval([tok])
            return toks
        return run

    return {f"llama.cpp {t.upper()}": system(llama_cpp.Llama(model_path=p, n_ctx=512, n_threads=a.threads[0],
                                                             n_threads_batch=a.threads[0], verbose=False))
            for t, p in json.loads(a.ggufs).items()}


def _vllm(a, model, prompt: list[int]) -> dict:
    """vLLM's CPU build on `model`'s weights (saved into ``a.dir``'s sibling ``hf-vllm``), its engine in this
    process with its threads bound to this process's cores: ``{"vllm": run}``, ``run(n)`` `n` greedy tokens."""
    cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB, its least: far above 1 x 256 positions
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, on these cores
    hf = os.path.join(os.path.dirname(os.path.abspath(a.dir)), "hf-vllm")
    model.save_pretrained(hf)
    from vllm import LLM, SamplingParams

    llm = LLM(model=hf, dtype=a.dtype, max_model_len=256, max_num_seqs=1, enable_prefix_caching=False,
              skip_tokenizer_init=True, seed=0)

    def run(n):
        sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        out = llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)
        return list(out[0].outputs[0].token_ids)

    return {"vllm": run}


def child_measure(a) -> dict:
    import torch

    import egraft
    from egraft.measure import compare

    model = real_models.build(a.model, a.dtype)
    ids = real_models.prompt(real_models.MODELS[a.model]["vocab"])
    prompt = ids[0].tolist()
    # the peer first: vLLM's worker start scans every loaded module's globals and trips on llvmlite's (which
    # egraft's generated kernels import when the artifact loads)
    peers = _vllm(a, model, prompt) if a.peer == "vllm" else _llama_cpp(a, prompt)
    art = egraft.load(a.dir)

    def hf(n):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1]:].tolist()

    def eg(n):
        return art.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1]:].tolist()

    systems = {"egraft": eg, "hf_eager": hf, **peers}
    tokens = {name: f(a.new) for name, f in systems.items()}  # (also the warm-up)
    want = tokens["hf_eager"]
    equal = {name: got == want for name, got in tokens.items() if name != "hf_eager"}
    reference = model
    if real_models.quantize_mode(a):  # egraft equals the quantised model (eager, untimed); llama.cpp's differ
        from egraft.frontend.quantize import quantize

        reference = quantize(model, a.quantize, getattr(a, "group_size", None))[0]
        with torch.no_grad():
            quantised = reference.generate(ids, max_new_tokens=a.new, do_sample=False)[0, ids.shape[1]:].tolist()
        equal = {"egraft_vs_quantised_model": tokens["egraft"] == quantised,
                 **{f"{n}_vs_quantised_model": t == quantised for n, t in tokens.items() if n in peers},
                 **{f"{n}_vs_float_model": t == want for n, t in tokens.items() if n != "hf_eager"}}
    steps, timed = real_size.time_decode(systems, a.rounds, a.new)
    bw = generate_worker.bandwidth(argparse.Namespace(threads=a.threads[0], repeats=9))  # same pinned cores
    rate = bw["bytes"] / sorted(bw["seconds"])[len(bw["seconds"]) // 2]
    per_step = real_models.step_bytes(reference, real_models.PROMPT + a.new / 2)  # (quantised: egraft's bytes)
    bound = {"bandwidth": rate, "reader": bw["reader"], "step_bytes": per_step, "tok_s": rate / per_step,
             "share": {n: t / (rate / per_step) for n, t in timed["decode_tok_s"].items()}}
    extra = {"llama_cpp_extra_bufts": not a.no_extra_bufts} if a.peer == "llama.cpp" else {}
    return {"threads": a.threads[0], "peer": a.peer, **extra, **timed, "decode_bound": bound,
            "tokens_equal_transformers": equal,
            "egraft_vs": {n: compare(steps["egraft"], steps[n]) for n in systems if n != "egraft"}}


# ---------------------------------------------------------------------------------------------------------------
# the driver

def _run(python: str, kind: str, a, extra: list[str]) -> dict:
    quant = ["--quantize", a.quantize] + (["--group-size", str(a.group_size)] if a.group_size else [])
    return real_size.run_script(python, __file__, ["--child", kind, "--models", a.model, "--dtypes", a.dtype,
                                                   "--rounds", str(a.rounds), "--new", str(a.new)] + quant + extra)


def _llama_run(py: str, a, extra: list[str]) -> dict:
    """A llama.cpp measuring process; where it crashes (seen: llama.cpp 0.3.36's Q8_0 decode on an Intel Xeon with
    AMX, in its extra buffer types), once more with those buffer types off, the run saying so."""
    run = _run(py, "measure", a, extra)
    if "signal" in run.get("error", "")[:40]:
        again = _run(py, "measure", a, extra + ["--no-extra-bufts"])
        run = {**again, "crashed_with_extra_bufts": run["error"][:600]} if "error" not in again else run
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["llama-135m", "qwen2-0.5b"])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--budget", default="60s")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "raw", "peers.json"))
    p.add_argument("--quantize", choices=["none", "int8", "int4", "w8a8"], default="none",
                   help="egraft.compile's quantize, against llama.cpp's type of the same bits (int8 and the lossy "
                        "w8a8: Q8_0, int4: Q4_0); egraft's tokens are checked against the quantised model's")
    p.add_argument("--group-size", type=int, choices=[32, 64, 128], default=None,
                   help="(--quantize int4) input columns per scale")
    p.add_argument("--vllm", action="store_true",
                   help="also time vLLM's CPU build (its environment: `make vllm-venv`, or $EGRAFT_VLLM_VENV) beside "
                        "egraft and HF eager, per thread count; unquantised models only")
    p.add_argument("--child", choices=["gguf", "measure"], help=argparse.SUPPRESS)
    p.add_argument("--peer", choices=["llama.cpp", "vllm"], default="llama.cpp", help=argparse.SUPPRESS)
    p.add_argument("--no-extra-bufts", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--ggufs", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        a.model, a.dtype = a.models[0], a.dtypes[0]
        if a.child == "measure":
            from egraft.measure import fix_threads

            fix_threads(a.threads[0])  # before torch, jax and llama.cpp start
        print(json.dumps(child_gguf(a) if a.child == "gguf" else child_measure(a)))
        return 0
    py = _venv_python()
    _converter()
    if a.vllm and a.quantize != "none":
        raise SystemExit("--vllm times unquantised models only: vLLM's CPU quantised layers are other functions")
    vllm_py = _venv_python(VLLM_VENV, "vLLM", "vllm-venv", "EGRAFT_VLLM_VENV") if a.vllm else None

    def extend(row, directory, art):
        row["gguf"] = _run(py, "gguf", a, ["--dir", directory])
        if "error" not in row["gguf"]:
            ggufs = json.dumps(row["gguf"])
            row["runs"] = [_llama_run(py, a, ["--dir", art, "--threads", str(t), "--ggufs", ggufs]) for t in a.threads]
        if vllm_py:
            row["vllm_runs"] = [_run(vllm_py, "measure", a, ["--dir", art, "--threads", str(t), "--peer", "vllm"])
                                for t in a.threads]

    real_size.measure_rows(a, "bench/peers.py", argv, extend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
