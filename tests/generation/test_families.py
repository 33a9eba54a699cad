"""The family matrix: tiny transformers causal LMs of many families, compiled for generation, give transformers'
own ``model.generate`` tokens.

Each family (``family_models.COVERS`` says what it covers: positions from the
attention mask, ALiBi, sliding windows, parallel blocks, tied and untied
heads, QK-norm, soft-capping, ...) is compiled once (the module-scoped
``compiled`` fixture: ``egraft.compile(model, max_batch=2, max_length=32,
chunks=(1, 8))``, a small search, this run's search cache), saved and loaded
back (``egraft.load``), and its one test checks, on a LEFT-padded batch of two
rows of different lengths:

* greedy tokens equal transformers', through ``CompiledModel.generate`` and
  through the loaded artifact;
* seeded sampling (temperature, top-k, top-p) draws transformers' tokens, both ways;
* the compiled step programs' logits, prompt and every teacher-forced decode
  step, equal the model's own forward on the padded batch (closer than the
  tokens can show).

One test per family, not one per check: under ``pytest -n 2`` tests of one
module are spread over both workers, and each would compile the family again.
Then: the context and row buckets for MPT (ALiBi sliced by the key length)
and Mistral (its window within 16 slots); sliding-window tokens change when
the window is widened (so the matrix tests it); the constructs refused by
name before any export or build (GPT-Neo's local attention, Mamba's layers,
DeepSeek's latent attention, a flex attention implementation); the check
against the model's forward catching GPT-Neo with that refusal off; and
transformers' mask interfaces left as they were outside a step.

Run the matrix alone: ``pytest -q -p no:cacheprovider tests/generation/test_families.py``
(about 2 min on two cores; ``-k bloom`` for one family).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from family_models import COVERS, PAD, VOCAB, tiny_family
from gen_helpers import left_padded

import egraft
from egraft.errors import InputError

MAX_BATCH, MAX_LENGTH, CHUNKS = 2, 32, (1, 8)  # 13 tokens: a chunk of 8 (5 real + 3 filler in the short row), 1s
PROMPTS, NEW = [5, 13], 10  # 23 tokens: past the sliding windows of 8
GREEDY = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=PAD)
SAMPLED = dict(max_new_tokens=NEW, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, eos_token_id=None,
               pad_token_id=PAD)
# a small search (the matrix checks the frontend across families, not the search): compiled programs are still
# checked against eager PyTorch (validate) before they are used
SEARCH = dict(budget={"seconds": 1, "trials": 2, "population": 2}, limits={"iterations": 2}, fitness="model")


def _prompts():
    return left_padded(PROMPTS, seed=3, pad=PAD, vocab=VOCAB)


def _reference(model, ids, mask, **kw):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, **kw)


def _forward_logits(model, ids, mask):
    """The model's own forward over a left-padded batch, with the position_ids transformers' generate passes."""
    kw = {}
    if "position_ids" in inspect.signature(model.forward).parameters:
        kw["position_ids"] = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, use_cache=False, **kw).logits


@pytest.fixture(scope="module", params=sorted(COVERS))
def compiled(request, search_cache, tmp_path_factory):
    """(name, model, CompiledModel, loaded artifact) of one family: compiled once, saved, loaded back."""
    name = request.param
    model = tiny_family(name)
    cm = egraft.compile(model, device="cpu", max_batch=MAX_BATCH, max_length=MAX_LENGTH, chunks=CHUNKS,
                        contexts=(), rows=(), cache=search_cache, progress=False, **SEARCH)
    art = egraft.load(cm.save(tmp_path_factory.mktemp(f"family-{name}")))
    return name, model, cm, art


def test_family_generates_transformers_tokens(compiled):
    from egraft.runtime.generation import Engine, new_state

    name, model, cm, art = compiled
    ids, mask = _prompts()
    width = ids.shape[1]
    window = getattr(model.config, "sliding_window", None)
    if isinstance(window, int):  # the window must cut into the sequences, or the family would not test it
        assert window < width + NEW, (name, window)

    def same(got, want, what):
        assert torch.equal(got, want), f"{name}, {what}: new tokens\n{got[:, width:]}\ntransformers'\n{want[:, width:]}"

    want = _reference(model, ids, mask, **GREEDY)
    assert want.shape == (2, width + NEW)
    same(cm.generate(ids, mask, **GREEDY), want, "compiled, greedy")
    same(art.generate(ids, mask, **GREEDY), want, "loaded artifact, greedy")

    for seed in (0, 1):
        torch.manual_seed(seed)
        sampled = _reference(model, ids, mask, **SAMPLED)
        torch.manual_seed(seed)
        same(cm.generate(ids, mask, **SAMPLED), sampled, f"compiled, sampling with seed {seed}")
        torch.manual_seed(seed)
        same(art.generate(ids, mask, **SAMPLED), sampled, f"loaded artifact, sampling with seed {seed}")

    # the compiled programs' logits: both prompts (a chunk of 8 holding the short row's 5 tokens after filler,
    # then single tokens), then the greedy tokens fed back one step at a time, against one forward of the model
    full_mask = torch.cat([mask, torch.ones(2, NEW, dtype=mask.dtype)], 1)
    ref = _forward_logits(model, want, full_mask)
    engine = Engine(cm.generation.step_programs, new_state(cm.generation.spec))
    last = engine.prefill({b: ids[b, width - n:] for b, n in enumerate(PROMPTS)})
    got = [torch.stack([last[0], last[1]])]
    for k in range(NEW - 1):
        got.append(engine.decode(want[:, width + k].numpy(), np.ones(2, dtype=bool)))
    got = torch.stack([torch.as_tensor(np.asarray(g)) for g in got], 1)  # [2, NEW, vocab]
    torch.testing.assert_close(got, ref[:, width - 1:-1], rtol=0, atol=1e-4 * float(ref.abs().max()),
                               msg=lambda m: f"{name}: compiled step logits against the model's forward\n{m}")


@pytest.mark.parametrize("name", ["mpt", "mistral"])
def test_context_and_row_buckets(name, search_cache):
    """The smaller buckets (16 slots, one row) give the same tokens: MPT slices its ALiBi table by the key length
    (the context), Mistral's window is cut within it; a batch of one prompt runs the one-row programs."""
    from egraft.runtime.generation import Bucket

    model = tiny_family(name)
    cm = egraft.compile(model, device="cpu", max_batch=MAX_BATCH, max_length=MAX_LENGTH, chunks=CHUNKS,
                        contexts=(16,), rows=(1,), cache=search_cache, progress=False, **SEARCH)
    programs = cm.generation.step_programs.programs
    ran = set()
    for b, p in list(programs.items()):
        programs[b] = (lambda b, p: lambda *a: (ran.add(b), p(*a))[1])(b, p)
    ids, mask = _prompts()
    for prompt, prompt_mask in [(ids, mask), (ids[1:], mask[1:])]:  # two rows, then the longer row alone
        want = _reference(model, prompt, prompt_mask, **GREEDY)
        got = cm.generate(prompt, prompt_mask, **GREEDY)
        assert torch.equal(got, want), (name, len(prompt), got, want)
    assert {Bucket(1, 16, 2), Bucket(1, MAX_LENGTH, 2), Bucket(8, 16, 2), Bucket(1, 16, 1), Bucket(1, MAX_LENGTH, 1),
            Bucket(8, 16, 1)} <= ran, sorted(ran)


