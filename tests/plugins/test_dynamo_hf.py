"""``torch.compile(model, backend="egraft")`` on Hugging Face GPT-2, Llama and BERT (tiny random configs).

One layer each, ``use_cache=False``; token ids as inputs, so the search
checks its candidates on the real ids (random ones would index past the
vocabulary).  Outputs must match eager PyTorch within 1e-4 (float32), with
no fallback warning.
"""

from __future__ import annotations

import pytest
import torch

from egraft.models import hf
from egraft.testing import fresh_seed
from plugin_helpers import check_compiled


@pytest.mark.parametrize("kind,impl", [("gpt2", "sdpa"), ("llama", "eager"), ("bert", "sdpa")])
def test_transformers(kind, impl):
    seed = fresh_seed()
    model, kwargs = hf.build(kind, layers=1, attn_implementation=impl, seed=seed % 1000)
    g = torch.Generator().manual_seed(seed)
    ids = [(torch.randint(0, 97, (2, 7), generator=g),) for _ in range(2)]
    assert check_compiled(model, ids, kwargs, seed) == []
