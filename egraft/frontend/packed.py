"""GPTQ and AWQ layers: their packed integers, zero points and scales as egraft's ``QuantizedLinear``.

Both store a linear layer ``[out N, in K]`` as unsigned ``bits``-wide integers
``q`` packed into int32 words (field ``j`` of a word in bits ``bits*j`` up),
one zero point ``z`` and one scale ``s`` per group of input columns, and
mean the weight ``W[n, k] = s[g, n] * (q[k, n] - z[g, n])`` with ``g`` the
group of column ``k``:

* **GPTQ** (``quant_method: "gptq"``, 4 or 8 bits): ``qweight [K / f, N]``,
  ``f = 32 / bits`` rows of a column packed into a word (row ``f*i + j`` in
  field ``j`` of word ``i``); ``qzeros [G, N / f]`` packed along the output
  columns the same way; ``scales [G, N]``; ``g_idx [K]`` the group of each
  input column (``k // group_size``, or any assignment of ``group_size``
  columns to each group: act-order, ``desc_act``).  The ``"gptq"`` (v1)
  checkpoint format stores ``z - 1``, ``"gptq_v2"`` stores ``z``.  A
  ``group_size`` of -1 is one group.
* **AWQ** (``quant_method: "awq"``, ``version: "gemm"``, 4 bits, zero
  points): ``qweight [K, N / 8]`` and ``qzeros [G, N / 8]`` packed along the
  output columns, each word's eight fields holding columns 0, 2, 4, 6, 1, 3,
  5, 7 of its block of eight; ``scales [G, N]``.

:func:`layer` turns the decoded integers into a QuantizedLinear whose
:meth:`~egraft.frontend.quantize.QuantizedLinear.dequantized` is ``W``
exactly (``s`` widens to float32, and ``s * (q - 2**(bits-1))`` and
``s * (z - 2**(bits-1))`` are exact products whose difference is exact):
4-bit values become egraft's int4 in groups (a group of 256 columns or a
whole row as groups of 128 sharing a scale), 8-bit ones its int8 (one group
per row only), a zero point other than ``2**(bits-1)`` the layer's
``zero_offset`` and an act-order ``g_idx`` its ``perm``.  Anything else is
refused, naming the layer and what it holds.
"""

from __future__ import annotations

import torch

from ..errors import InputError
from .quantize import GROUP_SIZES, QuantizedLinear, pack_int4

AWQ_FIELDS = (0, 4, 1, 5, 2, 6, 3, 7)  # AWQ: column j of a block of eight lies in field AWQ_FIELDS[j] of its word


