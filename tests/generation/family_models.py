"""Tiny seeded causal LMs of many transformers families, for the family matrix (test_families.py).

Each factory builds a 2-layer model, hidden size 64, a 320-token vocabulary.
``tiny_family(name)`` seeds it, redraws its weight matrices and puts it in
eval mode.  transformers' own initialisation (std 0.02) makes a tiny random
model nearly the identity plus its embeddings: a tied head then just copies
the last token and greedy generation repeats one token, which tests nothing
about attention.  So every matrix is drawn N(0, 1/hidden) (the embedding
tables) or N(0, 9/hidden) (the blocks: their outputs outweigh the
embeddings in the residual stream), and the output layer is scaled by
``HEAD_SCALE``, which makes the logits peaked (std 4 to 12), as a trained
model's are: a greedy choice is then never a near-tie that float rounding
could flip (the smallest top-2 gap of a greedy choice on the matrix's
prompts is 7e-3, the step's logits differ from the model's forward by at
most 3e-4 on logits up to 50).
"""

from __future__ import annotations

import torch

VOCAB, EOS, PAD, SEED = 320, 1, 0, 1234
HEAD_SCALE = 4.0
BLOCK_GAIN = 3.0
IDS = dict(vocab_size=VOCAB, bos_token_id=2, eos_token_id=EOS, pad_token_id=PAD)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=128, **IDS))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                        num_hidden_layers=2, intermediate_size=128, **IDS))


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return Qwen2ForCausalLM(Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                        num_hidden_layers=2, intermediate_size=128, tie_word_embeddings=False, **IDS))


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM(Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        num_hidden_layers=2, intermediate_size=128, tie_word_embeddings=True, **IDS))


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM
    return MistralForCausalLM(MistralConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                            num_hidden_layers=2, intermediate_size=128, sliding_window=8, **IDS))


def _gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM
    return Gemma2ForCausalLM(Gemma2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                          num_hidden_layers=2, intermediate_size=128, sliding_window=8,
                                          final_logit_softcapping=30.0, attn_logit_softcapping=5.0,
                                          tie_word_embeddings=False, **IDS))


def _phi():
    from transformers import PhiConfig, PhiForCausalLM
    return PhiForCausalLM(PhiConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                    intermediate_size=128, partial_rotary_factor=0.5, **IDS))


def _phi3():
    from transformers import Phi3Config, Phi3ForCausalLM
    return Phi3ForCausalLM(Phi3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                      num_hidden_layers=2, intermediate_size=128, **IDS))


def _gpt_neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    return GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                            intermediate_size=128, rotary_pct=0.25, use_parallel_residual=True,
                                            **IDS))


def _stablelm():
    from transformers import StableLmConfig, StableLmForCausalLM
    return StableLmForCausalLM(StableLmConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                              num_hidden_layers=2, intermediate_size=128, partial_rotary_factor=0.25,
                                              use_parallel_residual=True, qk_layernorm=True, **IDS))


def _opt():
    from transformers import OPTConfig, OPTForCausalLM
    return OPTForCausalLM(OPTConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, ffn_dim=128,
                                    word_embed_proj_dim=64, max_position_embeddings=128, **IDS))


def _bloom():
    from transformers import BloomConfig, BloomForCausalLM
    return BloomForCausalLM(BloomConfig(hidden_size=64, n_head=4, n_layer=2, **IDS))


def _falcon():
    from transformers import FalconConfig, FalconForCausalLM
    return FalconForCausalLM(FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                          new_decoder_architecture=False, multi_query=True, parallel_attn=True,
                                          alibi=False, **IDS))


def _falcon_alibi():
    from transformers import FalconConfig, FalconForCausalLM
    return FalconForCausalLM(FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                          new_decoder_architecture=False, multi_query=False, parallel_attn=False,
                                          alibi=True, **IDS))


def _gptj():
    from transformers import GPTJConfig, GPTJForCausalLM
    return GPTJForCausalLM(GPTJConfig(n_embd=64, n_head=4, n_layer=2, rotary_dim=8, n_positions=128, **IDS))


def _cohere():
    from transformers import CohereConfig, CohereForCausalLM
    return CohereForCausalLM(CohereConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                          num_hidden_layers=2, intermediate_size=128, logit_scale=0.5,
                                          use_qk_norm=True, **IDS))


