"""Load a JAX artifact: deserialise its StableHLO, compile it once for the device, hand it to a ``JaxRunner``.

The program (``program.stablehlo``, written by ``egraft.backends.jax.export``)
is ``fn(weights, *inputs)``: the weights are arguments, put on the device
once here.  It is compiled at load, so the first call is as fast as the
others.  Without JAX's x64 mode the program holds int64 values as int32
(``input_program_dtypes`` in the kernel entry): such inputs are
range-checked and narrowed per call, a half-type state (a bfloat16 cache) is
held as its bits (``int16``), and outputs come back in the dtypes the
manifest records.  Calls go through :class:`~egraft.runtime.jax_runner.JaxRunner`,
the same runner (fast path included) the JAX backend's executable uses.

This module imports jax and numpy only (and llvmlite, for a program that calls a generated CPU product).
"""

from __future__ import annotations

import os

import jax
import numpy as np

from ..errors import ArtifactError, BackendError
from . import bundled, llvm_kernels
from .device import parse
from .jax_runner import JaxRunner, jax_device, program_dtype_of, specs_on, x64_scope
from .manifest import read_verified, single_kernel
from .xla_cache import enable_xla_cache

PLATFORMS = {"cpu": "cpu", "cuda": "cuda", "tpu": "tpu"}  # egraft device kind -> jax.export platform


def _entry(manifest: dict) -> dict:
    return single_kernel(manifest, "stablehlo", "JAX")


def files(manifest: dict) -> list[str]:
    """The files this loader reads (and checks) itself: the program (an executable kept with it is checked by
    ``egraft.load`` whether or not this host uses it, and again when read)."""
    return [_entry(manifest)["file"]]


def _register_kernels(directory: str, entry: dict) -> None:
    """The generated CPU products the program calls, compiled and registered with XLA before it compiles."""
    specs = entry.get("cpu_kernels", ())
    if specs and not llvm_kernels.available():
        raise ArtifactError(f"{directory!r} calls egraft's generated CPU products, which need llvmlite and jax's FFI "
                            "(pip install llvmlite; EGRAFT_LLVM_KERNELS=0 turns them off): install it, or compile "
                            "the model again here")
    for d in specs:
        try:
            llvm_kernels.ensure(llvm_kernels.KernelSpec.from_json(d))
        except (KeyError, TypeError, ValueError, BackendError) as e:
            raise ArtifactError(f"{directory!r}: its manifest's cpu_kernels entry {d!r} is not a kernel this egraft "
                                f"makes ({type(e).__name__}: {e}); rebuild the artifact with `egraft compile`") from None


def load(directory: str, manifest: dict, weights: list[np.ndarray], device: str) -> JaxRunner:
    """The artifact's program compiled for `device`, as the JAX backend's runner (the executable's call path)."""
    entry = _entry(manifest)
    kind = parse(device, ArtifactError).kind
    platform = PLATFORMS[kind]
    if platform not in entry["platforms"]:
        raise ArtifactError(f"{directory!r} was exported for {entry['platforms']}, not for {platform}; "
                            f"save it again with platforms including {platform!r}")
    blob = read_verified(directory, manifest, entry["file"])
    if kind == "cpu":
        bundled.offer_objects(directory, manifest, entry)  # the kernels' machine code, kept at save (if any)
    _register_kernels(directory, entry)
    enable_xla_cache()  # a program compiled once on this machine is read back next time (runtime.xla_cache)
    x64 = bool(entry["x64"])
    path = os.path.join(directory, entry["file"])
    try:
        with x64_scope(x64):
            exported = jax.export.deserialize(blob)
    except Exception as e:
        raise ArtifactError(f"{path} could not be deserialised ({type(e).__name__}: {e}); it was written with "
                            f"jax {manifest['backend_versions'].get('jax')}, this is jax {jax.__version__}: "
                            "rebuild it with `egraft compile`") from None
    dev = jax_device(device, ArtifactError, f"load {directory!r} with")
    prog_dtypes = [program_dtype_of(d) for d in entry["input_program_dtypes"]]
    with x64_scope(x64):
        ws = tuple(jax.device_put(list(weights), dev))  # one call for all: one per weight took 0.07 s a program
        wspecs = tuple(specs_on(dev, [(w.shape, w.dtype) for w in ws]))
        specs = specs_on(dev, [(i["shape"], p) for i, p in zip(manifest["inputs"], prog_dtypes)])
        # state inputs (role "state", after the others) are donated, as the backend's executable does: the
        # new cache is written into the old one's buffer and comes back a jax array (backends.base.Executable)
        states = tuple(k + 1 for k, i in enumerate(manifest["inputs"]) if i.get("role") == "state")
        compiled, how = None, "no executable kept"
        if entry.get("executable") and kind == "cpu":  # the program as XLA compiled it on the host that saved it
            tree = jax.tree_util.tree_structure(((wspecs, *specs), {}))
            compiled, how = bundled.read(directory, manifest, entry["executable"], tree, exported.out_tree)
        if compiled is None:
            try:
                compiled = jax.jit(exported.call, donate_argnums=states).lower(wspecs, *specs).compile()
            except Exception as e:
                raise ArtifactError(f"{path} did not compile for {dev} ({type(e).__name__}: {e}); "
                                    "rebuild the artifact with `egraft compile`") from None
    inputs = [(i["name"], tuple(i["shape"]), i["dtype"]) for i in manifest["inputs"]]
    aliased = tuple(sorted(int(a["output"]) for a in manifest.get("aliases", ())))
    runner = JaxRunner(compiled, ws, inputs, prog_dtypes, [o["dtype"] for o in manifest["outputs"]], dev, x64,
                       state_outputs=aliased)
    # the host arrays are kept: XLA aliases an aligned read-only array's memory on the CPU but not the array,
    # and a derived weight (runtime.derived) is shared with the other programs only while one holds it
    runner.host = tuple(weights)
    runner.loaded = ("the executable kept in the artifact" if how == "kept"
                     else f"compiled here ({how})")  # runtime.bundled
    return runner


__all__ = ["files", "load"]
