"""Models quantised by another library: the layers egraft reads as its own, and a clear error for the others.

``egraft.compile`` calls :func:`adopt` on every model before any tracing.

**Read as they are (torchao).**  A ``torch.nn.Linear`` whose weight is one of
torchao's weight-only tensors, symmetric (no zero point, or zero points all
0) and with no activation quantisation, becomes egraft's own
``frontend.quantize.QuantizedLinear`` holding the same integers and scales:

* ``Int8Tensor`` (``quantize_(model, Int8WeightOnlyConfig())``) and
  ``IntxUnpackedToInt8Tensor`` (``IntxWeightOnlyConfig(weight_dtype=torch.int8
  or a narrower int, granularity=PerAxis(0))``) with one scale per output
  row: int8 per output channel, the int8 values shared with the model (not
  copied);
* ``IntxUnpackedToInt8Tensor`` with values in -8..7 (``weight_dtype=
  torch.int4`` or narrower) and groups of 32, 64 or 128 input columns
  (``granularity=PerGroup(g)``): int4 in groups, the values (one a byte in
  torchao) packed two a byte in egraft's layout.

The adopted layer computes with ``q * s`` in float32, the weight's
dequantised values (a bfloat16 scale widens exactly).  torchao's own eager
forward of a bfloat16 model rounds the dequantised weight to bfloat16 before
its product, so its outputs differ from the adopted model's by that rounding;
of a float32 model they are the same function.  The adopted model (the
compiled model's ``cm.model``) is the reference every compiled program is
validated against, as for ``quantize=``.

**Refused, naming the layer and what to do.**  torchao tensors in another form
(int8 in groups, activation quantisation, zero points, packed int4 layouts,
float8) and layers or tensors of other quantisers (GPTQ, AWQ, bitsandbytes,
quanto, HQQ, ...): their layouts are not egraft's, and tracing one would fail
deep in the lowering or compile its dequantisation as opaque integer
arithmetic.  A GPTQ or AWQ *checkpoint* is read without its library:
``egraft.from_pretrained(path)`` (``frontend.pretrained``) builds the model
with egraft's own layers, which :func:`adopt` then reports as they are.
"""

from __future__ import annotations

import copy

import torch

from ..errors import InputError
from .quantize import GROUP_SIZES, QuantizedLinear, pack_int4, scheme

# Layers and tensors of other quantisers: their packed layouts are not egraft's (module path fragments, class names)
FOREIGN_MODULES = ("gptq", "awq", "bitsandbytes", "torchao", "quanto", "hqq", "exllama", "marlin", "compressed_tensors")
FOREIGN_CLASSES = frozenset({"QuantLinear", "WQLinear_GEMM", "WQLinear_GEMV", "WQLinear_Exllama", "WQLinear_ExllamaV2",
                             "WQLinear_Marlin", "Linear8bitLt", "Linear4bit", "Params4bit", "Int8Params",
                             "AffineQuantizedTensor", "LinearActivationQuantizedTensor", "QLinear", "QTensor"})
TORCHAO_WEIGHTS = ("Int8Tensor", "IntxUnpackedToInt8Tensor")  # the torchao tensor classes :func:`adopt` reads
WHAT_TO_DO = ("compile the float model with quantize='int8' or quantize='int4' (egraft quantises it itself), "
              "quantise it with torchao's Int8WeightOnlyConfig() or IntxWeightOnlyConfig(weight_dtype=torch.int4, "
              "granularity=PerGroup(32 | 64 | 128)), or load a GPTQ / AWQ checkpoint directory with "
              "egraft.from_pretrained(path) (docs/compile.md)")


def _foreign(obj) -> str | None:
    """``module.Class`` of `obj` when its class comes from a quantisation library, else None."""
    cls = type(obj)
    if cls.__module__.split(".")[0] in ("torch", "egraft"):  # (torch's and egraft's own classes)
        return None
    low = cls.__module__.lower()
    if any(f in low for f in FOREIGN_MODULES) or cls.__name__ in FOREIGN_CLASSES:
        return f"{cls.__module__}.{cls.__qualname__}"
    return None


