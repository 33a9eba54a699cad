"""A loaded artifact: checked inputs in, the model's output structure out.

``Artifact`` wraps one backend runner (``jax_loader``, ``torch_loader``,
``triton_loader``): an object with ``run_numpy(list of arrays) -> list`` and
``run_torch(list of tensors) -> list``, taking inputs already checked
against the manifest.  The artifact does the checking once per call, in one
place for every backend (count, then each input's shape and dtype, naming
the input and what it expects), picks the runner path by the kind of inputs
(any torch tensor: torch out; otherwise numpy out) and rebuilds the model's
structure (``outputs.rebuild``).  A runner holds no per-call state, so one
artifact serves concurrent calls from several threads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..ir import dtypes
from . import outputs
from ..ir.tensors import is_tensor, to_torch, torch_module


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
        self._torch_types = None  # made on the first torch call (torch need not be imported before)
        # a runner may offer fast_torch(inputs) -> list | None: the common torch call with every check
        # folded into one signature compare; None sends the call down the checked path, which explains
        self._fast = getattr(runner, "fast_torch", None)
        self._single = self.output_tree.get("type") == "tensor"

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
        if fast is not None and inputs and inputs[0].__class__ is self._tensor_class():
            out = fast(inputs)  # the runner's precomputed path: None when this call is not its common case
            if out is not None:
                return out[0] if self._single else outputs.rebuild(self.output_tree, out)
        return outputs.rebuild(self.output_tree, self.run_flat(*inputs))

    def _tensor_class(self):
        torch = torch_module()
        return torch.Tensor if torch is not None else None

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
        torch = torch_module()
        if self._torch_types is None:
            self._torch_types = tuple(getattr(torch, s.dtype) for s in self.input_specs)
        dev = next(x.device for x in inputs if isinstance(x, torch.Tensor))
        xs = []
        for spec, tdt, x in zip(self.input_specs, self._torch_types, inputs):
            if not isinstance(x, torch.Tensor):
                a = np.asarray(x)
                if a.shape != spec.shape or a.dtype != dtypes.to_numpy(spec.dtype):
                    raise self._mismatch(spec, tuple(a.shape), _dtype_name(a.dtype), "numpy array", ".astype")
                x = to_torch(a, dev)
            elif tuple(x.shape) != spec.shape or x.dtype != tdt:
                raise self._mismatch(spec, tuple(x.shape), str(x.dtype).replace("torch.", ""), "tensor", ".to")
            xs.append(x.detach() if x.requires_grad else x)
        return xs

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
