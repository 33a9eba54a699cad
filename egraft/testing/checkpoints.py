"""GPTQ and AWQ checkpoints written from a float model, for the tests and benchmarks of ``egraft.from_pretrained``.

The packing here is written from the formats' descriptions, independently of
``egraft.frontend.packed`` (which decodes them), word by word with plain
shifts (vLLM's ``gptq_pack`` / ``awq_pack`` agree with it: docs/status.md).
The quantiser is GPTQ's rounding step alone (round to the nearest level, no
error feedback): the checkpoints have the real layouts, not GPTQ's accuracy.
Each quantised layer's weight is ``s * (q - z)`` per group, ``s`` rounded to
float16 as the checkpoints store it; :func:`write` returns those dequantised
weights so a test can build the float model the checkpoint means.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

AWQ_PACK = (0, 2, 4, 6, 1, 3, 5, 7)  # field i of an AWQ word holds column AWQ_PACK[i] of its block of eight


def quantize(w: np.ndarray, bits: int, group: int, sym: bool, rng, act_order: bool = False):
    """``(q [K, N], z [G, N], s [G, N] float16, g_idx [K])`` for a float weight ``w [N, K]``: GPTQ's quantiser (sym:
    zero point 2**(bits-1); else min/max), column ``k`` in group ``g_idx[k]``."""
    n, k = w.shape
    group = k if group == -1 else group
    if k % group:
        raise ValueError(f"groups of {group} do not divide a layer's {k} input columns")
    order = rng.permutation(k) if act_order else np.arange(k)
    g_idx = np.empty(k, np.int64)
    g_idx[order] = np.arange(k) // group  # act-order: the columns in a random order fill the groups
    maxq = (1 << bits) - 1
    q = np.zeros((k, n), np.int64)
    z = np.zeros((k // group, n), np.int64)
    s = np.zeros((k // group, n), np.float16)
    for g in range(k // group):
        cols = w[:, g_idx == g]  # [N, group]
        if sym:
            amax = np.abs(cols).max(axis=1)
            scale, zero = 2 * amax / maxq, np.full(n, (maxq + 1) // 2)
        else:
            lo, hi = np.minimum(cols.min(axis=1), 0), np.maximum(cols.max(axis=1), 0)
            scale = (hi - lo) / maxq
            zero = np.clip(np.round(-lo / scale), 0, maxq).astype(np.int64)
        s[g] = scale.astype(np.float16)
        z[g] = zero
        q[g_idx == g] = np.clip(np.round(cols / s[g].astype(np.float64)[:, None]) + zero[:, None], 0, maxq).T
    return q, z, s, g_idx


def dequantize(q, z, s, g_idx) -> np.ndarray:
    """The float weight ``[N, K]`` a layer means: ``s[g, n] * (q[k, n] - z[g, n])``, ``g = g_idx[k]``."""
    return (s.astype(np.float64)[g_idx] * (q - z[g_idx])).T


def pack_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """``[K, N]`` -> int32 ``[K * bits / 32, N]``: row ``f*i + j`` in bits ``bits*j`` of word ``i``."""
    f = 32 // bits
    words = np.zeros((values.shape[0] // f, values.shape[1]), np.uint64)
    for i in range(words.shape[0]):
        for j in range(f):
            words[i] |= values[f * i + j].astype(np.uint64) << np.uint64(bits * j)
    return words.astype(np.uint32).view(np.int32)


def pack_columns(values: np.ndarray, bits: int, order=None) -> np.ndarray:
    """``[R, N]`` -> int32 ``[R, N * bits / 32]``: field ``i`` of word ``c`` holds column ``f*c + order[i]``."""
    f = 32 // bits
    order = order or tuple(range(f))
    words = np.zeros((values.shape[0], values.shape[1] // f), np.uint64)
    for c in range(words.shape[1]):
        for i in range(f):
            words[:, c] |= values[:, f * c + order[i]].astype(np.uint64) << np.uint64(bits * i)
    return words.astype(np.uint32).view(np.int32)


def write(model: torch.nn.Module, path: str, method: str, *, bits: int = 4, group: int = 32, sym: bool = False,
          fmt: str = "gptq", act_order: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    """Save `model` (a transformers causal LM) to `path` as a `method` ("gptq" or "awq") checkpoint: every
    ``nn.Linear`` (and GPT-2 ``Conv1D``) but the output layer quantised, the other tensors float16.  Returns name -> the float32
    weight each quantised layer means, and every other tensor as saved (float16 widened): the model the checkpoint
    holds."""
    from safetensors.torch import save_file

    rng = np.random.default_rng(seed)
    out, meant = {}, {}
    quantised = {name: type(m).__name__ == "Conv1D" for name, m in model.named_modules()
                 if type(m).__name__ in ("Linear", "Conv1D") and not name.endswith("lm_head")}
    for key, t in model.state_dict().items():
        name, _, part = key.rpartition(".")
        if name in quantised and part == "weight":
            w = t.detach().double().numpy()
            q, z, s, g_idx = quantize(w.T if quantised[name] else w, bits, group, sym, rng, act_order)
            meant[key] = torch.from_numpy(dequantize(q, z, s, g_idx)).to(torch.float32)
            if quantised[name]:  # GPT-2's Conv1D holds its weight [in, out]
                meant[key] = meant[key].T.contiguous()
            if method == "gptq":
                out[f"{name}.qweight"] = torch.from_numpy(pack_rows(q, bits))
                out[f"{name}.qzeros"] = torch.from_numpy(pack_columns(z - 1 if fmt == "gptq" else z, bits))
                out[f"{name}.g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
            else:
                out[f"{name}.qweight"] = torch.from_numpy(pack_columns(q, 4, AWQ_PACK))
                out[f"{name}.qzeros"] = torch.from_numpy(pack_columns(z, 4, AWQ_PACK))
            out[f"{name}.scales"] = torch.from_numpy(s)
        else:
            out[key] = t.detach().to(torch.float16).contiguous() if t.is_floating_point() else t.contiguous()
            meant[key] = out[key].to(torch.float32) if t.is_floating_point() else out[key]
    os.makedirs(path, exist_ok=True)
    tied = {k for k in out if k.endswith("lm_head.weight")} if model.config.tie_word_embeddings else set()
    save_file({k: v for k, v in out.items() if k not in tied}, os.path.join(path, "model.safetensors"))
    model.config.save_pretrained(path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["dtype"] = cfg["torch_dtype"] = "float16"
    cfg["quantization_config"] = (
        {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym, "desc_act": act_order,
         "checkpoint_format": fmt} if method == "gptq" else
        {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return meant


def float_model(model: torch.nn.Module, meant: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A float32 copy of `model` holding the tensors `meant` (:func:`write`'s return): the checkpoint's model."""
    import copy

    plain = copy.deepcopy(model).to(torch.float32)
    plain.load_state_dict(meant, strict=False)
    return plain.eval()
