"""Executables kept in a saved CPU artifact, for a host like the one that compiled them.

Compiling a saved program with XLA is most of a first ``egraft.load`` on a
machine: the 135 M Llama shape's five step programs took about 50 s on a
2 GHz AVX2 host, where the same load reading XLA's persistent cache took 13 s.
``save(..., keep_executables=True)`` (CLI ``--keep-executables``) therefore
compiles each of the artifact's JAX CPU programs the way ``egraft.load``
does and keeps the executable beside it (:data:`EXECUTABLE_FILE`,
``jax.experimental.serialize_executable``'s bytes), with a description of
the host that compiled it (:func:`host`: the CPU's model and instruction-set
flags, the machine, jaxlib's and XLA's versions, ``XLA_FLAGS``).
``egraft.load`` uses it only where the loading host's description is the
same, since machine code compiled for one CPU may not run on another;
elsewhere, with ``EGRAFT_LOAD_COMPILED=0``, or when it cannot be read back,
the StableHLO is compiled as before (the runner's ``loaded`` says which, and
why).

The compiles run in a new process (:func:`keep`) with XLA's persistent cache
off: an executable serialised in a process that had read any of the same
program from that cache, or compiled it before, lacks some of its functions
(measured: the copy fails when called, ``NOT_FOUND: Function ... not
found``), so nothing the compiling process made is serialised.  So keeping
costs a save about one cold load's compile time.

The generated CPU products a program calls (``runtime.llvm_kernels``) are
compiled by LLVM at load, before XLA reads the program: about 8 s of the
same model's first load.  Their machine code is kept too
(:data:`OBJECTS_DIR`, one file per kernel, each under the key that names its
IR, the CPU and LLVM's version): ``egraft.load`` offers them to
``llvm_kernels`` (:func:`offer_objects`), which uses one only for a kernel
of the same key, so another host's code is never run.

The files are machine code: like any compiled library, load artifacts you
trust.  Their hashes are checked against the manifest, as every file's is.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import subprocess
import sys

from ..env import flag
from ..errors import ArtifactError

EXECUTABLE_FILE = "program.xla"
OBJECTS_DIR = "objects"  # the generated CPU products' machine code, <kernel name>.o
ENV_VAR = "EGRAFT_LOAD_COMPILED"  # "0": never use a kept executable


def host() -> dict | None:
    """This host as far as XLA's CPU code depends on it; None where it cannot be told (no /proc/cpuinfo): an
    executable is then neither kept nor used."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = {}
            for ln in f:
                if not ln.strip():
                    break  # the first processor's block
                k, _, v = ln.partition(":")
                fields[k.strip()] = v.strip()
    except OSError:
        return None
    flags = fields.get("flags") or fields.get("Features")
    if not flags:
        return None
    import jax

    from .manifest import library_version

    return {"machine": platform.machine(), "cpu": fields.get("model name", ""),
            "flags": hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16],
            "jaxlib": library_version("jaxlib") or jax.__version__,
            "xla": jax.devices("cpu")[0].client.platform_version, "xla_flags": os.environ.get("XLA_FLAGS", "")}


def read(directory: str, manifest: dict, entry: dict, in_tree, out_tree):
    """``(compiled, why)``: the kept executable when this host is the one it was compiled on (why: ``"kept"``), else
    ``(None, the reason)``."""
    if not flag(ENV_VAR, True):
        return None, f"{ENV_VAR}=0"
    here, there = host() or {}, entry.get("host") or {}
    if not here or here != there:
        differ = sorted(k for k in set(here) | set(there) if here.get(k) != there.get(k))
        return None, f"compiled on another host (its {', '.join(differ) or 'description'} differ)"
    from jax.experimental import serialize_executable

    from .manifest import read_verified

    blob = read_verified(directory, manifest, entry["file"])
    try:
        return serialize_executable.deserialize_and_load(bytes(blob), in_tree, out_tree), "kept"
    except Exception as e:  # noqa: BLE001 - what cannot be read back is compiled, as without it
        return None, f"not read back ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"


