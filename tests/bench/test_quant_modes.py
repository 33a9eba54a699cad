"""bench/quant_modes.py: each mode compiled in its own process, then one process timing every artifact,
interleaved, with each pair compared and each mode's tokens checked against its own quantised model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import quant_modes  # noqa: E402


def test_a_tiny_run_times_both_modes_in_one_process_and_writes_the_record(tmp_path):
    # 16 new tokens: a decode step's time is the difference of two generate calls, and at 4 tokens of the tiny
    # model that difference fell below zero in every round on a loaded host (the suite beside it), which
    # egraft.measure.summarize rightly refuses
    out = tmp_path / "modes.json"
    assert quant_modes.main(["--model", "llama-tiny", "--modes", "none", "int8", "w8a8", "--budget", "2s",
                             "--rounds", "3", "--new", "16", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["host"]["cpu"] and doc["command"].startswith("python3 bench/quant_modes.py")
    for mode in ("int8", "w8a8"):
        assert doc["compile"][mode]["tokens_equal_quantised_model"], doc["compile"][mode]
        assert doc["compile"][mode]["quantization"]["mode"] == mode
        assert doc["timing"]["decode_tok_s"][mode] > 0
    assert "quality" in doc["compile"]["w8a8"]["quantization"]  # the lossy mode's distance, measured
    assert doc["compile"]["none"]["tokens_equal_quantised_model"] and doc["compile"]["none"]["quantization"] is None
    assert doc["timing"]["decode_tok_s"]["none"] > 0  # the float32 model: the baseline of a mode's speed-up
    assert set(doc["timing"]["vs"]) == {f"{x}_over_{y}" for x in ("none", "int8", "w8a8")
                                        for y in ("none", "int8", "w8a8") if x != y}
