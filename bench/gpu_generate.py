"""Generation on a GPU: a real-size model compiled for ``cuda``, its tokens and decode speed against transformers.

Random weights at a deployed model's published shapes (``bench/real_models.py``'s
models: nothing is downloaded), moved to the device in the chosen dtype, then:

1. ``egraft.compile(model, device=..., max_batch=1, max_length=256,
   budget=...)``: its wall time, ``describe()`` (per-stage seconds, the
   backend and knobs the search picked), peak GPU memory;
2. greedy tokens (prompt 16, ``--new`` new tokens) against transformers' eager
   ``generate`` on the same model and device;
3. decode speed, interleaved ``--rounds`` rounds (the order rotates): each
   system's ``generate(1)`` (prefill and one token) and ``generate(1 + new)``,
   the device synchronised after each; decode tokens/s = new / (the
   difference).  Medians and spreads (``egraft.measure.summarize``), the ratio
   only where ``egraft.measure.compare`` concludes;
4. with ``--profile``, where one ``generate`` call's time goes (cProfile);
5. ``save`` and ``egraft.load`` in this process (their wall times) and the
   loaded artifact's tokens.

Each step that fails is reported in the JSON (``error``) and the rest still runs.

    python3 bench/gpu_generate.py [--model qwen2-0.5b] [--dtype bfloat16] [--device cuda] [--budget 20s]
                                  [--rounds 5] [--new 32] [--out gpu_generate.json] [--backend auto]
                                  [--chunks 1,16] [--profile]

Without a GPU, ``--device cpu --model llama-tiny`` runs the same steps on the CPU (a check of this script).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}


def profile(fn, top: int = 30) -> list[str]:
    """cProfile one call of `fn`: the `top` functions by own time, as pstats prints them."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return [line for line in buf.getvalue().splitlines() if line.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2-0.5b")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", default="20s")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--out", default="gpu_generate.json")
    p.add_argument("--backend", default="auto", help="egraft.compile's backend (auto: the search picks)")
    p.add_argument("--chunks", default=None, help="the prompt chunk ladder, e.g. 1,16 (default: egraft's)")
    p.add_argument("--profile", action="store_true", help="after the timings, cProfile one generate call and "
                   "record where its time goes (the 30 costliest functions by own time)")
    p.add_argument("--quiet-after", metavar="FILE", help="before timing, wait (at most 300 s) until FILE exists: "
                   "the timings then start once other work on the machine (bench/gpu_all.sh's tests) has ended")
    a = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    import torch

    import egraft
    from bench.machine import host
    from bench.real_models import MODELS, build, prompt
    from bench.real_size import time_decode
    from egraft.measure import compare

    res: dict = {"date": time.strftime("%Y-%m-%d"), "host": host(), "model": a.model, "dtype": a.dtype,
                 "device": a.device, "budget": a.budget, "versions": {"torch": torch.__version__}}
    for mod in ("triton", "jax", "transformers"):
        try:
            res["versions"][mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 (a missing package is a fact to report)
            res["versions"][mod] = f"missing: {e}"
    if a.device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name(0)

    def write():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        print(json.dumps(res, default=str)[:3000], flush=True)

    model = build(a.model, a.dtype).to(a.device)
    ids = prompt(MODELS[a.model]["vocab"]).to(a.device)

    def hf(n):
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, do_sample=False)
        _sync(a.device)
        return out

    want = hf(a.new)
    try:
        if a.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        chunks = None if a.chunks is None else [int(c) for c in a.chunks.split(",")]
        cm = egraft.compile(model, device=a.device, max_batch=1, max_length=256, budget=a.budget, progress=True,
                            backend=a.backend, chunks=chunks)
        res["compile_s"] = time.perf_counter() - t0
        d = cm.generation.describe()
        res.update(programs=d["programs"], stages_s=d["stages_s"], choices=d["choices"], backends=d["backends"])
        if a.device.startswith("cuda"):
            res["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    except Exception as e:  # noqa: BLE001
        res["compile"] = _error(e)
        write()
        return 1
    write()

    def eg(n, art=None):
        out = (art or cm).generate(ids, max_new_tokens=n, do_sample=False)
        _sync(a.device)
        return out

    try:
        got = eg(a.new)
        res["tokens_equal"] = got.tolist() == want.tolist()
        res["first_difference"] = next((k for k, (x, y) in enumerate(zip(got[0].tolist(), want[0].tolist()))
                                        if x != y), None)
    except Exception as e:  # noqa: BLE001
        res["generate"] = _error(e)
        write()
        return 1
    write()
    if a.quiet_after:
        t0 = time.perf_counter()
        while not os.path.exists(a.quiet_after) and time.perf_counter() - t0 < 300:
            time.sleep(1)
        res["waited_for_quiet_s"] = time.perf_counter() - t0
    try:  # real_size's interleaved rounds (each system's calls synchronise the device themselves)
        steps, timed = time_decode({"egraft": eg, "hf_eager": hf}, a.rounds, a.new)
        res.update(timed)
        res["egraft_vs_hf_eager"] = compare(steps["egraft"], steps["hf_eager"])
    except Exception as e:  # noqa: BLE001
        res["timing"] = _error(e)
    write()
    if a.profile:
        try:
            res["profile_top"] = profile(lambda: eg(a.new))
        except Exception as e:  # noqa: BLE001
            res["profile"] = _error(e)
        write()
    try:
        with tempfile.TemporaryDirectory(prefix="egraft-gpu-") as tmp:
            t0 = time.perf_counter()
            cm.save(tmp)
            res["save_s"] = time.perf_counter() - t0
            res["artifact_bytes"] = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(tmp) for f in fs)
            t0 = time.perf_counter()
            art = egraft.load(tmp, device=a.device)
            res["load_s"] = time.perf_counter() - t0
            res["loaded_tokens_equal"] = eg(a.new, art).tolist() == want.tolist()
    except Exception as e:  # noqa: BLE001
        res["save_load"] = _error(e)
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
