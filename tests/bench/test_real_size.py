"""bench/real_size.py: the bytes a decode step reads, counted at each precision (the decode bound divides by them)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import real_size  # noqa: E402


def test_a_step_reads_a_torchao_layers_integers_and_scales_not_float32():
    pytest.importorskip("torchao")
    plain = real_size.build("llama-tiny", "float32")
    quantised = real_size._torchao(real_size.build("llama-tiny", "float32"), SimpleNamespace(quantize="torchao-int8"))
    linears = [m for m in plain.modules() if type(m).__name__ == "Linear"]
    floats = sum(m.weight.numel() * 4 for m in linears)
    int8 = sum(m.weight.numel() + m.weight.shape[0] * 4 for m in linears)  # values, one float32 scale a row
    row = plain.config.hidden_size * 4  # quantize_ unties the output layer: the input table then reads one row
    assert real_size.step_bytes(plain, 64) - real_size.step_bytes(quantised, 64) == floats - int8 - row
    w = quantised.model.layers[0].mlp.up_proj.weight
    assert real_size.nbytes(w) == w.qdata.numel() + w.scale.numel() * 4
    assert real_size._quantize(SimpleNamespace(quantize="torchao-int8")) is None  # egraft compiles it as it is
