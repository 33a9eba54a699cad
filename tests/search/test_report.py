"""SearchResult reports (text, JSON, PNG) and the search's progress bar."""

import io
import json
import math
import sys

import numpy as np
import pytest

from egraft.ir import GraphBuilder
from egraft.search.progress import Progress
from egraft.search.report import fmt_time, render
from egraft.search.result import Round, SearchResult, Trial

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
INF, NAN = math.inf, math.nan


def _graph():
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    w = b.weight("w", np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32))
    return b.build([(x @ w).softmax(-1)])


def _trials():
    spec = [("timed", 2e-3, ""), ("rejected", INF, ""), ("timed", 1.5e-3, ""), ("failed", INF, ""),
            ("pruned", INF, ""), ("timed", 3e-3, ""), ("timed", 1.2e-3, ""), ("estimated", 1.1e-3, "")]
    return [Trial(index=i, key=f"k{i}", status=s, time_s=t, spread=0.02 if s == "timed" else 0.0,
                  estimate_s=NAN if s == "failed" else 4e-4, backend="triton", generation=i // 3, block=b,
                  message="mismatch" if s == "rejected" else "")
            for i, (s, t, b) in enumerate(spec)]


def _result(**kw):
    args = dict(
        graph=_graph(), backend="triton", knobs={"block": 128, "warps": 4}, time_s=1.2e-3, baseline_time_s=2.4e-3,
        history=[Round(0, INF, 2, 0, 1, 0, 0.1), Round(1, 1.5e-3, 5, 2, 2, 1, 0.5),
                 Round(2, 1.2e-3, 8, 4, 2, 3, 1.2)],
        counts={"timed": 4, "rejected": 1, "failed": 1, "pruned": 1, "cached": 3}, device="cpu", seed=7,
        spread=0.03, baseline_spread=0.02, estimate_s=4e-4, baseline_estimate_s=9e-4, search_s=2.5,
        stages={"saturate": 0.4, "search": 1.8, "final": 0.3}, trials=_trials(),
        blocks={"distinct": 1, "occurrences": 12}, rank_correlation=0.81, notes=["a note for the user"])
    args.update(kw)
    return SearchResult(**args)


# --- text -----------------------------------------------------------------------------------------

def test_text_report_says_what_was_chosen_and_how_it_compares():
    r = _result()
    text = render(r, "text", None)
    assert text == r.report()
    for want in ("triton", "block=128", "cpu", "1.2 ms", "2.4 ms", "±3.0%", "2.00x over direct lowering",
                 "400 µs", "4 timed", "1 rejected", "1 failed", "1 pruned", "3 cached", "2.5 s", "saturate",
                 "1 distinct block", "12 occurrences", "0.81", "a note for the user", "measured"):
        assert want in text, (want, text)
    assert "spread is too large" not in text and "estimated by the cost model" not in text
    assert "nan" not in text.lower() and "inf" not in text.lower().replace("info", "")
    # the history table: one row per generation, the inf best shown as "-"
    table = text.split("history")[1].split("notes")[0].strip().splitlines()
    assert table[0].split()[:2] == ["gen", "best"] and len(table) == 4 and table[1].split()[1] == "-"


def test_text_report_lists_the_final_comparison_and_a_tie():
    rows = [{"label": "direct", "backend": "jax", "key": "a", "time_s": 2.4e-3, "spread": 0.02, "estimate_s": NAN},
            {"label": "greedy/jax", "backend": "jax", "key": "b", "time_s": 1.3e-3, "spread": 0.02,
             "estimate_s": NAN},
            {"label": "searched", "backend": "triton", "key": "c", "time_s": 1.2e-3, "spread": 0.03,
             "estimate_s": 4e-4}]
    verdict = {"speedup": 2.0, "interval": (0.9, 3.0), "conclusive": False,
               "why_not": "the 95 % intervals of the medians overlap"}
    text = _result(compared=rows, verdict=verdict).report("text")
    assert "searched 1.2 ms, greedy/jax 1.3 ms, direct 2.4 ms" in text
    assert "within noise: the 95 % intervals of the medians overlap" in text and "spread is too large" not in text
    s = json.loads(_result(compared=rows, verdict=verdict).report("json"))
    assert [r["label"] for r in s["compared"]] == ["direct", "greedy/jax", "searched"]
    assert s["verdict"]["conclusive"] is False


def test_text_report_warns_when_noisy_and_says_estimated_under_the_model():
    text = _result(noisy=True).report("text")
    assert "the spread is too large to conclude a speed-up" in text
    text = _result(fitness="model", from_cache=True, interrupted=True, rank_correlation=NAN).report("text")
    assert "estimated by the cost model, not measured" in text
    assert "from the cache" in text and "interrupted" in text and "Spearman" not in text
    assert "±" not in text.split("speed-up")[0].split("fitness")[1]  # estimates have no spread


def test_text_report_copes_with_missing_times_and_long_histories(tmp_path):
    hist = [Round(i, 1e-3 / (i + 1), i, i, 0, 0, float(i)) for i in range(40)]
    r = _result(time_s=INF, estimate_s=NAN, baseline_time_s=NAN, history=hist, blocks={}, stages={}, counts={})
    out = tmp_path / "r.txt"
    text = r.report("text", str(out))
    assert "n/a" in text and "generations elided" in text and "blocks" not in text
    assert out.read_text(encoding="utf-8") == text


