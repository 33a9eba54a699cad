"""A loaded artifact: checked inputs in, the model's output structure out.

``Artifact`` wraps one backend runner (``jax_runner``, ``torch_runner``,
``triton_runner``: the same runner the backend's executable calls through):
an object with ``run_numpy(list of arrays) -> list`` and
``run_torch(list of tensors) -> list``, taking inputs already checked
against the manifest, and ``fast(inputs) -> list | None``, the runner's
precomputed common call (None: not its case).  The artifact tries ``fast``
first; otherwise it does the checking, in one place for every backend
(count, then each input's shape and dtype, naming the input and what it
expects), picks the runner path by the kind of inputs (any torch tensor:
torch out; otherwise numpy out).  Either way it rebuilds the model's
structure (``outputs.rebuild``).  A runner holds no per-call state, so one
artifact serves concurrent calls from several threads.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..ir import dtypes
from . import outputs
from ..ir.tensors import is_tensor, torch_dtype, torch_module
from .checked import checked_tensors, torch_signature


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name (inputs), shape and IR dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{list(self.shape)}:{self.dtype}"


class Artifact:
    """A saved egraft program, loaded for one device (see :func:`egraft.runtime.load`)."""

    def __init__(self, directory: str, manifest: dict, device: str, runner: Any):
        self.directory = os.fspath(directory)
        self.manifest = manifest
        self.device = device
        self.runner = runner
        self.input_specs = tuple(TensorSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in manifest["inputs"])
        self.output_specs = tuple(TensorSpec(f"output{k}", tuple(o["shape"]), o["dtype"])
                                  for k, o in enumerate(manifest["outputs"]))
        self.output_tree = manifest["output_tree"]
        self._np_types = tuple((s.shape, dtypes.to_numpy(s.dtype)) for s in self.input_specs)
        self._torch_sig = None  # made on the first torch call (torch need not be imported before)
        # the runner's fast(inputs) -> list | None: the common call with every check folded into one
        # signature compare; None sends the call down the checked path, which explains
        self._fast = getattr(runner, "fast", None)
        self._rebuild = functools.partial(outputs.rebuild, self.output_tree)

    @property
    def backend(self) -> str:
        return self.manifest["target"]["backend"]

    @property
    def name(self) -> str:
        return str(self.manifest.get("model") or "artifact")

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s}" for s in self.input_specs)
        return f"<egraft Artifact {self.name!r} ({self.backend} on {self.device}) ({ins}) from {self.directory!r}>"

    # -- calling ------------------------------------------------------------------------------
    def __call__(self, *inputs):
        """The model's outputs for `inputs`: numpy arrays in, numpy out; any torch tensor in, torch out."""
        fast = self._fast
        if fast is not None:
            out = fast(inputs)  # the runner's precomputed path: None when this call is not its common case
            if out is not None:
                return self._rebuild(out)
        return self._rebuild(self.run_flat(*inputs))

    def run_flat(self, *inputs) -> list:
        """The program's outputs as a flat list (the order of ``manifest["outputs"]``)."""
        if len(inputs) != len(self.input_specs):
            names = ", ".join(s.name for s in self.input_specs)
            raise InputError(f"{self.name} takes {len(self.input_specs)} input(s) ({names}), got {len(inputs)}")
        if any(is_tensor(x) for x in inputs):
            return self.runner.run_torch(self._torch_inputs(inputs))
        return self.runner.run_numpy(self._numpy_inputs(inputs))

    def _numpy_inputs(self, inputs) -> list[np.ndarray]:
        xs = []
        for spec, (shape, dt), x in zip(self.input_specs, self._np_types, inputs):
            a = x if isinstance(x, np.ndarray) else np.asarray(x)
            if a.shape != shape or a.dtype != dt:
                raise self._mismatch(spec, tuple(a.shape), _dtype_name(a.dtype), "numpy array", ".astype")
            xs.append(a)
        return xs

    def _torch_inputs(self, inputs) -> list:
        if self._torch_sig is None:
            self._torch_sig = torch_signature((s.shape, s.dtype) for s in self.input_specs)
        return checked_tensors(inputs, self._torch_sig, lambda: self._explain(inputs))

    def _explain(self, inputs) -> None:
        """Raise the InputError naming the first input whose shape or dtype does not fit (count checked before)."""
        torch = torch_module()
        for spec, x in zip(self.input_specs, inputs):
            if isinstance(x, torch.Tensor):
                if tuple(x.shape) != spec.shape or x.dtype != torch_dtype(spec.dtype):
                    raise self._mismatch(spec, tuple(x.shape), str(x.dtype).replace("torch.", ""), "tensor", ".to")
                continue
            a = np.asarray(x)
            if a.shape != spec.shape or a.dtype != dtypes.to_numpy(spec.dtype):
                raise self._mismatch(spec, tuple(a.shape), _dtype_name(a.dtype), "numpy array", ".astype")

    def _mismatch(self, spec: TensorSpec, shape, dt: str, kind: str, convert: str) -> InputError:
        if shape != spec.shape:
            why = (f"the artifact was compiled for shape {list(spec.shape)} only; compile it again for "
                   f"this shape (egraft compiles one program per input shape)")
        else:
            why = f"convert it with {convert}({'torch.' if convert == '.to' else ''}{spec.dtype})"
        return InputError(f"{self.name}: input {spec.name!r} is a {kind} of shape {list(shape)} and dtype {dt}; "
                          f"expected shape {list(spec.shape)} and dtype {spec.dtype}: {why}")

    # -- torch integration ----------------------------------------------------------------------
    def register_op(self, name: str | None = None):
        """This artifact as a torch custom op ``torch.ops.egraft.<name>`` (see :mod:`.custom_op`)."""
        from .custom_op import register

        return register(self, name)


def _dtype_name(dt) -> str:
    try:
        return dtypes.from_numpy(dt)
    except Exception:  # a dtype the IR lacks (uint8, complex): its numpy name
        return np.dtype(dt).name


__all__ = ["Artifact", "TensorSpec"]
