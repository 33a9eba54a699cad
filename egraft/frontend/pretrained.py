"""A causal LM from a Hugging Face checkpoint directory, its GPTQ or AWQ layers read as egraft's own.

``egraft.from_pretrained(path)`` (and ``egraft compile DIR``) reads
``config.json`` and the ``*.safetensors`` beside it.  A checkpoint whose
config has a ``quantization_config`` of GPTQ (4 or 8 bits, checkpoint
format ``gptq`` or ``gptq_v2``) or AWQ (``version: "gemm"``, 4 bits, zero
points) is built without that library: transformers builds the model from
the config with its weights left uninitialised, the float tensors
(embeddings, norms, unquantised layers) are loaded into it, and each layer
the checkpoint holds as ``qweight``/``qzeros``/``scales`` becomes a
``QuantizedLinear`` (``frontend.packed``: the same integers, the function
the checkpoint's dequantised weights compute).  Any other tensor that does not
fit the model, a missing one, or another quantisation method is an
InputError naming it.  A checkpoint without ``quantization_config`` is
loaded by transformers' own ``from_pretrained``.

A float16 checkpoint's float tensors become float32 unless `dtype` says
otherwise (egraft compiles float32 and bfloat16 models; float16 widens to
float32 exactly).  Model loading needs ``transformers`` and ``safetensors``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from ..errors import InputError
from . import packed

METHODS = ("gptq", "awq")  # the quantization_config quant_method values read
GPTQ_FORMATS = ("gptq", "gptq_v2")
PARTS = ("qweight", "qzeros", "scales", "g_idx", "bias")  # a quantised layer's tensors


def from_pretrained(path: str, dtype: torch.dtype | None = None, progress: bool | None = None) -> torch.nn.Module:
    """The causal LM in checkpoint directory `path`, in eval mode (module docstring).  `progress`: a line per
    stage of a quantised checkpoint's load on stderr (None: when stderr is a terminal)."""
    say = _stages(progress)
    try:
        return _load(path, dtype, say)
    finally:
        say(None)  # ends an open stage's line, also when the load fails


