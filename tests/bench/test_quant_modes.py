"""bench/quant_modes.py: each mode compiled in its own process, then one process timing every artifact,
interleaved, with each pair compared and each mode's tokens checked against its own quantised model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import quant_modes  # noqa: E402


@pytest.mark.slow  # a bench script's whole run (compile, save, timing children): by hand with -m slow
def test_a_tiny_run_times_both_modes_in_one_process_and_writes_the_record(tmp_path):
    # 16 new tokens: a decode step's time is the difference of two generate calls, and at 4 tokens of the tiny
    # model that difference fell below zero in every round on a loaded host (the suite beside it), which
    # egraft.measure.summarize rightly refuses
    # (two modes: the float32 baseline and the lossy one, whose quality the record adds; int8 takes the same path
    # as w8a8 here and compiles in the generation tests)
    out = tmp_path / "modes.json"
    assert quant_modes.main(["--model", "llama-tiny", "--modes", "none", "w8a8", "--budget", "2s",
                             "--rounds", "3", "--new", "16", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["host"]["cpu"] and doc["command"].startswith("python3 bench/quant_modes.py")
    assert doc["compile"]["w8a8"]["tokens_equal_quantised_model"], doc["compile"]["w8a8"]
    assert doc["compile"]["w8a8"]["quantization"]["mode"] == "w8a8"
    assert doc["timing"]["decode_tok_s"]["w8a8"] > 0
    assert "quality" in doc["compile"]["w8a8"]["quantization"]  # the lossy mode's distance, measured
    assert doc["compile"]["none"]["tokens_equal_quantised_model"] and doc["compile"]["none"]["quantization"] is None
    assert doc["timing"]["decode_tok_s"]["none"] > 0  # the float32 model: the baseline of a mode's speed-up
    assert set(doc["timing"]["vs"]) == {"none_over_w8a8", "w8a8_over_none"}
