"""``weight_copies=False`` (the default): every product reads its weight where the model stores it (no panel
copy), and the tokens are transformers'.  The search space it asks for; with copies allowed the rows layout is
never offered."""

from __future__ import annotations

import torch
from compiled_helpers import reference

from egraft.backends import get_backend
from egraft.backends.base import search_knobs

KW = dict(max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)


def _model(dtype):
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    with torch.random.fork_rng():
        torch.manual_seed(5)
        m = LlamaForCausalLM(LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                         num_hidden_layers=2, intermediate_size=256, vocab_size=160,
                                         bos_token_id=0, eos_token_id=1))
    m.lm_head.weight.data *= 8  # clear greedy choices in bfloat16, as a trained model's are
    return m.eval().to(dtype)


def test_the_search_space_holds_the_copy_free_knobs_only_when_asked():
    from egraft.ir import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", (2, 64), "float32")
    g = b.build([x @ b.weight("w", torch.randn(64, 128).numpy())])
    rec = get_backend("jax")
    copies, lean = search_knobs(rec, g, weight_copies=True), search_knobs(rec, g)
    assert copies["stream_layout"] == ["panels"] and 0 in copies["panels"] and len(copies["panels"]) > 1
    assert lean["stream_layout"] == ["rows"] and lean["panels"] == [0] and lean["stream"] == ["llvm"]
    assert {k: v for k, v in lean.items() if k not in rec.copy_free} == \
        {k: v for k, v in copies.items() if k not in rec.copy_free}
    from egraft.search import CompileConfig

    assert CompileConfig.parse().weight_copies is False


def test_a_generation_binds_no_panels_by_default_and_gives_transformers_tokens(search_cache):
    import egraft
    from egraft.runtime.derived import provenance

    for dtype in (torch.float32, torch.bfloat16):
        model = _model(dtype)
        cm = egraft.compile(model, device="cpu", backend="jax", budget="1s", max_batch=1, max_length=64,
                            chunks=(1, 4), contexts=(), cache=search_cache, progress=False)
        g = cm.generation
        decode = next(p for p in g.programs.values() if p.searched)
        assert decode.result.knobs.get("stream_layout") == "rows" and decode.result.knobs.get("panels") == 0
        for p in g.programs.values():
            ex = p.executable
            assert any(s.layout == "rows" for s in ex.program.kernels), p.result.knobs
            # no stored weight is read as panels (a value the search folded from weights, a fused QKV, is a new
            # array, laid out as the fold makes it; it is reported with the derived forms)
            held = list(ex._host) + list(ex.folded.values())
            for a in held:
                made = provenance(a)
                if made is not None and made[0] == "panels":
                    assert all(provenance(src) is not None for _, src in made[2]), "a stored weight's panels"
        ids = torch.randint(2, 160, (1, 6), generator=torch.Generator().manual_seed(9))
        assert cm.generate(ids, **KW).tolist() == reference(model, ids, None, **KW).tolist(), dtype
