"""Hugging Face `transformers` models from small random configs (no downloads).

One place that builds the GPT-2, Llama and BERT models the tests and
benchmarks trace, so they all mean the same models.  ``build`` returns the
model in eval mode plus the keyword arguments its forward needs
(``use_cache=False`` for the decoder models, also set in their configs,
since a KV cache object in the output cannot be exported) and leaves torch's global random
state untouched.
"""

from __future__ import annotations

import torch

KINDS = ("gpt2", "llama", "bert")


def build(kind: str, *, layers: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
          intermediate: int | None = None, vocab: int = 97, positions: int = 32, lm_head: bool = False,
          attn_implementation: str | None = None, seed: int = 0):
    """(model, forward kwargs) for `kind` in KINDS, with random weights drawn from `seed`."""
    import transformers as T

    if kind not in KINDS:
        raise ValueError(f"unknown transformers model {kind!r}; choose one of {KINDS}")
    inter = intermediate or 2 * hidden
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "gpt2":
            cfg = T.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=positions,
                               bos_token_id=0, eos_token_id=0, use_cache=False, **extra)
            model = (T.GPT2LMHeadModel if lm_head else T.GPT2Model)(cfg)
        elif kind == "llama":
            cfg = T.LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                num_key_value_heads=kv_heads, intermediate_size=inter, vocab_size=vocab,
                                max_position_embeddings=positions, bos_token_id=0, eos_token_id=0,
                                use_cache=False, **extra)
            model = (T.LlamaForCausalLM if lm_head else T.LlamaModel)(cfg)
        else:
            cfg = T.BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                               intermediate_size=inter, vocab_size=vocab, max_position_embeddings=positions, **extra)
            model = T.BertModel(cfg)
    return model.eval(), ({"use_cache": False} if kind in ("gpt2", "llama") else {})


def flat_outputs(out) -> list[torch.Tensor]:
    """The tensors of a model's output (a tensor, a tuple, or a transformers ModelOutput), in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for t in out if isinstance(t, torch.Tensor)]
