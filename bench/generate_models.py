"""The models of bench/generate.py, and what one decode step must read from memory.

Pure Python at import (the vLLM worker imports it from another virtual
environment); torch and transformers load inside :func:`build`.

Bytes per decode step, from the model's shape alone (float32, 4 bytes):

* every weight matrix and vector except the input embedding table, whose
  rows are gathered: one row per sequence of the batch (an upper bound: two
  sequences may share a token), and one row of a learned position table;
* a tied embedding (GPT-2's ``wte`` is also its output projection) is read
  in full by the output projection;
* the KV cache up to the current length: the step that produces token k+1
  of a prompt of length p attends over p + k positions (its own included),
  2 (K and V) x layers x batch x KV heads x head size each.

Activations and the one cache row written per step are left out (a few KiB
against megabytes), so the bound is a floor on the step time: bytes over the
measured read bandwidth.
"""

from __future__ import annotations

F32 = 4

# name -> shape; "kind" picks the transformers class (LlamaForCausalLM / GPT2LMHeadModel)
MODELS = {
    "llama-4x512": dict(kind="llama", layers=4, hidden=512, intermediate=1408, heads=8, kv_heads=4, vocab=8192,
                        positions=1024),
    "gpt2-small": dict(kind="gpt2", layers=12, hidden=768, intermediate=3072, heads=12, kv_heads=12, vocab=50257,
                       positions=1024),
    # --quick and the test: seconds, not minutes
    # (head size 64: vLLM's CPU attention refuses 16)
    "llama-tiny": dict(kind="llama", layers=2, hidden=128, intermediate=256, heads=2, kv_heads=1, vocab=512,
                       positions=256),
    "gpt2-tiny": dict(kind="gpt2", layers=2, hidden=128, intermediate=512, heads=2, kv_heads=2, vocab=512,
                      positions=256),
}
FULL_MODELS = ("llama-4x512", "gpt2-small")
SEED = 0


def build(name: str, seed: int = SEED):
    """A float32 causal LM with random weights drawn from `seed`; no EOS, so greedy decoding runs every token."""
    import torch
    import transformers as T

    m = MODELS[name]
    common = dict(vocab_size=m["vocab"], bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if m["kind"] == "llama":
            cfg = T.LlamaConfig(num_hidden_layers=m["layers"], hidden_size=m["hidden"], num_attention_heads=m["heads"],
                                num_key_value_heads=m["kv_heads"], intermediate_size=m["intermediate"],
                                max_position_embeddings=m["positions"], tie_word_embeddings=False, **common)
            model = T.LlamaForCausalLM(cfg)
        elif m["kind"] == "gpt2":
            cfg = T.GPT2Config(n_layer=m["layers"], n_embd=m["hidden"], n_head=m["heads"], n_inner=m["intermediate"],
                               n_positions=m["positions"], **common)
            model = T.GPT2LMHeadModel(cfg)
        else:
            raise ValueError(f"unknown model kind {m['kind']!r} in {name}")
    model = model.to(torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def _head(m) -> int:
    return m["hidden"] // m["heads"]


def parameter_counts(name: str) -> dict:
    """Parameters by what a decode step does with them: ``dense`` (read in full), ``gathered`` (tables read by row)."""
    m = MODELS[name]
    h, i, v, layers = m["hidden"], m["intermediate"], m["vocab"], m["layers"]
    if m["kind"] == "llama":
        kv = m["kv_heads"] * _head(m)
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two RMSNorms
        dense = layers * per_layer + h + v * h  # final norm, lm_head (not tied)
        gathered = {"embed_tokens": (v, h)}
    else:  # GPT-2: biases everywhere, LayerNorms with bias, lm_head tied to wte
        per_layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h) + 2 * (2 * h)
        dense = layers * per_layer + 2 * h + v * h  # ln_f; wte, read in full as the output projection
        gathered = {"wpe": (m["positions"], h)}
    total = dense + sum(r * c for r, c in gathered.values())
    return {"dense": dense, "gathered": gathered, "total": total}


def weight_bytes_per_step(name: str, batch: int) -> int:
    """Bytes of weights one decode step of `batch` sequences reads (module docstring)."""
    m = MODELS[name]
    # llama: one token row per sequence; gpt2: one position row (equal-length prompts share the position)
    rows = batch if m["kind"] == "llama" else 1
    return F32 * (parameter_counts(name)["dense"] + rows * m["hidden"])


def kv_bytes(name: str, batch: int, length: int) -> int:
    """Bytes of K and V over `length` positions of every layer."""
    m = MODELS[name]
    return F32 * 2 * m["layers"] * batch * m["kv_heads"] * _head(m) * length


def decode_bound(name: str, batch: int, prompt: int, new_tokens: int, bandwidth: float) -> dict:
    """The decode steps of one greedy generation (the new_tokens - 1 after the prefill) against `bandwidth` B/s."""
    steps = new_tokens - 1
    w = weight_bytes_per_step(name, batch)
    total = sum(w + kv_bytes(name, batch, prompt + k) for k in range(1, steps + 1))
    seconds = total / bandwidth if bandwidth > 0 else float("nan")
    return {"weight_bytes_per_step": w, "bytes_per_step_mean": total / steps if steps else 0.0,
            "step_s": seconds / steps if steps else float("nan"),
            "tokens_per_s": batch * steps / seconds if seconds > 0 else float("nan")}