def test_fmt_time_units():
    assert [fmt_time(x) for x in (2.5e-6, 1.5e-3, 0.99996, 3.0, INF, NAN)] == [
        "2.5 µs", "1.5 ms", "1 s", "3 s", "n/a", "n/a"]


# --- json -----------------------------------------------------------------------------------------

def test_json_report_is_strict_and_round_trips(tmp_path):
    r = _result(estimate_s=NAN, rank_correlation=NAN, stages={"saturate": NAN, "search": 1.0},
                knobs={"block": np.int64(64)})
    out = tmp_path / "r.json"
    text = r.report("json", str(out))
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(out.read_text()) == json.loads(text)
    d = json.loads(text)
    assert d["backend"] == "triton" and d["device"] == "cpu" and d["knobs"] == {"block": 64}
    assert d["time_s"] == pytest.approx(1.2e-3) and d["speedup"] == pytest.approx(2.0)
    assert d["estimate_s"] is None and d["rank_correlation"] is None and d["stages"]["saturate"] is None
    assert d["counts"]["rejected"] == 1 and len(d["trials"]) == 8 and len(d["history"]) == 3
    assert d["trials"][1]["time_s"] is None and d["trials"][1]["status"] == "rejected"
    assert d["history"][0]["best_s"] is None and d["program"]["hash"] == r.graph.structural_hash()


# --- png ------------------------------------------------------------------------------------------

def _is_png(path):
    data = path.read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > 5000


def test_png_report_writes_a_png(tmp_path):
    had_pyplot = "matplotlib.pyplot" in sys.modules
    out = tmp_path / "search.png"
    assert _result(noisy=True).report("png", str(out)) == str(out)
    assert _is_png(out)
    assert had_pyplot or "matplotlib.pyplot" not in sys.modules  # the user's pyplot state is left alone
    # several blocks: one curve each
    trials = [Trial(i, f"k{i}", "timed", 1e-3 * (1 + i % 3), 0.01, 5e-4, "triton", 0, block=f"b{i % 2}")
              for i in range(10)]
    out2 = tmp_path / "blocks.png"
    _result(trials=trials, blocks={"distinct": 2, "occurrences": 24}).report("png", str(out2))
    assert _is_png(out2)


def test_png_report_with_no_trials_and_no_times(tmp_path):
    out = tmp_path / "cached.png"
    render(_result(trials=[], history=[], from_cache=True), "png", str(out))
    assert _is_png(out)
    out2 = tmp_path / "empty.png"
    render(_result(trials=[], time_s=INF, baseline_time_s=NAN, estimate_s=NAN), "png", str(out2))
    assert _is_png(out2)


def test_png_needs_a_path_and_unknown_formats_are_refused():
    r = _result()
    with pytest.raises(ValueError, match="needs a path"):
        r.report("png")
    with pytest.raises(ValueError, match="'text', 'json', 'png'"):
        r.report("html")


# --- progress -------------------------------------------------------------------------------------

def test_progress_shows_generation_timed_and_speedup():
    stream = io.StringIO()
    with Progress(budget_s=10.0, trials=100, enabled=True, stream=stream) as p:
        p.update(1, 10, 8, 2e-3, 4e-3)
        p.note("saturated: 120 classes")
        p.update(2, 20, 17, 1e-3, 4e-3, block="layer0")
        assert 0.2 <= p.fraction() <= 1.0
    out = stream.getvalue()
    assert "gen 2" in out and "17 timed" in out and "best 1 ms" in out and "4.00x over direct" in out
    assert "saturated: 120 classes" in out and "layer0" in out
    assert p._live is None


def test_progress_without_budget_and_with_bad_times():
    stream = io.StringIO()
    with Progress(enabled=True, stream=stream, label="blocks") as p:
        assert not p.bounded and p.fraction() == 0.0
        p.update(0, 0, 0, INF, NAN)
        p.update(1, 3, 0, NAN, 1e-3)
        p.update(2, 5, 1, 0.0, INF)
    assert "gen 2" in stream.getvalue() and "blocks" in stream.getvalue()


def test_progress_disabled_is_silent_and_never_touches_rich(monkeypatch):
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")]:
        monkeypatch.setitem(sys.modules, name, None)  # any rich import would now fail
    monkeypatch.setitem(sys.modules, "rich", None)
    stream = io.StringIO()
    with Progress(budget_s=5, trials=10, enabled=False, stream=stream) as p:
        p.update(1, 2, 1, 1e-3, 2e-3)
        p.note("hello")
    assert stream.getvalue() == "" and p._live is None
    # the default: on only for a terminal (a StringIO is not one)
    with Progress(stream=io.StringIO()) as q:
        q.update(1, 1, 1, 1e-3, 1e-3)
    assert not q.enabled and q._live is None


def test_progress_stops_when_interrupted():
    stream = io.StringIO()
    p = Progress(budget_s=1.0, enabled=True, stream=stream)
    with pytest.raises(KeyboardInterrupt):
        with p:
            p.update(1, 1, 1, 1e-3, 2e-3)
            raise KeyboardInterrupt
    assert p._live is None and "gen 1" in stream.getvalue()
    with pytest.raises(RuntimeError, match="boom"):
        with Progress(enabled=True, stream=io.StringIO()):
            raise RuntimeError("boom")
