"""Artifacts on a device: each backend's program compiled for it, saved, and loaded by a fresh process there.

For every backend that runs on the device (``--backends``, default jax,
torch, triton) and every workload (``--models``, ``egraft.models`` at the
tiny size):

1. ``egraft.compile(model, device=..., backend=..., budget=...)`` and its
   outputs against eager PyTorch on the device;
2. ``CompiledModel.save(dir)``;
3. a fresh Python process ``egraft.load(dir, device=...)`` runs the same
   inputs and writes its outputs, compared here with the compiled model's
   (the same program: they must agree to float tolerance).

One JSON row per (backend, workload), with the error and traceback of a step
that fails (the rest still run), written after each row.

    python3 bench/gpu_artifacts.py [--device cuda] [--backends jax torch triton] [--models mlp llama_block]
                                   [--budget 3s] [--out gpu_artifacts.json]

Without a GPU, ``--device cpu --backends jax torch`` runs the same steps on the CPU (a check of this script).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

LOAD = r"""
import sys, time, torch, egraft
d, dev = sys.argv[1], sys.argv[2]
args = [a.to(dev) for a in torch.load(d + "/inputs.pt")]
t0 = time.perf_counter()
art = egraft.load(d + "/artifact", device=dev)
load_s = time.perf_counter() - t0
out = art(*args)
out = out if isinstance(out, (tuple, list)) else (out,)
torch.save([o.detach().cpu() for o in out], d + "/loaded.pt")
print("LOAD_S", load_s, "DEVICE", out[0].device)
"""


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-3000:]}


def _outputs(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def one(name: str, backend: str, device: str, budget: str) -> dict:
    import torch

    import egraft
    from egraft.models import MODELS
    from egraft.testing import rel_err

    row: dict = {"model": name, "backend": backend, "device": device}
    spec = MODELS[name]
    model = spec.build("tiny", seed=0).to(device).eval()
    args = [a.to(device) for a in spec.example_inputs(model, seed=0, size="tiny")]
    with torch.no_grad():
        want = _outputs(model(*args))
    try:
        t0 = time.perf_counter()
        cm = egraft.compile(model, device=device, example_inputs=tuple(args), backend=backend, budget=budget,
                            progress=False)
        row["compile_s"] = round(time.perf_counter() - t0, 2)
        with torch.no_grad():
            got = _outputs(cm(*args))
        row["output_device"] = str(got[0].device)
        row["rel_err_vs_eager"] = max(rel_err(g.float().cpu().numpy(), w.float().cpu().numpy())
                                      for g, w in zip(got, want))
    except Exception as e:  # noqa: BLE001 (reported, and the next row runs)
        row["compile"] = _error(e)
        return row
    with tempfile.TemporaryDirectory(prefix="egraft-art-") as tmp:
        try:
            cm.save(os.path.join(tmp, "artifact"))
            torch.save([a.cpu() for a in args], os.path.join(tmp, "inputs.pt"))
            env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
            p = subprocess.run([sys.executable, "-c", LOAD, tmp, device], capture_output=True, text=True,
                               env=env, timeout=600)
            if p.returncode != 0:
                row["load"] = {"error": p.stderr[-3000:]}
                return row
            row["load_line"] = p.stdout.strip().splitlines()[-1]
            loaded = torch.load(os.path.join(tmp, "loaded.pt"))
            row["rel_err_loaded_vs_compiled"] = max(rel_err(x.float().numpy(), g.float().cpu().numpy())
                                                    for x, g in zip(loaded, got))
        except Exception as e:  # noqa: BLE001
            row["save_load"] = _error(e)
    row["ok"] = row.get("rel_err_vs_eager", 1.0) <= 1e-3 and row.get("rel_err_loaded_vs_compiled", 1.0) <= 1e-5
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--backends", nargs="*", default=["jax", "torch", "triton"])
    p.add_argument("--models", nargs="*", default=["mlp", "llama_block"])
    p.add_argument("--budget", default="3s")
    p.add_argument("--out", default="gpu_artifacts.json")
    a = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    rows = []
    for backend in a.backends:
        for name in a.models:
            rows.append(one(name, backend, a.device, a.budget))
            with open(a.out, "w") as f:
                json.dump(rows, f, indent=1, default=str)
            print(json.dumps(rows[-1], default=str)[:1500], flush=True)
    bad = [f"{r['backend']}/{r['model']}" for r in rows if not r.get("ok")]
    print(f"gpu_artifacts: {len(rows) - len(bad)} of {len(rows)} rows ok" + (f"; failed: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
