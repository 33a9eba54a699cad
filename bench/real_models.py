"""The models of the real-size benchmarks: random weights (seeded; nothing is downloaded) at the published
shapes of small deployed models, the prompt they are given, and what a decode step of one reads.

* ``llama-135m``: the Llama architecture, 30 layers x 576, 9 / 3 heads,
  intermediate 1536, vocab 49152, tied embeddings (135 M parameters);
* ``qwen2-0.5b``: the Qwen2 architecture, 24 layers x 896, 14 / 2 heads,
  intermediate 4864, vocab 151936, tied embeddings, QKV biases (494 M);
* ``llama-1.2b``: the Llama architecture, 16 layers x 2048, 32 / 8 heads,
  intermediate 8192, vocab 128256, tied (1.24 B);
* ``llama-tiny``: 2 layers x 64 (``--quick`` runs and tests).

The output layer is scaled (x 8) so that greedy choices are clear, as a
trained model's are: random weights give near-tied logits that bfloat16
rounding flips.  ``bench/real_size.py``, ``bench/peers.py``,
``bench/step_profile.py`` and ``bench/quant_modes.py`` build their models here.
"""

from __future__ import annotations

import tempfile

MODELS = {
    "llama-135m": dict(kind="llama", layers=30, hidden=576, heads=9, kv_heads=3, intermediate=1536, vocab=49152),
    "qwen2-0.5b": dict(kind="qwen2", layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864, vocab=151936),
    # the shapes of a 1.2 B Llama-architecture model (16 layers x 2048, 32 / 8 heads, vocab 128256, tied)
    "llama-1.2b": dict(kind="llama", layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256),
    "llama-tiny": dict(kind="llama", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256),  # --quick
}
SEED, PROMPT, MAX_LENGTH = 0, 16, 256


def build(name: str, dtype: str):
    import torch
    import transformers as T

    m = MODELS[name]
    common = dict(num_hidden_layers=m["layers"], hidden_size=m["hidden"], num_attention_heads=m["heads"],
                  num_key_value_heads=m["kv_heads"], intermediate_size=m["intermediate"], vocab_size=m["vocab"],
                  max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = (T.LlamaForCausalLM(T.LlamaConfig(**common)) if m["kind"] == "llama"
                 else T.Qwen2ForCausalLM(T.Qwen2Config(**common)))
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(8.0)  # (tied: the embedding too, which norms absorb)
    model = model.to(getattr(torch, dtype)).eval()
    gc = model.generation_config
    gc.eos_token_id = gc.bos_token_id = gc.pad_token_id = None
    return model


def step_bytes(model, context: float) -> float:
    """Bytes one batch-1 decode step of `model` reads: every weight once (an untied input embedding: one row;
    a quantised layer's stored values and scales) and the K and V cache over `context` positions, in the model's
    dtype."""
    # a tied table once (a torchao tensor is a wrapper whose own data_ptr says nothing: by identity)
    params = {id(p) if hasattr(p, "qdata") else p.data_ptr(): p for p in list(model.parameters()) + list(model.buffers())}
    total = sum(nbytes(p) for p in params.values())  # (a quantised layer's values: buffers)
    emb = model.get_input_embeddings().weight
    out = getattr(model.get_output_embeddings(), "weight", None)  # (None: a quantised output layer)
    if out is None or emb.data_ptr() != out.data_ptr():
        total -= (emb.shape[0] - 1) * emb.shape[1] * emb.element_size()
    c = model.config
    head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return total + 2 * c.num_hidden_layers * c.num_key_value_heads * head * emb.element_size() * context


def prompt(vocab: int, rows: int = 1):
    import torch

    return torch.randint(0, vocab, (rows, PROMPT), generator=torch.Generator().manual_seed(SEED + 1))


def quantize_mode(a) -> str | None:
    """egraft.compile's quantize= for this run (None for a float model and for one quantised elsewhere)."""
    q = getattr(a, "quantize", "none")
    return q if q in ("int8", "int4", "w8a8") else None


def model_for(a, peer: bool = False):
    """The model this run compiles, or with `peer` the one HF eager runs beside it: `a.model` in `a.dtype`; for
    ``--quantize torchao-*`` quantised by torchao (both); for ``gptq-int4`` / ``awq-int4`` written as that
    checkpoint (``egraft.testing.checkpoints``: 4-bit with zero points, groups of ``--group-size``, float16 other
    tensors) and read back by ``egraft.from_pretrained``, the peer being the float model of its dequantised
    weights (transformers cannot run the checkpoint without the GPTQ / AWQ library)."""
    import torch

    model = build(a.model, a.dtype)
    q = getattr(a, "quantize", "none") or "none"
    if q not in ("gptq-int4", "awq-int4"):
        return torchao_quantized(model, a)
    import egraft
    from egraft.testing import checkpoints

    with tempfile.TemporaryDirectory(prefix="egraft-ckpt-") as d:
        meant = checkpoints.write(model, d, q.split("-")[0], group=getattr(a, "group_size", None) or 128)
        if peer:
            return checkpoints.float_model(model, meant).to(getattr(torch, a.dtype))
        return egraft.from_pretrained(d, dtype=getattr(torch, a.dtype))


def torchao_quantized(model, a):
    """`model` quantised in place with torchao's weight-only config for ``--quantize torchao-int8 | torchao-int4``
    (int4: groups of ``--group-size``, default 128), as a user who quantised it with torchao hands it to egraft."""
    q = getattr(a, "quantize", "none") or "none"
    if not q.startswith("torchao"):
        return model
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    quantize_(model, Int8WeightOnlyConfig() if q == "torchao-int8" else
              IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(getattr(a, "group_size", None) or 128)))
    return model


def nbytes(t) -> int:
    """Bytes a step reads of `t`: a torchao quantised tensor's integers and scales (its zero points, all 0 in the
    forms egraft reads, are dropped), a plain tensor's elements."""
    parts = [t.qdata, t.scale] if hasattr(t, "qdata") else [t]
    return sum(p.numel() * p.element_size() for p in parts if p is not None)


__all__ = ["MAX_LENGTH", "MODELS", "PROMPT", "SEED", "build", "model_for", "nbytes", "prompt", "quantize_mode",
           "step_bytes", "torchao_quantized"]