# --- the matrix tests what it says ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mistral", "gemma2", "starcoder2"])
def test_sliding_windows_change_the_tokens(name):
    """With its window widened past the sequences a sliding-window family generates other tokens: the matrix's
    token equality depends on the step reproducing the window."""
    ids, mask = _prompts()
    model = tiny_family(name)
    want = _reference(model, ids, mask, **GREEDY)
    model.config.sliding_window = 4096
    assert not torch.equal(_reference(model, ids, mask, **GREEDY), want)


# --- what egraft refuses, before any compile work ------------------------------------------------------------------

@pytest.fixture
def nothing_compiled(monkeypatch):
    """Any export or program build fails the test: a refusal must come first."""
    import egraft.api.generation as api_generation
    from egraft.frontend import causal_lm

    def compiled(*args, **kwargs):
        raise AssertionError("a refused model was exported or compiled")

    monkeypatch.setattr(causal_lm, "export_program", compiled)
    monkeypatch.setattr(api_generation, "build", compiled)


def _compile(model):
    return egraft.compile(model, device="cpu", max_batch=MAX_BATCH, max_length=MAX_LENGTH, chunks=CHUNKS,
                          contexts=(), rows=(), cache=False, progress=False, **SEARCH)


def test_gpt_neo_local_attention_is_refused_by_name(nothing_compiled):
    """GPT-Neo's local layers mask keys with a causal buffer sliced from the end of the key length, not by
    position: the slot cache (each row at slots 0..n-1 of a longer cache) cannot follow it."""
    with pytest.raises(InputError, match=r"GPTNeoForCausalLM has local attention layers \(transformer\.h\.1\.attn"):
        _compile(tiny_family("gpt_neo"))


