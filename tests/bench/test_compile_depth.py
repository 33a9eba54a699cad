"""bench/compile_depth.py: its growth fit on synthetic data, and one tiny run end to end.

The fit must give back the coefficients synthetic data was made from (a
straight line, a power law, and a noisy line close to its own), and refuse
what it cannot fit.  Then the script runs as a user runs it, on the tiniest
stacks (1 and 2 layers, hidden 64, 2 heads, sequence 16, a 1 s search), and
its JSON is checked: the envelope, one row per depth whose phases are
non-negative and add up to the measured total, and a fit per phase.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import compile_depth as cd  # noqa: E402
import envelope  # noqa: E402


def test_the_fit_recovers_a_straight_line():
    L = [1, 2, 4, 8, 12, 24]
    f = cd.fit_growth(L, [0.7 + 0.25 * n for n in L])
    assert f["linear"]["a"] == pytest.approx(0.7) and f["linear"]["b"] == pytest.approx(0.25)
    assert f["linear"]["r2"] == pytest.approx(1.0)
    assert f["power"]["r2"] < 1.0  # a line with an intercept is no power law


def test_the_fit_recovers_a_power_law():
    L = [1, 2, 4, 8, 12, 24]
    f = cd.fit_growth(L, [3.0 * n ** 0.3 for n in L])
    assert f["power"]["c"] == pytest.approx(3.0) and f["power"]["k"] == pytest.approx(0.3)
    assert f["power"]["r2"] == pytest.approx(1.0)
    assert f["linear"]["r2"] < 1.0


def test_noisy_data_fits_near_its_coefficients_with_r2_below_one():
    rng = np.random.default_rng(int(os.environ["EGRAFT_SEED"]))
    L = np.repeat([1, 2, 4, 8, 12, 24], 20)
    t = 2.0 + 0.5 * L + rng.normal(0.0, 0.05, L.shape)
    f = cd.fit_growth(L.tolist(), t.tolist())
    assert f["linear"]["a"] == pytest.approx(2.0, abs=0.05) and f["linear"]["b"] == pytest.approx(0.5, abs=0.005)
    assert 0.99 < f["linear"]["r2"] < 1.0


def test_a_zero_time_has_no_power_law_and_one_depth_no_fit():
    f = cd.fit_growth([1, 2, 4], [0.0, 0.0, 0.0])
    assert f["linear"] == {"a": 0.0, "b": 0.0, "r2": 1.0}
    assert f["power"]["k"] is None and "0 s" in f["power"]["note"]
    with pytest.raises(ValueError, match="two distinct depths"):
        cd.fit_growth([4, 4], [1.0, 1.1])


def test_with_reps_the_row_is_the_rep_of_the_median_total():
    reps = [{"total_s": t, "id": i} for i, t in enumerate([5.0, 3.0, 9.0, 4.0])]
    assert cd._median_rep(reps)["id"] == 3  # totals 3, 4, 5, 9: the lower middle one
    assert cd._median_rep(reps[:3])["id"] == 0  # 3, 5, 9
    assert cd._median_rep(reps[1:2])["id"] == 1


@pytest.mark.slow  # a bench script's whole run (compile, save, timing children): by hand with -m slow
def test_a_tiny_run_writes_the_record(tmp_path):
    out = tmp_path / "depth.json"
    cmd = [sys.executable, str(BENCH / "compile_depth.py"), "--layers", "1", "2", "--hidden", "64", "--heads", "2",
           "--seq", "16", "--budget", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=BENCH.parent, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    doc = json.loads(text)

    assert doc["bench"] == "compile_depth" and doc["quick"] is False and doc["device"] == "cpu"
    assert doc["command"] == ("python3 bench/compile_depth.py --layers 1 2 --hidden 64 --heads 2 --seq 16 "
                              f"--budget 1 --out {out}")
    assert doc["threads"] == 1 and len(doc["cores"]) == 1
    assert set(doc["versions"]) == {"python", *envelope.VERSIONS} and doc["versions"]["torch"]
    assert len(doc["date"]) == 10 and doc["date"][4] == doc["date"][7] == "-"
    assert (doc["model"]["hidden"], doc["model"]["heads"], doc["model"]["seq"]) == (64, 2, 16)
    assert doc["compile"]["budget_s"] == 1.0 and doc["compile"]["cache"] is False

    assert [r["layers"] for r in doc["rows"]] == [1, 2]
    one, two = doc["rows"]
    assert two["ir_nodes"] > one["ir_nodes"] > 0 and two["parameters"] > one["parameters"] > 0
    for r in doc["rows"]:
        assert set(r["phases"]) == set(cd.PHASES)
        assert all(v >= 0 for v in r["phases"].values()), r["phases"]
        assert r["phases"]["trace"] > 0 and r["phases"]["saturate"] > 0 and r["phases"]["search"] > 0
        assert sum(r["phases"].values()) <= r["total_s"] + 1e-3
        assert r["total_s"] - sum(r["phases"].values()) < 1e-3  # "other" is the remainder: nothing is lost
        assert r["winner_lower_s"] > 0 and r["process_s"] > r["total_s"] and r["total_cpu_s"] > 0
        assert "reps" not in r  # one rep: no raw list
    assert set(doc["fits"]) == {*cd.PHASES, "total", "winner_lower"}
    for name, f in doc["fits"].items():
        assert set(f["linear"]) == {"a", "b", "r2"} and {"c", "k", "r2"} <= set(f["power"]), name
        assert all(math.isfinite(v) for v in f["linear"].values()), name
    assert doc["fits"]["total"]["power"]["k"] is not None
    assert "| layers | IR nodes |" in p.stdout and "total grows as L^" in p.stdout
    assert p.stderr.count("compile_depth: L=") == 2
