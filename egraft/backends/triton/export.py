"""The Triton artifact writer: each generated kernel's source, a launch plan, and PTX where it compiles.

A Triton executable is a sequence of generated ``@triton.jit`` kernels over
buffers (the model's inputs, the weights, tensor constants and each kernel's
output).  The artifact stores:

* ``kernels/<name>.py``: each kernel's source, as generated (readable; the
  runtime imports it and Triton's JIT compiles it on the loading machine, or
  runs it in the interpreter on CPU);
* in the manifest, per kernel: its name, source file, grid, ``constexprs``,
  ``num_warps`` / ``num_stages``, the buffers it reads (in argument order)
  and the buffer it writes; and under ``launch``, every buffer (kind, shape,
  dtype, and for weights and constants their name in ``weights.safetensors``)
  and which buffers are the outputs.  That is everything the launcher needs,
  so loading runs no egraft compiler code;
* ``ptx/<name>.sm_<arch>.ptx`` for each arch in ``ptx_archs`` (default
  ``ptx.ARCHS``) that ``triton.compile`` cross-compiles, for inspection and
  for launchers outside Python; a kernel that fails to compile is recorded
  (``ptx_failures``), not fatal, since the source is what the runtime runs.
  Under ``TRITON_INTERPRET=1`` the PTX is compiled in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import numpy as np

from ...errors import BackendError
from ...ir import Op, dtypes
from ...runtime.manifest import library_version
from . import interpreter_active, ptx

KERNEL_DIR = "kernels"
PTX_DIR = "ptx"


def _buffers(ex) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Every buffer a launch touches, and the stored arrays (weights, then tensor constants) by name."""
    g = ex.main
    stored: dict[str, np.ndarray] = {}
    bufs = []
    made = {k.root for k in ex.kernels}
    for i, n in enumerate(g.nodes):
        entry = {"id": i, "shape": list(n.shape), "dtype": n.dtype}
        if n.op == Op.Input and i in g.weight_ids:
            name = n.attrs["name"]
            stored[name] = np.asarray(g.weights[name])
            bufs.append({**entry, "kind": "weight", "name": name})
        elif n.op == Op.Input:
            bufs.append({**entry, "kind": "input", "index": g.input_ids.index(i)})
        elif n.op == Op.Constant and n.shape != ():
            name = f"__constant_{i}"
            stored[name] = np.asarray(n.attrs["value"].array).astype(dtypes.to_numpy(n.dtype))
            bufs.append({**entry, "kind": "constant", "name": name})
        elif i in made:
            bufs.append({**entry, "kind": "kernel"})
    return bufs, stored


def _compile_ptx(kernels: list, archs, directory: str) -> list[str]:
    """Write ``ptx/<name>.sm_<arch>.ptx`` for each kernel and arch; returns the failures."""
    jobs = [{"path": k.path, "name": k.name, "signature": k.signature, "constexprs": k.constexprs,
             "num_warps": k.num_warps, "num_stages": k.num_stages} for k in kernels]
    out_dir = os.path.join(directory, PTX_DIR)
    os.makedirs(out_dir, exist_ok=True)
    if not interpreter_active():
        return _compile_jobs(jobs, archs, out_dir)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"kernels": jobs, "archs": list(archs), "out": out_dir}, f)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        p = subprocess.run([sys.executable, "-m", "egraft.backends.triton.export", f.name], env=env,
                           capture_output=True, text=True, timeout=1800)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        return [f"PTX compiler process failed (rc={p.returncode}): {p.stderr[-2000:]}"]
    return json.loads(p.stdout.strip().splitlines()[-1])["failures"]


def _compile_jobs(jobs: list[dict], archs, out_dir: str) -> list[str]:
    failures = []
    for job in jobs:
        for arch in archs:
            try:
                text = ptx.compile_to_ptx(SimpleNamespace(**job), int(arch))
            except Exception as e:  # recorded in the manifest; the source is what runs
                failures.append(f"{job['name']} sm_{arch}: {type(e).__name__}: {str(e)[:500]}")
                continue
            with open(os.path.join(out_dir, f"{job['name']}.sm_{arch}.ptx"), "w") as f:
                f.write(text)
    return failures


def write(ex, directory: str, *, ptx_archs=None):
    """Write the kernels (and PTX) of `ex` (a TritonExecutable) into `directory`; see the module docstring."""
    from ..artifact import WrittenProgram

    archs = tuple(ptx.ARCHS if ptx_archs is None else ptx_archs)
    os.makedirs(os.path.join(directory, KERNEL_DIR))
    bufs, stored = _buffers(ex)
    known = {b["id"] for b in bufs}
    entries = []
    for k in ex.kernels:
        missing = [i for i in k.inputs if i not in known]
        if missing:
            raise BackendError(f"internal: kernel {k.name} reads nodes {missing} that no buffer holds")
        rel = f"{KERNEL_DIR}/{k.name}.py"
        with open(os.path.join(directory, rel), "w") as f:
            f.write(k.source)
        entries.append({"kind": "triton", "name": k.name, "file": rel, "grid": [int(k.grid)],
                        "constexprs": dict(k.constexprs), "num_warps": int(k.num_warps),
                        "num_stages": int(k.num_stages), "reads": [int(i) for i in k.inputs], "writes": int(k.root),
                        "signature": k.signature, "covers": [int(i) for i in k.covers]})
    failures = _compile_ptx(ex.kernels, archs, directory) if archs and ex.kernels else []
    ptx_dir = os.path.join(directory, PTX_DIR)
    if os.path.isdir(ptx_dir) and not os.listdir(ptx_dir):
        os.rmdir(ptx_dir)
    g = ex.main
    unheld = [o for o in g.outputs if o not in known]
    if unheld:
        raise BackendError(f"output node %{unheld[0]} ({g.nodes[unheld[0]].op}) is held by no buffer; "
                           "save this program with backend='jax' or 'torch'")
    leaves = [o for o in g.outputs if g.nodes[o].op in (Op.Input, Op.Constant)]
    fields = {
        "target": {"device": ex.device, "backend": "triton"},
        "backend_versions": {"triton": library_version("triton") or "unknown"},
        "kernels": entries,
        "launch": {"buffers": bufs, "outputs": [int(o) for o in g.outputs], "copied_outputs": leaves,
                   "ptx_archs": [int(a) for a in archs], "ptx_failures": failures},
    }
    return WrittenProgram(stored, fields)


def main(argv=None):
    """Subprocess entry: compile the kernels of a job file to PTX (triton imported without the interpreter)."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        job = json.load(f)
    print(json.dumps({"failures": _compile_jobs(job["kernels"], job["archs"], job["out"])}))


if __name__ == "__main__":
    main()
