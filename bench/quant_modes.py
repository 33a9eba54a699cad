"""egraft's quantisation modes side by side in one process: decode of each mode's artifact, interleaved.

Runs in different processes differ on a shared host by more than the modes
do (one 135 M run's load child decoded w8a8 at 38.9 tok/s, the measuring
process beside llama.cpp at 25.1), so a claim that one mode decodes faster
than another needs both in one process, pinned, interleaved.  This compiles
the ``--model`` once per mode (``--modes``; each compile in its own process,
budget ``--budget``, an empty cache directory, pinned to one core, the
compiles two at a time on two cores), then one process pinned to one core
(``--core``, one thread) loads every artifact and times ``generate`` the way
``bench/real_size.py`` does (the prefill and one token, then ``--new`` more;
rounds interleaved, the order rotating), with each pair of modes compared
(medians, their ~95 % intervals, ``egraft.measure.compare``).  Tokens: each
mode's are checked against its own quantised model (eager PyTorch).  Mode ``none`` is the float32 model
unquantised: the baseline a mode's speed-up is stated against.

    python3 bench/quant_modes.py [--model llama-135m] [--modes int8 w8a8] [--group-size 64] [--budget 60s]
                                 [--rounds 9] [--new 32] [--out quant_modes.json]
"""

from __future__ import annotations

import argparse
import itertools
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

from bench import real_models, real_size  # noqa: E402  (the models, the prompt; the interleaved decode timing)


def child_compile(a) -> dict:
    import egraft

    model = real_models.build(a.model, "float32")
    t0 = time.perf_counter()
    mode = a.modes[0]
    cm = egraft.compile(model, device="cpu", max_batch=1, max_length=real_models.MAX_LENGTH, budget=a.budget,
                        progress=False, quantize=None if mode == "none" else mode,
                        **({"group_size": a.group_size} if mode == "int4" and a.group_size else {}))
    compile_s = time.perf_counter() - t0
    cm.save(a.dir)
    ids = real_models.prompt(real_models.MODELS[a.model]["vocab"])
    got = cm.generate(ids, max_new_tokens=a.new, do_sample=False)
    want = cm.model.generate(ids, max_new_tokens=a.new, do_sample=False)  # the (quantised) model, eager
    return {"compile_s": compile_s, "tokens_equal_quantised_model": got.tolist() == want.tolist(),
            "quantization": cm.generation.describe().get("quantization")}


def child_time(a) -> dict:
    import egraft
    from egraft.measure import compare

    ids = real_models.prompt(real_models.MODELS[a.model]["vocab"])
    arts = {m: egraft.load(os.path.join(a.dir, m)) for m in a.modes}

    def gen(art):
        return lambda n: art.generate(ids, max_new_tokens=n, do_sample=False)

    systems = {m: gen(art) for m, art in arts.items()}
    for f in systems.values():
        f(1 + a.new)  # warm
    steps, timed = real_size.time_decode(systems, a.rounds, a.new)
    return {**timed, "vs": {f"{x}_over_{y}": compare(steps[x], steps[y])
                            for x, y in itertools.permutations(a.modes, 2)}}


def _child(kind: str, a, directory: str, modes: list[str], core: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, os.path.abspath(__file__), "--child", kind, "--model", a.model, "--modes", *modes,
            "--budget", a.budget, "--rounds", str(a.rounds), "--new", str(a.new), "--dir", directory,
            "--core", str(core)] + (["--group-size", str(a.group_size)] if a.group_size else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _result(p: subprocess.Popen) -> dict:
    out, err = p.communicate()
    return json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else {"error": err[-3000:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-135m", choices=sorted(real_models.MODELS))
    p.add_argument("--modes", nargs="+", default=["int8", "w8a8"], choices=["none", "int8", "int4", "w8a8"],
                   help="none: the float32 model unquantised (the baseline of a mode's speed-up)")
    p.add_argument("--group-size", type=int, choices=[32, 64, 128], default=None, help="int4's (default: egraft's)")
    p.add_argument("--budget", default="60s")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--core", type=int, default=None, help="the core the timing process is pinned to (default: "
                                                          "the last allowed)")
    p.add_argument("--out", default="quant_modes.json")
    p.add_argument("--child", choices=["compile", "time"], help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if a.child:
        from egraft.measure import fix_threads

        os.sched_setaffinity(0, [a.core])
        fix_threads(1)
        print(json.dumps(child_compile(a) if a.child == "compile" else child_time(a)))
        return 0
    from bench.machine import host

    d = tempfile.mkdtemp(prefix="egraft-modes-")
    try:
        compiled = {}
        for pair in [a.modes[i:i + len(cores)] for i in range(0, len(a.modes), len(cores))]:
            running = {}
            for core, mode in zip(cores, pair):
                os.environ["EGRAFT_CACHE_DIR"] = os.path.join(d, f"cache-{mode}")  # a new user's machine
                running[mode] = _child("compile", a, os.path.join(d, mode), [mode], core)
            compiled.update({m: _result(proc) for m, proc in running.items()})
            print(json.dumps(compiled), flush=True)
        os.environ["EGRAFT_CACHE_DIR"] = os.path.join(d, "cache-time")
        timed = (_result(_child("time", a, d, a.modes, a.core if a.core is not None else cores[-1]))
                 if all("error" not in c for c in compiled.values()) else {"error": "a compile failed"})
    finally:
        shutil.rmtree(d, ignore_errors=True)
    doc = {"date": time.strftime("%Y-%m-%d"), "host": host(),
           "command": " ".join(["python3", "bench/quant_modes.py"] + list(argv if argv is not None else sys.argv[1:])),
           "model": a.model, "budget": a.budget, "compile": compiled, "timing": timed}
    print(json.dumps(timed), flush=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
