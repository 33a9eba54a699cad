"""Run a JAX artifact: deserialise its StableHLO, compile it once for the device, call it.

The program (``program.stablehlo``, written by ``egraft.backends.jax.export``)
is ``fn(weights, *inputs)``: the weights are arguments, put on the device
once here.  It is compiled at load, so the first call is as fast as the
others.  Without JAX's x64 mode the program holds int64 values as int32
(``input_program_dtypes`` in the kernel entry): such inputs are
range-checked and narrowed per call, and outputs come back in the dtypes the
manifest records.  A program that needs 64-bit types runs under a local
``jax.enable_x64`` scope, never a global one.

This module imports jax and numpy only (torch when a call brings torch
tensors, which are then already imported).
"""

from __future__ import annotations

import contextlib
import os

import jax
import numpy as np

from ..errors import ArtifactError, InputError
from ..ir import dtypes
from .manifest import read_verified, single_kernel
from ..ir.tensors import to_numpy, to_torch, torch_module

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
PLATFORMS = {"cpu": "cpu", "cuda": "cuda", "tpu": "tpu"}  # egraft device kind -> jax.export platform
JAX_DEVICES = {"cpu": "cpu", "cuda": "gpu", "tpu": "tpu"}  # egraft device kind -> jax.devices() platform


def _entry(manifest: dict) -> dict:
    return single_kernel(manifest, "stablehlo", "JAX")


def files(manifest: dict) -> list[str]:
    """The files this loader reads (and checks) itself."""
    return [_entry(manifest)["file"]]


def x64_scope(x64: bool):
    return jax.enable_x64(True) if x64 else contextlib.nullcontext()


def jax_device(device: str, directory: str):
    kind = device.split(":")[0]
    index = int(device.split(":")[1]) if ":" in device else 0
    try:
        devs = jax.devices(JAX_DEVICES[kind])
    except RuntimeError as e:
        raise ArtifactError(f"JAX has no {kind} device here ({e}); load {directory!r} with device='cpu' "
                            f"or install jax for {kind}") from None
    if index >= len(devs):
        raise ArtifactError(f"device {device!r} does not exist: JAX sees {len(devs)} {kind} device(s)")
    return devs[index]


def load(directory: str, manifest: dict, weights: list[np.ndarray], device: str) -> "JaxRunner":
    entry = _entry(manifest)
    kind = device.split(":")[0]
    platform = PLATFORMS[kind]
    if platform not in entry["platforms"]:
        raise ArtifactError(f"{directory!r} was exported for {entry['platforms']}, not for {platform}; "
                            f"save it again with platforms including {platform!r}")
    blob = read_verified(directory, manifest, entry["file"])
    x64 = bool(entry["x64"])
    path = os.path.join(directory, entry["file"])
    try:
        with x64_scope(x64):
            exported = jax.export.deserialize(blob)
    except Exception as e:
        raise ArtifactError(f"{path} could not be deserialised ({type(e).__name__}: {e}); it was written with "
                            f"jax {manifest['backend_versions'].get('jax')}, this is jax {jax.__version__}: "
                            "rebuild it with `egraft compile`") from None
    return JaxRunner(manifest, entry, exported, weights, jax_device(device, directory), path)


