"""bench/prefill_plan.py: a prompt's planned prefill against the exact ladder, on a saved generation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import prefill_plan  # noqa: E402


def test_the_exact_ladder_is_the_largest_chunk_that_fits_each_time():
    assert prefill_plan.exact_ladder(15, (1, 4, 16)) == (4, 4, 4, 1, 1, 1)
    assert prefill_plan.exact_ladder(60, (1, 4, 16, 64)) == (16, 16, 16, 4, 4, 4)
    assert prefill_plan.exact_ladder(64, (1, 4, 16, 64)) == (64,) and prefill_plan.exact_ladder(0, (1,)) == ()


@pytest.mark.slow  # a bench script's whole run (compile, save, timing): by hand with -m slow
def test_a_tiny_model_is_compiled_timed_both_ways_and_recorded(tmp_path):
    out, art = tmp_path / "plan.json", tmp_path / "art"
    subprocess.run([sys.executable, str(ROOT / "bench" / "prefill_plan.py"), "--artifact", str(art), "--model",
                    "llama-tiny", "--dtype", "float32", "--budget", "2s", "--lengths", "3", "15", "--rounds", "1",
                    "--out", str(out)], check=True, cwd=ROOT)
    doc = json.loads(out.read_text())
    assert doc["host"]["cpu"] and doc["command"].startswith("python3 bench/prefill_plan.py")
    (three, fifteen) = doc["rows"]
    assert fifteen["exact"] == [4, 4, 4, 1, 1, 1] and fifteen["plan"] == [16] and three["plan"] == [4]
    assert all(r["same_token"] and r["median_ms"]["planned"] > 0 and r["exact_over_planned"] > 0
               for r in doc["rows"])
