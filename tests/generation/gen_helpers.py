"""Tiny random GPT-2 and Llama causal LMs, their eager step programs, and left-padded prompts."""

from __future__ import annotations

import torch

MAX_BATCH, MAX_LENGTH, CHUNKS = 4, 128, (1, 4, 16, 64)
EOS = 1  # the tiny configs' eos token (the default 50256 is outside a 97-token vocabulary)


def _gpt2(attn: str = "sdpa"):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=97, n_positions=256,
                                      bos_token_id=0, eos_token_id=EOS, attn_implementation=attn))


def _llama(attn: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                        num_hidden_layers=2, intermediate_size=128, vocab_size=97,
                                        bos_token_id=0, eos_token_id=EOS, attn_implementation=attn))


FAMILIES = {"gpt2": _gpt2, "llama": _llama}


class Built:
    """One tiny model (eval mode, fixed weights), its step module and eager step programs."""

    def __init__(self, family: str, attn: str = "sdpa"):
        import transformers

        from egraft.frontend.causal_lm import eager_programs, step_module

        transformers.logging.set_verbosity_error()
        with torch.random.fork_rng():
            torch.manual_seed(1234)
            self.model = FAMILIES[family](attn).eval()
        self.family = family
        self.step = step_module(self.model, MAX_BATCH, MAX_LENGTH, CHUNKS)
        self.programs = eager_programs(self.step)

    def reference(self, ids, mask=None, **kw):
        """transformers' own generate on the model."""
        with torch.no_grad():
            return self.model.generate(ids, attention_mask=mask, **kw)


def left_padded(lengths, seed: int, pad: int = 0, vocab: int = 97):
    """A left-padded batch of random prompts (tokens 2..vocab-1) with its attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(2, vocab, (len(lengths), width), generator=g)
    mask = torch.zeros(len(lengths), width, dtype=torch.int64)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
        ids[i, :width - n] = pad
    return ids, mask
