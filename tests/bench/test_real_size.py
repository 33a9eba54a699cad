"""bench/real_models.py: the bytes a decode step reads, counted at each precision (the decode bound divides by
them); the real-size page's wording."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import real_models  # noqa: E402


def test_a_step_reads_a_torchao_layers_integers_and_scales_not_float32():
    pytest.importorskip("torchao")
    plain = real_models.build("llama-tiny", "float32")
    quantised = real_models.torchao_quantized(real_models.build("llama-tiny", "float32"), SimpleNamespace(quantize="torchao-int8"))
    linears = [m for m in plain.modules() if type(m).__name__ == "Linear"]
    floats = sum(m.weight.numel() * 4 for m in linears)
    int8 = sum(m.weight.numel() + m.weight.shape[0] * 4 for m in linears)  # values, one float32 scale a row
    row = plain.config.hidden_size * 4  # quantize_ unties the output layer: the input table then reads one row
    assert real_models.step_bytes(plain, 64) - real_models.step_bytes(quantised, 64) == floats - int8 - row
    w = quantised.model.layers[0].mlp.up_proj.weight
    assert real_models.nbytes(w) == w.qdata.numel() + w.scale.numel() * 4
    assert real_models.quantize_mode(SimpleNamespace(quantize="torchao-int8")) is None  # egraft compiles it as it is


def test_a_gptq_run_compiles_the_checkpoint_read_back_and_runs_its_dequantised_float_model_beside_it():
    from egraft.frontend.quantize import QuantizedLinear

    a = SimpleNamespace(model="llama-tiny", dtype="float32", quantize="gptq-int4", group_size=64)
    model, peer = real_models.model_for(a), real_models.model_for(a, peer=True)
    assert real_models.quantize_mode(a) is None  # compiled as it is
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    assert len(layers) == 14 and all(m.source == "gptq" and m.zero_offset is not None for m in layers.values())
    peers = dict(peer.named_modules())
    assert all(torch.equal(m.dequantized(), peers[n].weight) for n, m in layers.items())
    # a step reads the int4 values, the scales and the zero offsets, not float32 weights
    assert real_models.step_bytes(model, 64) < real_models.step_bytes(peer, 64)


def test_a_run_with_inductor_states_its_decode_and_the_concluded_ratio_on_the_page():
    import ingest
    import page_sizes

    vs = {"speedup": 1.5, "interval": [1.4, 1.6], "conclusive": True, "why_not": ""}
    row = {"model": "llama-135m", "dtype": "float32", "quantize": "none", "compile": {"compile_s": 100.0},
           "load": {"decode_tok_s": {"egraft": 30.0, "hf_eager": 10.0, "hf_static_inductor": 20.0},
                    "egraft_vs_hf_eager": {**vs, "speedup": 3.0}, "egraft_vs_hf_static_inductor": vs}}
    ratios = ingest.Ratios()
    sec = ingest.sizes_section({"rows": [row]}, "real_size", ratios)
    cells = page_sizes.compile_rows("real_size", sec)[0]
    assert any("Inductor 20.0 tok/s, 1.50x" in str(c) for c in cells), cells
    assert ratios.items["real_size/llama-135m/float32/hf_static_inductor"]["value"] == 1.5
    row["load"]["egraft_vs_hf_static_inductor"] = {**vs, "conclusive": False, "why_not": "spread"}
    cells = page_sizes.compile_rows("real_size", ingest.sizes_section({"rows": [row]}, "real_size", ingest.Ratios()))[0]
    assert any("Inductor 20.0 tok/s, n.c." in str(c) for c in cells), cells


def test_a_batch_whose_transformers_run_differs_from_its_rows_alone_says_which_reference_the_tokens_equal():
    import ingest
    import page_sizes

    row = {"model": "llama-135m", "dtype": "bfloat16", "quantize": "none", "load": {},
           "compile": {"compile_s": 100.0, "tokens_equal": False, "tokens_equal_each_row_alone": True}}
    cells = page_sizes.compile_rows("real_size", ingest.sizes_section({"rows": [row]}, "real_size", ingest.Ratios()))[0]
    assert cells[-1] == "equal each row alone (transformers' batch differs)"
    row["compile"]["tokens_equal_each_row_alone"] = False
    cells = page_sizes.compile_rows("real_size", ingest.sizes_section({"rows": [row]}, "real_size", ingest.Ratios()))[0]
    assert cells[-1] == "**differ**"