def offer_objects(directory: str, manifest: dict, entry: dict) -> int:
    """Offer the kernels' machine code kept with the program to ``llvm_kernels`` (used only for a kernel of the same
    key: this CPU, the same IR and LLVM); the number offered.  Nothing with ``EGRAFT_LOAD_COMPILED=0``."""
    kept = (entry.get("executable") or {}).get("objects") or ()
    if not flag(ENV_VAR, True) or not kept:
        return 0
    from . import llvm_kernels
    from .manifest import read_verified

    for obj in kept:
        llvm_kernels.offer(str(obj["key"]), bytes(read_verified(directory, manifest, obj["file"])))
    return len(kept)


def _keep_objects(directory: str, entry: dict) -> list[dict]:
    """Write the machine code of the kernels the program calls (compiled by this process's load) beside it."""
    from . import llvm_kernels

    out = []
    for d in entry.get("cpu_kernels", ()):
        spec = llvm_kernels.KernelSpec.from_json(d)
        key, obj = llvm_kernels.object_code(spec)
        rel = f"{OBJECTS_DIR}/{spec.name}.o"
        os.makedirs(os.path.join(directory, OBJECTS_DIR), exist_ok=True)
        with open(os.path.join(directory, rel), "wb") as f:
            f.write(obj)
        out.append({"file": rel, "key": key})
    return out


def keep(path: str) -> dict:
    """Compile the JAX CPU programs saved at `path` (an artifact, a saved generation, or a directory of artifacts)
    in a new process, as ``egraft.load`` would, and keep each executable in its artifact (the module docstring).
    Returns ``{artifact directory: what was done}``; ArtifactError if the process fails."""
    env = {**os.environ, "EGRAFT_XLA_CACHE": "0", "JAX_ENABLE_COMPILATION_CACHE": "false", ENV_VAR: "0"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-m", "egraft.runtime.bundled", os.path.abspath(path)],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise ArtifactError(f"keeping the executables of {path!r} failed (the artifact itself is saved and loads "
                            f"by compiling): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _artifacts(path: str) -> list[str]:
    from .manifest import MANIFEST_FILE, is_generation

    if is_generation(path) or os.path.isfile(os.path.join(path, MANIFEST_FILE)):
        return [path]
    return sorted(os.path.join(path, d) for d in os.listdir(path)
                  if os.path.isfile(os.path.join(path, d, MANIFEST_FILE)) or is_generation(os.path.join(path, d)))


def _keep_here(path: str) -> dict:
    """In the new process: load each artifact under `path` (compiling its programs afresh) and write what XLA
    compiled into each JAX CPU program's directory, its manifest entry and file hashes updated."""
    from jax.experimental import serialize_executable

    from . import load
    from .manifest import write_manifest

    here, done = host(), {}
    for art_dir in _artifacts(path):
        art = load(art_dir)
        programs = list(art.steps.values()) if hasattr(art, "steps") else [art]
        for prog in programs:
            d, m = prog.directory, copy.deepcopy(prog.manifest)  # checked by the load
            compiled = getattr(getattr(prog, "runner", None), "compiled", None)
            if here is None or m["target"].get("backend") != "jax" or m["target"].get("device") != "cpu" \
                    or compiled is None:
                done[d] = "not kept (only a JAX program for the CPU, on a host egraft can describe)"
                continue
            blob, _, _ = serialize_executable.serialize(compiled)
            with open(os.path.join(d, EXECUTABLE_FILE), "wb") as f:
                f.write(blob)
            objects = _keep_objects(d, m["kernels"][0])
            m["kernels"][0]["executable"] = {"file": EXECUTABLE_FILE, "host": here,
                                             **({"objects": objects} if objects else {})}
            write_manifest(d, {k: v for k, v in m.items() if k != "files"})
            done[d] = f"kept ({len(blob) / 2 ** 20:.1f} MiB" + (f", {len(objects)} kernels" if objects else "") + ")"
    return done


if __name__ == "__main__":
    print(json.dumps(_keep_here(sys.argv[1])))


__all__ = ["ENV_VAR", "EXECUTABLE_FILE", "OBJECTS_DIR", "host", "keep", "offer_objects", "read"]