def _torchao_form(name: str, w) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(q, s, group)`` for the QuantizedLinear of layer `name` whose weight `w` is a torchao tensor (module
    docstring): ``q`` int8 ``[out, in]`` (int4 values packed two a byte), ``s`` float32, ``group`` 0 for one scale
    per row.  InputError naming the layer and the form when it is one egraft does not read."""
    cls = type(w).__name__
    where = f"layer {name!r} has a torchao {cls} weight"

    def refuse(why: str):
        return InputError(f"{where} {why}; egraft reads torchao's weight-only symmetric int8 (one scale per output "
                          f"row) and int4 (groups of {', '.join(map(str, GROUP_SIZES))}) weights: {WHAT_TO_DO}")

    if cls not in TORCHAO_WEIGHTS:
        raise refuse("(a layout egraft does not read)")
    q, scale, zero = w.qdata, w.scale, getattr(w, "zero_point", None)
    if getattr(w, "act_quant_kwargs", None) is not None or getattr(w, "activation_quantization", None) is not None:
        raise refuse("that quantises the activations too (lossy: not the weight-only function egraft compiles)")
    if q.dtype != torch.int8 or q.ndim != 2:
        raise refuse(f"holding {q.dtype} values of shape {tuple(q.shape)} (egraft reads a 2-D int8 tensor)")
    if zero is not None and bool(torch.any(zero != 0)):
        raise refuse("with zero points (asymmetric); egraft's quantised weights are symmetric")
    n, k = q.shape
    block = tuple(w.block_size)
    if block == (1, k):  # one scale per row: int8 holds any of torchao's 1..8-bit values as they are
        return q.contiguous(), scale.detach().to(torch.float32).reshape(n).contiguous(), 0
    group = block[1]
    if block[0] != 1 or group not in GROUP_SIZES or k % group:
        raise refuse(f"in blocks of {block}; egraft reads one scale per row, or groups of "
                     f"{', '.join(map(str, GROUP_SIZES))} input columns holding int4 values")
    if bool(torch.any(q < -8)) or bool(torch.any(q > 7)):
        raise refuse(f"in blocks of {block} holding values outside -8..7 (egraft's groups hold int4 values; its "
                     "int8 has one scale per output row)")
    return pack_int4(q), scale.detach().to(torch.float32).reshape(n, k // group).contiguous(), group


def adopt(model: torch.nn.Module) -> tuple[torch.nn.Module, dict | None]:
    """`model` and None when no layer of it is quantised; a copy of its module tree with each torchao
    weight-only linear layer as a QuantizedLinear and what was adopted (module docstring) when some are; `model`
    and what its layers hold when it has egraft's QuantizedLinear layers already (``egraft.from_pretrained`` of a
    GPTQ or AWQ checkpoint).  InputError naming the first layer or tensor quantised in a form egraft does not
    read."""
    adopted, own = [], []
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if type(m) is torch.nn.Linear and type(w).__module__.startswith("torchao"):
            adopted.append((name, _torchao_form(name, w)))
            continue
        if isinstance(m, QuantizedLinear):
            own.append(m)
            continue
        found = _foreign(m)
        tensors = [] if found else [(f"{name}.{n}" if name else n, t) for n, t in
                                    list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False))]
        for tname, t in tensors:
            if t is not None and _foreign(t):
                name, found = tname, _foreign(t)
                break
        if found:
            raise InputError(f"{name or type(model).__name__!r} is {found}: weights quantised by another library, "
                             f"in a layout egraft does not read; {WHAT_TO_DO}")
    if not adopted:
        return model, (report(own) if own else None)
    keep = {id(t): t for t in list(model.parameters()) + list(model.buffers())}  # shared, not copied
    out = copy.deepcopy(model, memo=dict(keep))
    layers = []
    for name, (q, s, group) in adopted:
        layer = out.get_submodule(name)
        w = layer.weight
        parent, _, child = name.rpartition(".")
        new = QuantizedLinear(q, s, layer.bias, group, source="torchao", source_bytes=sum(
            t.numel() * t.element_size() for t in (w.qdata, w.scale, getattr(w, "zero_point", None)) if t is not None))
        setattr(out.get_submodule(parent) if parent else out, child, new)
        layers.append(new)
    return out.eval(), report(layers + own)


def report(layers: list[QuantizedLinear]) -> dict:
    """What a model's quantised layers hold: the mode(s), the scheme in words, where the integers came from, the
    int4 group size when there is one, how many layers, and their weights' bytes in the source's form and in
    egraft's."""
    groups = sorted({(m.group_size, m.zero_offset is not None) for m in layers})
    int4 = sorted({g for g, _ in groups if g})
    mode = " and ".join((["int8"] if any(not g for g, _ in groups) else []) + (["int4"] if int4 else []))
    after = sum(sum(t.numel() * t.element_size() for t in m.buffers() if t is not None and t is not m.bias)
                for m in layers)
    before = sum(m.source_bytes or 0 for m in layers) or after
    words = "; ".join(scheme(g, z) for g, z in groups) + ("; input columns permuted (act-order)"
                                                         if any(m.perm is not None for m in layers) else "")
    return {"mode": mode, "scheme": words, "source": ", ".join(sorted({m.source for m in layers})),
            **({"group_size": int4[0]} if len(int4) == 1 else {}), "layers": len(layers),
            "weight_bytes_before": before, "weight_bytes_after": after}


__all__ = ["FOREIGN_CLASSES", "FOREIGN_MODULES", "TORCHAO_WEIGHTS", "adopt", "report"]
