"""``egraft.compile(..., quantize="int8" | "int4")`` of a causal LM: greedy tokens equal the quantised model's (the
model with its weights dequantised, run by transformers) on the GPT-2, Llama and Qwen2 families, compiled and loaded
from a saved artifact, which records the quantisation."""

from __future__ import annotations

import json
import os

import pytest
import torch
from compiled_helpers import left_padded, reference
from family_models import VOCAB, tiny_family

KW = dict(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)


def _dequantized_copy(model, quantized):
    """`model` with each quantised layer's weight replaced by its dequantised values, as plain transformers."""
    import copy

    from egraft.frontend.quantize import QuantizedLinear

    plain = copy.deepcopy(model)
    qs = dict(quantized.named_modules())
    for name, m in plain.named_modules():
        q = qs.get(name)
        if isinstance(q, QuantizedLinear):
            w = q.dequantized()
            m.weight = torch.nn.Parameter(w if type(m) is torch.nn.Linear else w.t().contiguous())
    return plain.eval()


MODES = {"int8": {}, "int4": {"group_size": 32}}


# in CI each family once and each mode at least once (GPT-2's transposed Conv1D weights packed as int4); every pair
# with -m slow
IN_CI = {("gpt2", "int4"), ("llama", "int8"), ("qwen2", "int4")}


def _pairs(families, modes, in_ci):
    return [pytest.param(f, m, marks=() if (f, m) in in_ci else pytest.mark.slow) for f in families for m in modes]


@pytest.mark.parametrize("family, mode", _pairs(["gpt2", "llama", "qwen2"], sorted(MODES), IN_CI))
def test_quantised_generation_gives_the_dequantised_models_tokens_compiled_and_loaded(family, mode, search_cache,
                                                                                       tmp_path):
    import egraft

    model = tiny_family(family)
    cm = egraft.compile(model, device="cpu", backend="jax", budget="1s", max_batch=2, max_length=64, chunks=(1, 4),
                        contexts=(), quantize=mode, **MODES[mode], cache=search_cache, progress=False)
    ids, mask = left_padded([6, 3], seed=11, vocab=VOCAB)
    want = reference(_dequantized_copy(model, cm.model), ids, mask, **KW)
    assert torch.equal(reference(cm.model, ids, mask, **KW), want), "the quantised module is not its dequantisation"
    assert torch.equal(cm.generate(ids, attention_mask=mask, **KW), want)
    described = cm.generation.describe()["quantization"]
    assert described["mode"] == mode and described["layers"] >= 5 and described.get("group_size") == MODES[mode].get(
        "group_size")
    path = cm.save(str(tmp_path / "art"))
    with open(os.path.join(path, "generation.json")) as f:
        assert json.load(f)["compiled"]["quantization"] == described
    loaded = egraft.load(path)
    assert torch.equal(loaded.generate(ids, attention_mask=mask, **KW), want)
    # the artifact holds the quantised values (plus float tables the model keeps), not float32 copies of them
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    assert os.path.getsize(os.path.join(path, "weights.safetensors")) < (0.75 if mode == "int8" else 0.6) * weights


@pytest.mark.parametrize("family, bits", [("llama", 8), ("qwen2", 4)])
def test_a_model_quantised_with_torchao_generates_the_dequantised_models_tokens_compiled_and_loaded(family, bits,
                                                                                                    search_cache,
                                                                                                    tmp_path):
    """torchao's weight-only layers compile as they are (frontend.adopt): the same integers and scales."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    import egraft

    model = tiny_family(family)
    quantize_(model, Int8WeightOnlyConfig() if bits == 8 else
              IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    cm = egraft.compile(model, device="cpu", backend="jax", budget="1s", max_batch=2, max_length=64, chunks=(1, 4),
                        contexts=(), cache=search_cache, progress=False)
    described = cm.generation.describe()["quantization"]
    assert described["source"] == "torchao" and described["mode"] == f"int{bits}" and described["layers"] >= 5
    ids, mask = left_padded([6, 3], seed=12, vocab=VOCAB)
    want = reference(_dequantized_copy(model, cm.model), ids, mask, **KW)
    assert torch.equal(cm.generate(ids, attention_mask=mask, **KW), want)
    loaded = egraft.load(cm.save(str(tmp_path / "art")))
    assert torch.equal(loaded.generate(ids, attention_mask=mask, **KW), want)


@pytest.mark.parametrize("family", ["llama", pytest.param("gpt2", marks=pytest.mark.slow),
                                    pytest.param("qwen2", marks=pytest.mark.slow)])  # (in CI: llama)
def test_w8a8_generation_gives_the_w8a8_models_tokens_and_records_its_quality(family, search_cache, tmp_path):
    """The lossy mode: tokens equal the w8a8 model's own (eager PyTorch, ``cm.model``), compiled and loaded; its
    distance from the float model is measured at compile time and saved with the artifact."""
    import egraft

    model = tiny_family(family)
    cm = egraft.compile(model, device="cpu", backend="jax", budget="1s", max_batch=2, max_length=64, chunks=(1, 4),
                        contexts=(), quantize="w8a8", cache=search_cache, progress=False)
    ids, mask = left_padded([6, 3], seed=13, vocab=VOCAB)
    want = reference(cm.model, ids, mask, **KW)
    _same_or_a_lossy_near_tie(cm.model, cm.generate(ids, attention_mask=mask, **KW), want, mask)
    described = cm.generation.describe()["quantization"]
    quality = described["quality"]
    assert described["mode"] == "w8a8" and described["lossy"] and quality["within_bound"]
    assert quality["logit_rel_err"] > 0 and quality["weight_only"]["positions"] == quality["positions"] == 64
    path = cm.save(str(tmp_path / "art"))
    with open(os.path.join(path, "generation.json")) as f:
        assert json.load(f)["compiled"]["quantization"] == described
    _same_or_a_lossy_near_tie(cm.model, egraft.load(path).generate(ids, attention_mask=mask, **KW), want, mask)


def _same_or_a_lossy_near_tie(model, got, want, mask):
    """`got` equals `want`, or at the first token where a row differs the w8a8 model's own logits (eager) hold the
    two tokens within the lossy bound of each other: a near-tie that a rounding flip may decide either way (the
    compiled model equals the w8a8 model within that bound, not to float rounding)."""
    from egraft.ir.dtypes import LOSSY_BOUND

    if torch.equal(got, want):
        return
    for row in range(got.shape[0]):
        diff = (got[row] != want[row]).nonzero()
        if not len(diff):
            continue
        at = int(diff[0])
        prefix = want[row:row + 1, :at]
        with torch.no_grad():
            logits = model(prefix, attention_mask=torch.cat(
                [mask[row:row + 1], torch.ones(1, at - mask.shape[1], dtype=mask.dtype)], 1)).logits[0, -1]
        gap = float(logits[want[row, at]] - logits[got[row, at]])
        assert gap <= LOSSY_BOUND * float(logits.abs().max()), (
            f"row {row} differs at token {at} ({int(got[row, at])} against {int(want[row, at])}) with a logit gap "
            f"of {gap:.3g}: not a near-tie")