def unpack(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 `words` -> int32 fields (``bits`` wide, low bits first), each word's fields consecutive along `dim`
    (0: rows, 1: columns).  (An arithmetic shift of a negative word, masked, gives the same low bits.)"""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    w = words.to(torch.int32)
    if dim == 0:
        fields = (w[:, None, :] >> shifts[None, :, None]) & ((1 << bits) - 1)
        return fields.reshape(-1, words.shape[1])
    fields = (w[:, :, None] >> shifts[None, None, :]) & ((1 << bits) - 1)
    return fields.reshape(words.shape[0], -1)


def gptq(name: str, t: dict, bits: int, group_size: int, fmt: str) -> QuantizedLinear:
    """The QuantizedLinear of GPTQ layer `name` from its tensors `t` (``qweight``, ``qzeros``, ``scales``, optional
    ``g_idx`` and ``bias``) in checkpoint format `fmt` (``"gptq"`` or ``"gptq_v2"``)."""
    _need(name, t, ("qweight", "qzeros", "scales"))
    codes = unpack(t["qweight"], bits, 0)  # [K, N]
    zeros = unpack(t["qzeros"], bits, 1)  # [G, N]
    if fmt == "gptq":
        zeros = zeros + 1  # v1 stores z - 1
    k = codes.shape[0]
    g_idx = t.get("g_idx")
    return layer(name, codes.t(), zeros.t(), t["scales"].t(), bits, k if group_size == -1 else group_size,
                 None if g_idx is None else g_idx.to(torch.int64), t.get("bias"), "gptq", _bytes(t))


def awq(name: str, t: dict, group_size: int) -> QuantizedLinear:
    """The QuantizedLinear of AWQ (GEMM) layer `name` from its tensors `t` (``qweight``, ``qzeros``, ``scales``,
    optional ``bias``)."""
    _need(name, t, ("qweight", "qzeros", "scales"))

    def columns(words):
        fields = unpack(words, 4, 1)
        order = torch.arange(fields.shape[1]).reshape(-1, 8)[:, list(AWQ_FIELDS)].reshape(-1)
        return fields[:, order]

    codes = columns(t["qweight"])  # [K, N]
    return layer(name, codes.t(), columns(t["qzeros"]).t(), t["scales"].t(), 4,
                 codes.shape[0] if group_size == -1 else group_size, None, t.get("bias"), "awq", _bytes(t))


def layer(name: str, codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, bits: int, group: int,
          g_idx: torch.Tensor | None, bias: torch.Tensor | None, source: str, source_bytes: int) -> QuantizedLinear:
    """A QuantizedLinear meaning ``W[n, k] = scales[n, g] * (codes[n, k] - zeros[n, g])``, ``g = g_idx[k]`` (default
    ``k // group``): `codes` ``[N, K]`` and `zeros` ``[N, G]`` unsigned `bits`-wide integers, `scales` ``[N, G]``."""
    n, k = codes.shape
    where = f"{source} layer {name!r}"
    if bits not in (4, 8):
        raise InputError(f"{where} holds {bits}-bit values; egraft reads 4-bit and 8-bit {source} layers")
    if group <= 0 or k % group or scales.shape != (n, k // group) or zeros.shape != (n, k // group):
        raise InputError(f"{where}: scales {tuple(scales.shape)} and zero points {tuple(zeros.shape)} do not fit "
                         f"{n} output columns of {k} inputs in groups of {group}; the checkpoint is corrupt or its "
                         "quantization_config does not describe it")
    if bias is not None and bias.shape != (n,):
        raise InputError(f"{where}: bias of shape {tuple(bias.shape)} for {n} output columns")
    in_order = torch.arange(k) // group
    perm = None
    if g_idx is not None and not torch.equal(g_idx, in_order):
        perm = torch.argsort(g_idx, stable=True)
        if g_idx.shape != (k,) or not torch.equal(g_idx[perm], in_order):
            raise InputError(f"{where}: g_idx does not give each of its {k // group} groups {group} input columns; "
                             "the checkpoint is corrupt")
        codes = codes[:, perm]
    mid = 1 << (bits - 1)
    s = scales.to(torch.float32)
    offset = s * (zeros - mid).to(torch.float32)
    offset = offset.contiguous() if bool(torch.any(offset != 0)) else None
    q = (codes - mid).to(torch.int8)
    if bits == 8:
        if k // group != 1:
            raise InputError(f"{where} holds 8-bit values in groups of {group} input columns; egraft's int8 has one "
                             "scale per output row (8-bit GPTQ with group_size=-1), or re-quantise with 4 bits")
        return QuantizedLinear(q.contiguous(), s.reshape(n).contiguous(), bias, 0, offset, perm, source, source_bytes)
    sub = max((g for g in GROUP_SIZES if group % g == 0), default=0)
    if not sub:
        raise InputError(f"{where} holds 4-bit values in groups of {group} input columns; egraft's int4 groups are "
                         f"{', '.join(map(str, GROUP_SIZES))} columns or a multiple of 32")
    scale = s.repeat_interleave(group // sub, dim=1).contiguous()  # a larger group: its sub-groups share its scale
    return QuantizedLinear(pack_int4(q), scale, bias, sub, offset, perm, source, source_bytes)


def _need(name: str, t: dict, keys: tuple[str, ...]) -> None:
    missing = [f"{name}.{key}" for key in keys if key not in t]
    if missing:
        raise InputError(f"the checkpoint has no {', '.join(missing)}: a quantised layer needs "
                         f"{', '.join(keys)}; the checkpoint is incomplete")


def _bytes(t: dict) -> int:
    return sum(v.numel() * v.element_size() for key, v in t.items() if key != "bias")


__all__ = ["AWQ_FIELDS", "awq", "gptq", "layer", "unpack"]
