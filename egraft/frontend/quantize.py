"""Weight-only quantisation: a model's linear layers with int8 or int4 weights, as a model egraft traces.

``egraft.compile(model, ..., quantize="int8" | "int4")`` compiles :func:`quantize`
of the model, never the model itself (which is left as it was).  Each
``nn.Linear`` (and transformers' ``Conv1D``, GPT-2's linear layer with its
weight stored ``[in, out]``) becomes a :class:`QuantizedLinear`.  The
weight's dtype does not matter (a bfloat16 weight is quantised from its own
values).  Both modes are symmetric (no zero point):

* ``"int8"``: ``W [out, in]`` as int8 values ``q = round(W / s)`` in
  -127..127 with one float32 scale per output channel,
  ``s[n] = max_k |W[n, k]| / 127``.
* ``"int4"``: group-wise, ``group_size`` (32, 64 or 128; default 128)
  consecutive input columns of a row share one float32 scale
  ``s[n, g] = max |W[n, group g]| / 7``, the values ``q`` in -8..7, two to a
  byte in blocks of 32 columns (``qweight [out, in / 2]`` int8: byte ``j``
  of a block's 16 holds its column ``j`` in bits 0-3 and column ``16 + j``
  in bits 4-7, two's complement; the layout llama.cpp's Q4_0 uses, so a
  block's 16 bytes widen to 32 values in two vectors without a shuffle).
  The layer unpacks them with :func:`unpack_int4` (the custom op
  ``egraft::unpack_int4``, which egraft traces into the IR's ``Nibble``).

* ``"w8a8"`` (lossy, opt-in): the weights as ``"int8"``, and each row of a
  layer's input rounded to int8 too, one scale per row (per token):
  ``sx = max(max_k |x[k]|, AMIN) / 127``, ``xq = trunc(v + 0.5 sign v)`` with
  ``v = x * (127 / max(..))`` (round half away from zero, in -127..127),
  ``y = (xq @ q.T) * sx * s + bias``: the product of two int8 operands, an
  integer dot product (as llama.cpp's Q8_0 computes), but a different
  function from the model with dequantised weights (the activations' rounding
  error adds to the weights').  Its programs are validated against it
  within a stated lossy bound, not float rounding (``measure.tolerances``),
  and its quality against the float model is measured, never assumed.

**What the compiled model equals.**  The quantised model is the model with
each weight replaced by its dequantised values (float32: ``q * s`` per
channel, ``q * s[n, k // group_size]`` per group).  An int8 layer computes
``(x @ q.T) * s + bias`` in float32: the same function as
``x @ (q * s).T + bias`` (the scale is constant along the sum over ``k``),
to float32 rounding, and the form a backend can run reading ``q`` itself, a
quarter of float32's bytes.  An int4 layer computes ``x @ W.T + bias`` with
``W`` its dequantised weight, written out (a group's scale is not constant
along the whole sum; a backend that reads the packed values applies it per
group).  A bfloat16 or float16 model's input is widened first and the output
rounded back to its dtype once, as those models' own products accumulate in
float32.  Every program egraft compiles from it is validated against it like
any other model.  A model that writes an int8 layer's dequantised weight out
(``x @ (q * s).T``, as other quantisers' layers do) gets the same form from
the e-graph: ``rewrites.rules.reductions``' ``sum-factor-inner`` moves a
per-output-channel scale out of the product's sum (and never a
per-input-channel one).  Running the returned module eagerly in PyTorch is
the quantised model, the reference a user compares the compiled model's
tokens against (:meth:`QuantizedLinear.dequantized` gives the weight for a
plain ``nn.Linear``).

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

MODES = ("int8", "int4", "w8a8")  # what `quantize=` takes
LOSSY = ("w8a8",)  # modes that also quantise activations: not the model with dequantised weights (lossy)
GROUP_SIZES = (32, 64, 128)  # what `group_size=` takes (int4)
DEFAULT_GROUP_SIZE = 128
QMAX = 127  # int8 values are -QMAX..QMAX (symmetric; -128 unused)
AMIN = 1e-12  # (w8a8) a row's largest magnitude is taken as at least this (a row of zeros quantises to zeros)
QMAX4 = 7  # int4 scales map a group's largest magnitude to 7 (values -8..7; -8 only by rounding, never)


BLOCK = 32  # int4 columns packed together: 16 bytes, low fields first


@torch.library.custom_op("egraft::unpack_int4", mutates_args=())
def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """``[..., m]`` int8 bytes (16 divides m) -> ``[..., 2m]`` int8 values -8..7: in each block of 16 bytes, bits
    0-3 of each byte, then bits 4-7 of each."""
    wide = packed.to(torch.int32).reshape(*packed.shape[:-1], -1, 1, BLOCK // 2)
    low, high = (wide << 28) >> 28, (wide << 24) >> 28
    return torch.cat((low, high), dim=-2).reshape(*packed.shape[:-1], 2 * packed.shape[-1]).to(torch.int8)


@unpack_int4.register_fake
def _(packed):
    return packed.new_empty((*packed.shape[:-1], 2 * packed.shape[-1]))


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int values -8..7 ``[..., 2m]`` (32 divides 2m) -> ``[..., m]`` int8 bytes, the inverse of :func:`unpack_int4`."""
    q = q.to(torch.int32).reshape(*q.shape[:-1], -1, 2, BLOCK // 2)
    low, high = q[..., 0, :], q[..., 1, :]
    byte = ((low & 15) | ((high & 15) << 4)).reshape(*q.shape[:-3], -1)
    return torch.where(byte > 127, byte - 256, byte).to(torch.int8).contiguous()


class QuantizedLinear(torch.nn.Module):
    """A linear layer with quantised weights (the module docstring's two modes).

    int8: ``y = (x @ q.T) * s + bias`` in float32, ``q`` int8 ``[out, in]``, ``s`` float32 ``[out]``.
    int4: ``y = x @ W.T + bias`` in float32, ``W`` the weight dequantised from ``qweight`` (int8 ``[out, in / 2]``,
    two values a byte) and ``s`` (float32 ``[out, in / group_size]``).

    Two optional parts read checkpoints quantised elsewhere (``frontend.packed``):

    * ``zero_offset`` (float32 ``[out, G]``, the ``in`` columns in ``G`` equal groups): an asymmetric weight
      ``s * (q - z)`` is ``s * q - s * z``; the layer holds ``s * z`` and subtracts ``sums @ zero_offset.T``,
      ``sums`` the input's sums over each group of columns (a ``[rows, G]`` product, not a weight-sized one).
    * ``perm`` (int64 ``[in]``): the layer's input columns in the order its groups are stored (GPTQ's act-order);
      the layer reads ``x[..., perm]``.

    ``source`` names where the integers came from (``"egraft"``, ``"torchao"``, ``"gptq"``, ``"awq"``).
    ``activations="int8"`` (int8 weights only; the lossy ``"w8a8"`` mode): each row of the input is rounded to int8
    first (:func:`quantize_rows`) and the layer computes ``(xq @ q.T) * sx * s + bias``."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, group_size: int = 0,
                 zero_offset: torch.Tensor | None = None, perm: torch.Tensor | None = None, source: str = "egraft",
                 source_bytes: int | None = None, activations: str | None = None):
        super().__init__()
        if activations not in (None, "int8") or (activations and group_size):
            raise ValueError(f"activations={activations!r}: only int8 activations with int8 weights (one scale "
                             "per output channel) are supported")
        self.activations = activations
        self.group_size = group_size  # 0: int8, one scale per output channel
        self.source = source
        self.source_bytes = source_bytes  # the integers' and scales' bytes in the source's own form (None: these)
        self.out_features = q.shape[0]
        self.in_features = q.shape[1] * (2 if group_size else 1)
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).clone())
        if zero_offset is not None and (zero_offset.ndim != 2 or zero_offset.shape[0] != self.out_features
                                        or self.in_features % zero_offset.shape[1]):
            raise ValueError(f"zero_offset of shape {tuple(zero_offset.shape)} does not fit a [{self.out_features}, "
                             f"{self.in_features}] weight")
        self.register_buffer("zero_offset", zero_offset)
        self.register_buffer("perm", perm)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` this layer computes with (in its input's own column order)."""
        w = self._symmetric()
        if self.zero_offset is not None:
            w = w - self.zero_offset.repeat_interleave(self.in_features // self.zero_offset.shape[1], dim=1)
        if self.perm is not None:
            w = w[:, torch.argsort(self.perm)]
        return w

    def _symmetric(self) -> torch.Tensor:
        """``q * s`` in stored column order (without the zero offset and the permutation)."""
        n, g = self.out_features, self.group_size
        if not g:
            return self.qweight.to(torch.float32) * self.scale[:, None]
        values = unpack_int4(self.qweight).to(torch.float32).reshape(n, -1, g)
        return (values * self.scale[:, :, None]).reshape(n, self.in_features)

    def forward(self, x):
        x32 = x.to(torch.float32)
        if self.perm is not None:
            x32 = x32.index_select(-1, self.perm)
        if self.group_size:
            y = torch.nn.functional.linear(x32, self._symmetric())
        elif self.activations:
            xq, sx = quantize_rows(x32)
            y = torch.nn.functional.linear(xq.to(torch.float32), self.qweight.to(torch.float32)) * sx * self.scale
        else:
            y = torch.nn.functional.linear(x32, self.qweight.to(torch.float32)) * self.scale
        if self.zero_offset is not None:
            sums = x32.reshape(*x32.shape[:-1], self.zero_offset.shape[1], -1).sum(-1)
            y = y - torch.nn.functional.linear(sums, self.zero_offset)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        how = f"int4, groups of {self.group_size}" if self.group_size else "int8 per output channel"
        how += ", int8 activations per row (lossy)" if self.activations else ""
        extra = (", zero points" if self.zero_offset is not None else "") + (", act-order" if self.perm is not None
                                                                             else "")
        return f"in_features={self.in_features}, out_features={self.out_features}, {how}{extra}"


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xq, sx)``: each row (last axis) of float32 `x` as int8 values -127..127 and its float32 scale
    ``sx = max(max |row|, AMIN) / 127`` (``x ~ xq * sx``), rounded half away from zero (the module docstring)."""
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=AMIN)
    v = x * (QMAX / amax)
    return torch.where(v < 0, v - 0.5, v + 0.5).to(torch.int8), amax / QMAX


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)``: symmetric int8 values of an ``[out, in]`` weight and one float32 scale per output row
    (a row of zeros gets scale 1 and zeros)."""
    w = weight.detach().to(torch.float32)
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[:, None]), -QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def int4_per_group(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed, s)``: symmetric int4 values of an ``[out, in]`` weight, two to a byte (:func:`pack_int4`), and
    one float32 scale per `group_size` consecutive columns of a row (a group of zeros gets scale 1)."""
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    groups = w.reshape(n, k // group_size, group_size)
    amax = groups.abs().amax(dim=2)
    scale = torch.where(amax > 0, amax / QMAX4, torch.ones_like(amax))
    q = torch.clamp(torch.round(groups / scale[:, :, None]), -8, QMAX4).reshape(n, k)
    return pack_int4(q), scale.contiguous()


def _linear_weight(m: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """An ``[out, in]`` weight and bias when `m` is a linear layer this module quantises."""
    if type(m) is torch.nn.Linear:
        return m.weight, m.bias
    if type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers"):  # GPT-2: [in, out]
        return m.weight.t(), m.bias
    return None


def check_mode(mode, group_size=None) -> str | None:
    """`mode` if `quantize=` takes it (None: no quantisation) with this `group_size` (int4 only; None: the
    default); InputError naming what it takes otherwise."""
    if mode is not None and mode not in MODES:
        raise InputError(f"quantize={mode!r} is not a quantisation egraft knows; it takes "
                         f"{', '.join(map(repr, MODES))} (weight-only: int8 per output channel, int4 in groups of "
                         "group_size input columns; w8a8: int8 weights and int8 activations per row, lossy) or None")
    if group_size is not None:
        if mode != "int4":
            raise InputError(f"group_size={group_size!r} is for quantize='int4' (int8 has one scale per output "
                             f"channel); got quantize={mode!r}")
        if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
            raise InputError(f"group_size={group_size!r}: int4 groups of {', '.join(map(str, GROUP_SIZES))} input "
                             "columns are supported")
    return mode


def quantize(model: torch.nn.Module, mode: str, group_size: int | None = None) -> tuple[torch.nn.Module, dict]:
    """A copy of `model` whose linear layers hold `mode` weights (module docstring), and what was done: layers
    quantised, bytes of their weights before and after.  A layer whose input width `group_size` does not
    divide: InputError naming it and the group sizes that divide every layer (the model is untouched)."""
    check_mode(mode, group_size)
    group = (group_size or DEFAULT_GROUP_SIZE) if mode == "int4" else 0
    acts = "int8" if mode == "w8a8" else None
    if group:
        _check_groups(model, group)
    keep = {id(t): t for t in list(model.parameters()) + list(model.buffers())}  # shared, not copied
    out = copy.deepcopy(model, memo=dict(keep))
    layers, before, after = 0, 0, 0
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            found = _linear_weight(child)
            if found is None:
                continue
            w, b = found
            q, s = int4_per_group(w, group) if group else int8_per_channel(w)
            setattr(parent, name, QuantizedLinear(q, s, b, group, activations=acts))
            layers += 1
            before += w.numel() * w.element_size()
            after += q.numel() + s.numel() * 4
    if not layers:
        already = any(isinstance(m, QuantizedLinear) for m in model.modules())
        raise InputError(f"quantize={mode!r}: {type(model).__name__} has no nn.Linear (or transformers Conv1D) "
                         "layer to quantise" + ("; it is quantised already (compile it with quantize=None)"
                                                if already else ""))
    return out.eval(), {"mode": mode, "scheme": scheme(group, activations=acts),
                        **({"group_size": group} if group else {}), **({"lossy": True} if acts else {}),
                        "layers": layers, "weight_bytes_before": before, "weight_bytes_after": after}


def scheme(group: int, zeros: bool = False, activations: str | None = None) -> str:
    """The quantisation report's words for a layer with int4 groups of `group` columns (0: int8 per channel),
    with zero points when `zeros`, and int8 `activations` (lossy w8a8)."""
    kind = "asymmetric (zero points)" if zeros else "symmetric"
    acts = "; activations rounded to int8 per row, one scale each (lossy)" if activations else ""
    return (f"{kind} int4, one float32 scale per {group} input columns of a row, two values a byte" if group
            else f"{kind} int8, one float32 scale per output channel{acts}")


def _check_groups(model: torch.nn.Module, group: int) -> None:
    """InputError when `group` does not divide some linear layer's input width (naming it, and the group sizes
    that divide every one)."""
    widths = {name: found[0].shape[1] for name, m in model.named_modules()
              if (found := _linear_weight(m)) is not None}
    bad = [(name, k) for name, k in widths.items() if k % group]
    if bad:
        fits = [g for g in GROUP_SIZES if all(k % g == 0 for k in widths.values())]
        raise InputError(f"group_size={group} does not divide the input width {bad[0][1]} of layer {bad[0][0]!r}"
                         f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}; "
                         + (f"group_size={fits[-1]} divides every layer's input width" if fits else
                            f"no group size of {GROUP_SIZES} divides every layer's input width: use quantize='int8'"))


__all__ = ["AMIN", "BLOCK", "DEFAULT_GROUP_SIZE", "GROUP_SIZES", "LOSSY", "MODES", "QMAX", "QMAX4", "QuantizedLinear",
           "check_mode", "int4_per_group", "int8_per_channel", "pack_int4", "quantize", "quantize_rows", "scheme",
           "unpack_int4"]
