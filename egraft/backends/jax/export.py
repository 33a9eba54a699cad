"""The JAX artifact writer: the executable's program as StableHLO, for cpu / cuda / tpu.

``write`` (called by ``egraft.backends.artifact.save_artifact``) serialises
``fn(weights, *inputs)`` with ``jax.export`` into ``program.stablehlo`` and
returns the weights the program takes (folded values included, in the
dtypes the program holds them) with the manifest's JAX fields.  The program
takes the weights as arguments whatever the executable's ``weights`` knob, so
one serialised program fits any weight values and stays small.  Lowering for
a platform needs no device of that kind, so a CPU-only machine writes
artifacts for GPUs and TPUs.

Platforms: by default the executable's own platform first, then the other
two; if lowering for all three fails (an op without a lowering on one of
them), the artifact is written for the executable's own platform only, and
the manifest's ``platforms`` says so.  Naming ``platforms`` makes a failure
an error instead.  Loading is the runtime's job (``egraft.runtime.jax_loader``).
"""

from __future__ import annotations

import os
from typing import Sequence

import jax

from ...errors import BackendError
from ...runtime.jax_runner import program_dtype_name
from ...runtime.manifest import library_version
from ..base import device_kind
from .function import x64_scope

PROGRAM_FILE = "program.stablehlo"
DEFAULT_PLATFORMS = ("cpu", "cuda", "tpu")
_PLATFORM = {"cpu": "cpu", "cuda": "cuda", "tpu": "tpu"}  # egraft device kind -> jax.export platform


def _serialise(ex, platforms: list[str]) -> bytes:
    prog = ex.program
    with x64_scope(prog.x64):
        host = prog.host_weights()
        wspecs = tuple(jax.ShapeDtypeStruct(w.shape, w.dtype) for w in host)
        specs = [jax.ShapeDtypeStruct(s, d) for s, d in ex._in_types]
        # egraft's generated CPU products are custom calls jax.export does not know: the loader registers them
        # from the manifest's ``cpu_kernels`` before it compiles the program (runtime.llvm_kernels)
        checks = [jax.export.DisabledSafetyCheck.custom_call(k.name) for k in prog.kernels]
        exported = jax.export.export(jax.jit(prog.fn), platforms=platforms, disabled_checks=checks)(wspecs, *specs)
        return exported.serialize()


def _tries(ex, platforms: Sequence[str] | None) -> list[list[str]]:
    own = _PLATFORM[device_kind(ex.device)]
    kernels = bool(ex.program.kernels)
    if platforms is not None:
        bad = [p for p in platforms if p not in DEFAULT_PLATFORMS]
        if bad or not platforms:
            raise BackendError(f"cannot export for platform(s) {bad or list(platforms)}; "
                               f"choose from {', '.join(DEFAULT_PLATFORMS)}")
        if kernels and list(platforms) != ["cpu"]:
            raise BackendError(f"this program calls egraft's generated CPU products, so it runs on the CPU only, not "
                               f"on {[p for p in platforms if p != 'cpu']}: save it with platforms=['cpu'], or compile "
                               "for that device (a search there picks its own kernels)")
        return [list(dict.fromkeys(platforms))]
    if kernels:  # the generated products are CPU code: a program calling them is a CPU program
        return [[own]]
    return [[own] + [p for p in DEFAULT_PLATFORMS if p != own], [own]]


def serialise(ex, platforms: Sequence[str] | None = None) -> tuple[bytes, list[str]]:
    """`ex`'s program serialised with ``jax.export`` for `platforms` (None: the defaults in the module docstring),
    and the platforms it was written for."""
    errors = []
    for plats in _tries(ex, platforms):
        try:
            return _serialise(ex, plats), plats
        except Exception as e:  # a lowering missing on some platform: try the next list
            errors.append(f"{plats}: {type(e).__name__}: {e}")
    raise BackendError("jax.export failed: " + "; ".join(errors))


def write(ex, directory: str, *, platforms: Sequence[str] | None = None):
    """Write ``program.stablehlo`` for `ex` (a JaxExecutable) into `directory`; see the module docstring."""
    from ..artifact import WrittenProgram

    made = getattr(ex, "exported", None)  # the serialised program the executable itself compiled, if it did
    if made is not None and (platforms is None or _tries(ex, platforms) == [made[1]]):
        blob, plats = made
    else:
        blob, plats = serialise(ex, platforms)
    with open(os.path.join(directory, PROGRAM_FILE), "wb") as f:
        f.write(blob)
    prog = ex.program
    with x64_scope(prog.x64):
        host = prog.host_weights()
    kernel = {
        "kind": "stablehlo",
        "file": PROGRAM_FILE,
        "platforms": plats,
        "x64": prog.x64,
        "calling_convention": "fn(weights, *inputs) -> tuple of outputs (weights in the manifest's order)",
        "input_program_dtypes": [program_dtype_name(d) for _, d in ex._in_types],
    }
    if prog.kernels:
        kernel["cpu_kernels"] = [k.to_json() for k in prog.kernels]
    fields = {
        "target": {"device": ex.device, "backend": "jax", "platforms": plats},
        "backend_versions": {"jax": library_version("jax") or jax.__version__,
                             "jaxlib": library_version("jaxlib") or jax.__version__},
        "kernels": [kernel],
    }
    return WrittenProgram(dict(zip(prog.weight_names, host)), fields)


def export_executable(ex, directory: str, platforms: Sequence[str] | None = None, meta: dict | None = None) -> str:
    """Save `ex` as an artifact for `platforms` (``save_artifact`` with this backend's option); returns the path."""
    from ..artifact import save_artifact

    return save_artifact(ex, directory, meta=meta, platforms=platforms)


__all__ = ["DEFAULT_PLATFORMS", "PROGRAM_FILE", "export_executable", "serialise", "write"]