def test_other_constructs_are_refused_by_name(nothing_compiled):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, MambaConfig, MambaForCausalLM

    ids = dict(vocab_size=VOCAB, bos_token_id=2, eos_token_id=1, pad_token_id=PAD)
    mamba = MambaForCausalLM(MambaConfig(hidden_size=64, num_hidden_layers=2, **ids)).eval()
    with pytest.raises(InputError, match=r"MambaForCausalLM has layers of type \['linear_attention'\] "
                                         r"\(config\.layer_types\)"):
        _compile(mamba)
    mla = DeepseekV3ForCausalLM(DeepseekV3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2, intermediate_size=128,
        kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, **ids)).eval()
    with pytest.raises(InputError, match=r"DeepseekV3ForCausalLM uses multi-head latent attention "
                                         r"\(config\.kv_lora_rank=16"):
        _compile(mla)
    model = tiny_family("llama")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(InputError, match=r"attn_implementation='flex_attention'.*load the model with "
                                         r"attn_implementation='sdpa'"):
        _compile(model)


def test_a_model_the_step_does_not_reproduce_fails_its_check(monkeypatch, nothing_compiled):
    """The check against the model's own forward (causal_lm.check_step) is the net under the named refusals:
    GPT-Neo with its named refusal switched off is caught by its logits."""
    from egraft.frontend import causal_lm

    monkeypatch.setattr(causal_lm, "refuse_unsupported", lambda model: None)
    with pytest.raises(InputError, match=r"GPTNeoForCausalLM: egraft's slot-cache step does not compute the "
                                         r"model's logits on a left-padded batch \(row \d of lengths \[10, 5\]"):
        _compile(tiny_family("gpt_neo"))


def test_transformers_mask_interfaces_are_its_own_outside_a_step():
    """The step routes transformers' sdpa / eager mask interfaces through its slot masks only while it runs."""
    from transformers import masking_utils

    from egraft.frontend.causal_lm import eager_programs, step_module

    before = {k: masking_utils.ALL_MASK_ATTENTION_FUNCTIONS[k] for k in ("sdpa", "eager")}
    step = step_module(tiny_family("mistral"), MAX_BATCH, MAX_LENGTH, CHUNKS, contexts=(), rows=())  # runs it
    assert {k: masking_utils.ALL_MASK_ATTENTION_FUNCTIONS[k] for k in before} == before
    assert before == {"sdpa": masking_utils.sdpa_mask, "eager": masking_utils.eager_mask}
    ids, mask = _prompts()
    from egraft.runtime.generation import generate

    got = generate(eager_programs(step), step.state(), ids, mask, **GREEDY)
    assert torch.equal(got, _reference(step.model, ids, mask, **GREEDY))