class JaxRunner:
    """The compiled program and its device-resident weights (no per-call state: thread safe)."""

    def __init__(self, manifest: dict, entry: dict, exported, weights: list, dev, path: str):
        self.x64 = bool(entry["x64"])
        self.dev = dev
        self.on_cpu = dev.platform == "cpu"
        self.names = [i["name"] for i in manifest["inputs"]]
        self.in_dtypes = [i["dtype"] for i in manifest["inputs"]]
        self.prog_dtypes = [np.dtype(dtypes.to_numpy(d)) for d in entry["input_program_dtypes"]]
        self.narrow = [dtypes.to_numpy(d) != p for d, p in zip(self.in_dtypes, self.prog_dtypes)]
        self.out_dtypes = [o["dtype"] for o in manifest["outputs"]]
        self.out_np = [dtypes.to_numpy(d) for d in self.out_dtypes]
        with x64_scope(self.x64):
            self.weights = tuple(jax.device_put(w, dev) for w in weights)
            wspecs = tuple(jax.ShapeDtypeStruct(w.shape, w.dtype) for w in self.weights)
            specs = [jax.ShapeDtypeStruct(tuple(i["shape"]), p) for i, p in zip(manifest["inputs"], self.prog_dtypes)]
            try:
                self.compiled = jax.jit(exported.call).lower(wspecs, *specs).compile()
            except Exception as e:
                raise ArtifactError(f"{path} did not compile for {dev} ({type(e).__name__}: {e}); "
                                    "rebuild the artifact with `egraft compile`") from None

        # the fast torch path (fast_torch): CPU program, no x64, no input held narrower, no bfloat16 anywhere
        self._np_sig = tuple((tuple(i["shape"]), np.dtype(dtypes.to_numpy(i["dtype"]))) for i in manifest["inputs"])
        self._plain = (self.on_cpu and not self.x64 and not any(self.narrow)
                       and not any(dtypes.row(d).bits for d in (*self.in_dtypes, *self.out_dtypes)))
        self._run = None  # the compiled call's C++ fast call once the first call made it

    def fast_torch(self, xs) -> list | None:
        """CPU torch tensors in, torch out, with one signature compare; None: take the checked path.

        The tensors cross as zero-copy numpy views (``Tensor.numpy`` refuses
        a tensor that needs grad or lives elsewhere: then None), and each
        output is a fresh writable copy wrapped by torch.
        """
        if not self._plain:
            return None
        try:
            arrs = [x.numpy() for x in xs]
        except (RuntimeError, TypeError, AttributeError):
            return None
        if tuple([(a.shape, a.dtype) for a in arrs]) != self._np_sig:
            return None
        run = self._run
        if run is None:
            outs = self.compiled(self.weights, *arrs)
            self._run = getattr(self.compiled, "_call", None) or self.compiled  # jax-internal; public otherwise
        else:
            outs = run(self.weights, *arrs)
        from_numpy = torch_module().from_numpy
        return [from_numpy(np.array(o) if o.dtype == w else np.asarray(o).astype(w))
                for o, w in zip(outs, self.out_np)]

    def _program_inputs(self, xs: list[np.ndarray]) -> list:
        out = []
        for name, a, narrow, p in zip(self.names, xs, self.narrow, self.prog_dtypes):
            if narrow:  # int64 held as int32
                if a.size and (int(a.min()) < INT32_MIN or int(a.max()) > INT32_MAX):
                    raise InputError(f"input {name!r} holds int64 values outside the int32 range this "
                                     "program computes in")
                a = a.astype(p)
            out.append(a if self.on_cpu else jax.device_put(a, self.dev))
        return out

    def _call(self, xs: list) -> list:
        with x64_scope(self.x64):
            return list(self.compiled(self.weights, *xs))

    def run_numpy(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        outs = self._call(self._program_inputs(xs))
        res = []
        for o, want in zip(outs, self.out_np):
            a = np.asarray(o)
            res.append(a if a.dtype == want else a.astype(want))
        return res

    def run_torch(self, xs: list) -> list:
        """torch in, torch out on the first input's device; CUDA tensors cross to a GPU program by DLPack."""
        torch = torch_module()
        dev = xs[0].device
        if dev.type == "cuda" and self.dev.platform == "gpu" and not any(self.narrow):
            arrs = [jax.device_put(jax.dlpack.from_dlpack(x.contiguous()), self.dev) for x in xs]
            outs = self._call(arrs)
            return [torch.from_dlpack(o).to(getattr(torch, d)) for o, d in zip(outs, self.out_dtypes)]
        res = self.run_numpy([to_numpy(x) for x in xs])
        return [to_torch(a, dev) for a in res]


__all__ = ["JaxRunner", "files", "load"]
