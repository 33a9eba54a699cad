"""Cross-compile generated kernels to PTX / cubin without a GPU.

``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32))``
runs the whole GPU pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin) with no
driver, so a kernel the interpreter accepts but a GPU would reject (tl.dot
tile minimums, non-power-of-two ranges, register limits) fails here.

That needs triton imported *without* TRITON_INTERPRET (the interpreter
replaces triton's own library functions); in an interpreter process use
``compile_in_subprocess``, which runs ``python -m egraft.backends.triton.ptx``
on a manifest of kernels.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

from ...errors import BackendError

ARCHS = (90, 80)


def _load_jit(path: str, name: str):
    spec = importlib.util.spec_from_file_location(f"egraft_ptx_{hashlib.sha1(path.encode()).hexdigest()[:12]}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def _compile(path, name, signature, constexprs, num_warps, num_stages, arch) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _load_jit(path, name)
    src = ASTSource(fn, dict(signature), dict(constexprs))
    k = triton.compile(src, target=GPUTarget("cuda", int(arch), 32),
                       options={"num_warps": int(num_warps), "num_stages": int(num_stages)})
    return k.asm["ptx"]


def compile_to_ptx(kernel, arch: int = 90) -> str:
    """PTX for one generated kernel (a KernelSpec) on sm_<arch>; needs a non-interpreter process."""
    from . import interpreter_active

    if interpreter_active():
        raise BackendError("triton was imported with TRITON_INTERPRET=1, which cannot compile for a GPU; "
                           "use egraft.backends.triton.ptx.compile_in_subprocess")
    return _compile(kernel.path, kernel.name, kernel.signature, kernel.constexprs, kernel.num_warps,
                    kernel.num_stages, arch)


def manifest(kernels) -> list[dict]:
    """One entry per distinct (source, constexprs, launch options)."""
    seen, out = set(), []
    for k in kernels:
        entry = {"path": k.path, "name": k.name, "signature": k.signature, "constexprs": k.constexprs,
                 "num_warps": k.num_warps, "num_stages": k.num_stages}
        key = (hashlib.sha256(k.source.encode()).hexdigest(), json.dumps(entry["constexprs"], sort_keys=True),
               k.num_warps, k.num_stages)
        if key not in seen:
            seen.add(key)
            out.append(entry)
    return out


def _job(args):
    entry, arch = args
    try:
        ptx = _compile(entry["path"], entry["name"], entry["signature"], entry["constexprs"],
                       entry["num_warps"], entry["num_stages"], arch)
        return None if ".entry" in ptx else f"{entry['name']} sm_{arch}: no .entry in PTX"
    except Exception as e:  # report every failure, not just the first
        return f"{entry['name']} ({entry['path']}) sm_{arch}: {type(e).__name__}: {str(e)[:2000]}"


def compile_in_subprocess(kernels, archs=ARCHS, jobs: int | None = None, timeout: float = 1800) -> list[str]:
    """Compile every kernel for every arch in a fresh non-interpreter process; returns failure messages."""
    entries = manifest(kernels)
    if not entries:
        return []
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"kernels": entries, "archs": list(archs), "jobs": jobs or os.cpu_count() or 1}, f)
        path = f.name
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        p = subprocess.run([sys.executable, "-m", "egraft.backends.triton.ptx", path], env=env,
                           capture_output=True, text=True, timeout=timeout)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        return [f"PTX compiler process failed (rc={p.returncode}):\n{p.stderr[-4000:]}"]
    return json.loads(p.stdout.strip().splitlines()[-1])["failures"]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        m = json.load(f)
    work = [(e, a) for e in m["kernels"] for a in m["archs"]]
    jobs = max(1, int(m.get("jobs", 1)))
    if jobs == 1 or len(work) < 4:
        res = [_job(w) for w in work]
    else:
        with ProcessPoolExecutor(jobs) as ex:
            res = list(ex.map(_job, work))
    print(json.dumps({"compiled": len(work), "failures": [r for r in res if r]}))


if __name__ == "__main__":
    main()
