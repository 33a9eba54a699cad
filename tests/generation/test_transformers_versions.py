"""The step hands the slot cache to a model by the keyword its forward has: ``cache`` (transformers 5.24 and
later) or ``past_key_values`` (earlier 5.x, as on the GPU machine's transformers 5.17, where a ``cache=`` argument
landed in ``**kwargs`` unread and the step ran without its cache)."""

from __future__ import annotations

import torch
from compiled_helpers import left_padded, reference, tiny
from transformers import LlamaForCausalLM

from egraft.frontend.causal_lm import cache_keyword


class _EarlierKeyword(LlamaForCausalLM):
    """transformers before 5.24: the cache is ``past_key_values`` (a ``cache`` keyword would be ignored)."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
        assert "cache" not in kwargs, "the earlier signature has no cache keyword"
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               cache=past_key_values, **kwargs)


def test_the_cache_keyword_follows_the_forward_signature():
    assert cache_keyword(tiny("llama")) == "cache"
    model = tiny("llama")
    model.__class__ = _EarlierKeyword
    assert cache_keyword(model) == "past_key_values"


def test_a_model_taking_past_key_values_generates_transformers_tokens(search_cache):
    import egraft

    model = tiny("llama")
    want_model = tiny("llama")
    model.__class__ = _EarlierKeyword
    cm = egraft.compile(model, device="cpu", budget="1s", max_batch=2, max_length=64, chunks=(1, 4, 16),
                        cache=search_cache, progress=False)
    ids, mask = left_padded([5, 3], seed=7)
    got = cm.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    want = reference(want_model, ids, mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, want)