def _olmo():
    from transformers import OlmoConfig, OlmoForCausalLM
    return OlmoForCausalLM(OlmoConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                      num_hidden_layers=2, intermediate_size=128, clip_qkv=4.0, **IDS))


def _gpt_bigcode():
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM
    return GPTBigCodeForCausalLM(GPTBigCodeConfig(n_embd=64, n_head=4, n_layer=2, n_positions=128,
                                                  multi_query=True, **IDS))


def _starcoder2():
    from transformers import Starcoder2Config, Starcoder2ForCausalLM
    return Starcoder2ForCausalLM(Starcoder2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                                  num_hidden_layers=2, intermediate_size=128, sliding_window=8,
                                                  **IDS))


def _mpt():
    from transformers import MptConfig, MptForCausalLM
    return MptForCausalLM(MptConfig(d_model=64, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=128, **IDS))


def _biogpt():
    from transformers import BioGptConfig, BioGptForCausalLM
    return BioGptForCausalLM(BioGptConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                          intermediate_size=128, max_position_embeddings=128, scale_embedding=False,
                                          **IDS))


def _gpt_neo():
    from transformers import GPTNeoConfig, GPTNeoForCausalLM
    return GPTNeoForCausalLM(GPTNeoConfig(hidden_size=64, num_heads=4, num_layers=2, attention_types=[[["global", "local"], 1]],
                                          window_size=8, max_position_embeddings=128, **IDS))


# what each family of the matrix covers (docs/generation.md lists the same)
COVERS = {
    "gpt2": "learned absolute positions, Conv1D projections, tied head",
    "llama": "rotary positions, grouped-query attention, untied head",
    "qwen2": "q/k/v biases, untied head",
    "qwen3": "QK-norm (RMSNorm on q and k per head), tied head",
    "mistral": "sliding-window attention on every layer (window 8 < the sequences)",
    "gemma2": "sliding and full layers alternating, attention and final logit soft-capping, eager attention",
    "phi": "parallel attention/MLP block, partial rotary (half the head)",
    "phi3": "fused qkv and gate/up projections",
    "gpt_neox": "parallel residual, partial rotary (a quarter of the head)",
    "stablelm": "parallel residual, per-head QK layer norm, partial rotary",
    "opt": "positions from the attention mask (cumsum, offset 2), tied head",
    "biogpt": "positions from the attention mask (cumsum, offset 2), pre-norm decoder",
    "bloom": "ALiBi from the 2-D attention mask (baddbmm), embedding layer norm, tied head",
    "falcon": "multi-query, parallel attention/MLP, rotary, tied head",
    "falcon_alibi": "ALiBi (bfloat16 slopes) added to the mask, sequential block",
    "mpt": "ALiBi from a static table sliced by key length, eager attention",
    "gptj": "interleaved rotary on part of the head, parallel block",
    "cohere": "parallel block, QK layer norm, logit scale, tied head",
    "olmo": "q/k/v clipping, non-parametric layer norm",
    "gpt_bigcode": "multi-query attention, fused c_attn, tied head",
    "starcoder2": "sliding-window attention, biases, tied head",
}

FACTORIES = {"gpt2": _gpt2, "llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "mistral": _mistral,
             "gemma2": _gemma2, "phi": _phi, "phi3": _phi3, "gpt_neox": _gpt_neox, "stablelm": _stablelm,
             "opt": _opt, "bloom": _bloom, "falcon": _falcon, "falcon_alibi": _falcon_alibi, "gptj": _gptj,
             "cohere": _cohere, "olmo": _olmo, "gpt_bigcode": _gpt_bigcode,
             "starcoder2": _starcoder2, "mpt": _mpt, "biogpt": _biogpt, "gpt_neo": _gpt_neo}


def tiny_family(name: str, head_scale: float = HEAD_SCALE):
    """The tiny `name` model: seeded, eval mode, its matrices drawn N(0, 1/hidden) (see the module docstring) and
    its output layer scaled by `head_scale`."""
    import transformers

    transformers.logging.set_verbosity_error()
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        model = FACTORIES[name]()
        hidden = model.get_input_embeddings().weight.shape[1]
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, (1.0 if id(p) in embeddings else BLOCK_GAIN) * hidden ** -0.5)
            model.get_output_embeddings().weight.mul_(head_scale)  # a tied head: its input embeddings too
    return model.eval()
