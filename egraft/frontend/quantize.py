"""Weight-only quantisation: a model's linear layers with int8 weights, as a model egraft traces.

``egraft.compile(model, ..., quantize="int8")`` compiles :func:`quantize` of
the model, never the model itself (which is left as it was).  Each
``nn.Linear`` (and transformers' ``Conv1D``, GPT-2's linear layer with its
weight stored ``[in, out]``) becomes a :class:`QuantizedLinear`: the weight
``W [out, in]`` as int8 values ``q = round(W / s)`` in -127..127 with one
float32 scale per output channel, ``s[n] = max_k |W[n, k]| / 127``
(symmetric: no zero point).  The weight's dtype does not matter (a bfloat16
weight is quantised from its own values).

**What the compiled model equals.**  The quantised model is the model with
each weight replaced by its dequantised values ``q * s`` (float32).  Its
layer computes ``(x @ q.T) * s + bias`` in float32: the same function as
``x @ (q * s).T + bias`` (the scale is constant along the sum over ``k``),
to float32 rounding, and the form a backend can run reading ``q`` itself, a
quarter of float32's bytes (a bfloat16 or float16 model's input is widened
first and the output rounded back to its dtype once, as those models' own
products accumulate in float32).  Every program egraft compiles from it is
validated against it like any other model.  A model that writes the
dequantised weight out (``x @ (q * s).T``, as other quantisers' layers do)
gets the same form from the e-graph: ``rewrites.rules.reductions``'
``sum-factor-inner`` moves a per-output-channel scale out of the product's
sum (and never a per-input-channel one).  Running the returned module
eagerly in PyTorch is the quantised model, the reference a user compares
the compiled model's tokens against (:meth:`QuantizedLinear.dequantized`
gives the weight for a plain ``nn.Linear``).

The layers a model has that are neither (embedding tables, norms) keep their
weights; a tied output layer is quantised while the input embedding it
shares a table with keeps the float table (a decode step reads one row of
it).  :func:`quantize` copies the module tree, not the weights it keeps: the
copy's other parameters are the model's own tensors.
"""

from __future__ import annotations

import copy

import torch

from ..errors import InputError

MODES = ("int8",)  # what `quantize=` takes
QMAX = 127  # int8 values are -QMAX..QMAX (symmetric; -128 unused)


class QuantizedLinear(torch.nn.Module):
    """``y = (x @ q.T) * s + bias`` in float32 (``x @ (q * s[:, None]).T + bias`` to rounding), ``q`` int8
    ``[out, in]``, ``s`` float32 ``[out]``."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).clone())

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``q * s[:, None]`` this layer computes with."""
        return self.qweight.to(torch.float32) * self.scale[:, None]

    def forward(self, x):
        y = torch.nn.functional.linear(x.to(torch.float32), self.qweight.to(torch.float32)) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per output channel"


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)``: symmetric int8 values of an ``[out, in]`` weight and one float32 scale per output row
    (a row of zeros gets scale 1 and zeros)."""
    w = weight.detach().to(torch.float32)
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[:, None]), -QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def _linear_weight(m: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """An ``[out, in]`` weight and bias when `m` is a linear layer this module quantises."""
    if type(m) is torch.nn.Linear:
        return m.weight, m.bias
    if type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers"):  # GPT-2: [in, out]
        return m.weight.t(), m.bias
    return None


def check_mode(mode) -> str | None:
    """`mode` if `quantize=` takes it (None: no quantisation); InputError naming the modes otherwise."""
    if mode is None or mode in MODES:
        return mode
    raise InputError(f"quantize={mode!r} is not a quantisation egraft knows; it takes {', '.join(map(repr, MODES))} "
                     "(weight-only, symmetric per output channel) or None")


def quantize(model: torch.nn.Module, mode: str) -> tuple[torch.nn.Module, dict]:
    """A copy of `model` whose linear layers hold `mode` weights (module docstring), and what was done: layers
    quantised, bytes of their weights before and after."""
    check_mode(mode)
    keep = {id(t): t for t in list(model.parameters()) + list(model.buffers())}  # shared, not copied
    out = copy.deepcopy(model, memo=dict(keep))
    layers, before, after = 0, 0, 0
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            found = _linear_weight(child)
            if found is None:
                continue
            w, b = found
            q, s = int8_per_channel(w)
            setattr(parent, name, QuantizedLinear(q, s, b))
            layers += 1
            before += w.numel() * w.element_size()
            after += q.numel() + s.numel() * 4
    if not layers:
        raise InputError(f"quantize={mode!r}: {type(model).__name__} has no nn.Linear (or transformers Conv1D) "
                         "layer to quantise")
    return out.eval(), {"mode": mode, "scheme": "symmetric int8, one float32 scale per output channel",
                        "layers": layers, "weight_bytes_before": before, "weight_bytes_after": after}


__all__ = ["MODES", "QMAX", "QuantizedLinear", "check_mode", "int8_per_channel", "quantize"]