def _load(path: str, dtype: torch.dtype | None, say) -> torch.nn.Module:
    try:
        import transformers
    except ImportError:
        raise InputError("egraft.from_pretrained builds the model with transformers, which is not installed: "
                         "pip install 'transformers>=5'") from None

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise InputError(f"{path} has no config.json: give a Hugging Face checkpoint directory")
    with open(cfg_path) as f:
        qc = json.load(f).get("quantization_config")
    if qc is None:
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto").eval()
    read = _reader(qc, path)
    config = transformers.AutoConfig.from_pretrained(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    if dtype is None:
        dtype = config.dtype if config.dtype in (torch.float32, torch.bfloat16) else torch.float32
    say("reading the safetensors files")
    tensors = _tensors(path)
    names = sorted(k[: -len(".qweight")] for k in tensors if k.endswith(".qweight"))
    if not names:
        raise InputError(f"{path}: its config says {qc.get('quant_method')} but no tensor is a quantised layer's "
                         "(NAME.qweight); the checkpoint does not match its config")
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # (where transformers keeps it in modeling_utils)
        from transformers.modeling_utils import no_init_weights

    say(f"building the model from config.json ({sum(t.numel() * t.element_size() for t in tensors.values()) / 1e9:.2f}"
        " GB read)")
    with no_init_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    say(f"decoding {len(names)} {qc['quant_method']} layers")
    for name in names:
        parts = {p: tensors.pop(f"{name}.{p}") for p in PARTS if f"{name}.{p}" in tensors}
        _replace(model, name, read(name, parts), path)
    say("loading the float tensors")
    floats = {}
    for k in list(tensors):  # one tensor converted at a time, its stored form let go; the model takes the result
        v = tensors.pop(k)
        floats[k] = v.to(dtype) if v.is_floating_point() else v
    missing, unexpected = model.load_state_dict(floats, strict=False, assign=True)
    model.tie_weights()  # a tied output layer shares the embedding table just loaded
    if unexpected:
        raise InputError(f"{path}: tensor {unexpected[0]!r}{_more(unexpected)} is not in the model its config.json "
                         f"builds ({type(model).__name__})")
    loaded = {t.data_ptr() for k, t in model.state_dict().items() if k in floats}
    quantised = tuple(f"{name}." for name in names)  # (their buffers were read above)
    missing = [k for k in missing if not k.startswith(quantised)
               and model.state_dict()[k].data_ptr() not in loaded]  # one tied to a loaded tensor: fine
    if missing:
        raise InputError(f"{path}: the checkpoint has no tensor {missing[0]!r}{_more(missing)}; it is incomplete")
    return model.eval()


def _stages(progress: bool | None):
    """``say(stage)``: when on, ends the previous stage's line with its seconds and starts `stage`'s (None: the
    last); on when `progress` is True, or None and stderr is a terminal."""
    on = progress is True or (progress is None and sys.stderr.isatty())
    start = [None]

    def say(stage: str | None) -> None:
        if not on:
            return
        now = time.perf_counter()
        if start[0] is not None:
            print(f" {now - start[0]:.1f} s", file=sys.stderr, flush=True)
        if stage is not None:
            print(f"egraft.from_pretrained: {stage} ...", end="", file=sys.stderr, flush=True)
        start[0] = now if stage is not None else None

    return say


def _more(names: list) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


def _reader(qc: dict, path: str):
    """``read(name, tensors) -> QuantizedLinear`` for quantization_config `qc`; InputError for one egraft does not
    read."""
    method, bits, group = qc.get("quant_method"), qc.get("bits"), qc.get("group_size", -1)
    where = f"{path}: quantization_config {{quant_method: {method!r}"
    if method not in METHODS:
        raise InputError(f"{where}}}: egraft reads {' and '.join(METHODS)} checkpoints; compile the float model "
                         "with quantize='int8' or 'int4' instead")
    if method == "gptq":
        fmt = qc.get("checkpoint_format", "gptq")
        if fmt not in GPTQ_FORMATS or bits not in (4, 8) or qc.get("pack_dtype", "int32") not in ("int32", None):
            raise InputError(f"{where}, bits: {bits}, checkpoint_format: {fmt!r}}}: egraft reads 4- and 8-bit GPTQ "
                             f"in int32 words, checkpoint formats {', '.join(GPTQ_FORMATS)}")
        return lambda name, t: packed.gptq(name, t, bits, group, fmt)
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm" or bits != 4 or not qc.get("zero_point", True):
        raise InputError(f"{where}, version: {version!r}, bits: {bits}, zero_point: {qc.get('zero_point')}}}: egraft "
                         "reads 4-bit AWQ in the GEMM layout with zero points")
    return lambda name, t: packed.awq(name, t, group)


def _tensors(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files in `path` (one file, or the shards its index names)."""
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise InputError(f"{path} has no *.safetensors file; egraft reads safetensors checkpoints")
    out = {}
    for f in files:
        try:
            out.update(load_file(os.path.join(path, f)))
        except Exception as e:  # noqa: BLE001 - a corrupt file is bad input, said in one line
            raise InputError(f"{os.path.join(path, f)} is not a readable safetensors file ({e})") from None
    return out


def _replace(model: torch.nn.Module, name: str, layer: torch.nn.Module, path: str) -> None:
    """Put quantised `layer` where the float model has its linear layer `name` (whose shape it must have)."""
    try:
        old = model.get_submodule(name)
    except AttributeError:
        raise InputError(f"{path}: quantised layer {name!r} is not a module of the model its config.json builds "
                         f"({type(model).__name__})") from None
    shape = getattr(old, "weight", torch.empty(0)).shape
    if type(old).__name__ == "Conv1D":  # GPT-2's linear layer, weight [in, out]
        shape = shape[::-1]
    if tuple(shape) != (layer.out_features, layer.in_features):
        raise InputError(f"{path}: quantised layer {name!r} is [{layer.out_features}, {layer.in_features}]; the model "
                         f"has {type(old).__name__} of weight {tuple(shape)} there")
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, layer)


__all__ = ["GPTQ_FORMATS", "METHODS", "from_pretrained"]
