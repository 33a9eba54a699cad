"""The results suite (``python -m bench``): its plan, the page built from raw results, the README block, the GPU mode.

The page is built here from synthetic raw results with known samples: one
workload where egraft is clearly faster than every peer (the conclusion
rule must state the ratio) and one where all variants draw from the same
distribution (it must say "not concluded" and register no ratio).  The
committed README is checked against the committed docs/results.json: every
ratio it quotes must be one the results record registered.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
import ingest  # noqa: E402
import page  # noqa: E402
import suite  # noqa: E402

RATIO = re.compile(r"(?<![\w.])\d+(?:\.\d+)?x\b")


def _timing(median: float, rng, n: int = 20, rel: float = 0.03) -> dict:
    s = (median * (1 + rel * rng.standard_normal(n))).tolist()
    return {"median": float(np.median(s)), "spread": 0.0, "n": n, "samples": s}


def _raw(rng) -> dict:
    machine = {"date": "2026-12-02", "command": "python -m bench --quick", "mode": "quick", "device": "cpu",
               "host": {"cpu": "Test CPU 9000", "cpu_id": "family 25 model 1, avx2", "logical_cores": 2, "memory_gib": 24.0, "os": "Linux"},
               "versions": {"python": "3.11", "torch": "2.13.0", "jax": "0.10.2", "egraft": "abc1234"},
               "per_threads": {"1": {"threads": 1, "cores": [1], "peak_flops_float32": 1.1e11, "peak_how": "test",
                                     "read_bandwidth": {"median": 2.0e10, "spread": 0.02, "n": 5,
                                                        "samples": [2e10] * 5}}}}
    fast = {v: _timing(m, rng) for v, m in (("eager", 2e-3), ("torch.compile", 1.9e-3), ("direct", 1.5e-3),
                                            ("greedy", 1.4e-3), ("searched", 1.0e-3))}
    same = {v: _timing(1e-3, rng, rel=0.2) for v in ("eager", "torch.compile", "direct", "greedy", "searched")}
    trials = [[i, 1.2e-3 - i * 1e-5, "timed", ""] for i in range(1, 11)] + [[11, None, "rejected", ""]]
    search = {"bench": "search", "date": "2026-12-02", "command": "python3 bench/search.py --quick", "quick": True,
              "device": "cpu", "threads": 1, "cores": [1], "versions": {},
              "rows": [{"workload": "fast_one", "timings": fast, "roofline_bound_s": 0.8e-3, "trials": trials,
                        "backend": "jax", "search_s": 3.0},
                       {"workload": "same_one", "timings": same, "roofline_bound_s": 0.5e-3, "trials": trials,
                        "backend": "jax", "search_s": 2.0}]}

    def config(step, prefill, toks_ok=True):
        steps = _timing(step, rng, n=5, rel=0.02)
        return {"batch": 1, "prompt": 16, "new_tokens": 8, "first_call_s": 1.0,
                "prefill": _timing(prefill, rng, n=5, rel=0.02), "decode_step": steps,
                "decode_tokens_per_s": {"median": 1 / steps["median"], "spread": 0.02, "n": 5,
                                        "samples": [1 / s for s in steps["samples"]]},
                "bound": {"tokens_per_s": 400.0, "fraction": 1 / steps["median"] / 400.0},
                "check": {"match": None if not toks_ok else True}}

    def run(system, step, prefill):
        return {"system": system, "model": "llama-tiny", "threads": 1, "status": "ok", "first_call_s": 2.0,
                "extra_bucket_s": None, "peak_rss_bytes": 500 << 20, "warnings": [], "tokens_match_reference": True,
                "configs": [config(step, prefill)]}

    generate = {"info": {"date": "2026-12-02", "command": "python3 bench/generate.py --quick",
                         "config": {"quick": True, "new_tokens": 8, "rounds": 5}},
                "bandwidth": {"1": {"bytes_per_s": {"median": 2e10, "spread": 0.02}, "cores": [1]}},
                "models": {}, "runs": [run("hf_eager", 5e-3, 10e-3), run("hf_static_inductor", 6e-3, 10e-3),
                                       run("egraft_compile", 2.5e-3, 10e-3)]}
    vs = {"speedup": 0.80, "interval": [0.76, 0.84], "conclusive": True, "why_not": ""}
    peers = {"date": "2026-12-03", "host": {"cpu": "Test CPU 9000", "cpu_id": "family 25 model 1, avx2"},
             "command": "python3 bench/peers.py --models llama-135m",
             "rows": [{"model": "llama-135m", "dtype": "float32", "budget": "60s",
                       "compile": {"compile_s": 81.0, "peak_rss": 2.5e9, "peak_over_weights": 4.6,
                                   "artifact_over_weights": 1.002, "tokens_equal": True},
                       "load": {"load_s": 2.7, "cold_load_s": 11.0, "decode_tok_s": {"egraft": 60.0, "hf_eager": 25.0},
                                "prefill_ms": {"egraft": 34.0, "hf_eager": 80.0}},
                       "runs": [{"threads": t, "decode_tok_s": {"egraft": e, "hf_eager": 25.0, "llama.cpp F32": f},
                                 **({"llama_cpp_extra_bufts": False} if t == 1 else {}),
                                 "prefill_ms": {"egraft": 34.0, "llama.cpp F32": 50.0},
                                 "decode_bound": {"tok_s": b, "share": {"egraft": e / b, "llama.cpp F32": f / b}},
                                 "egraft_vs": {"llama.cpp F32": vs if t == 2 else {**vs, "conclusive": False,
                                                                                     "why_not": "overlap"}}}
                                for t, e, f, b in ((1, 61.5, 57.0, 116.0), (2, 70.0, 87.5, 60.0))],
                       # (peers.py --vllm: vLLM in processes of its own, egraft and HF again beside it; one failed)
                       "vllm_runs": [{"threads": 1, "peer": "vllm",
                                      "decode_tok_s": {"egraft": 62.0, "hf_eager": 24.0, "vllm": 50.0},
                                      "prefill_ms": {"egraft": 35.0, "vllm": 30.0},
                                      "decode_bound": {"tok_s": 116.0, "share": {"egraft": 0.53, "vllm": 0.43}},
                                      "egraft_vs": {"vllm": {**vs, "speedup": 1.24, "interval": [1.2, 1.28]}}},
                                     {"error": "vLLM's engine did not start"}]}]}
    return {"machine": machine, "search-1t": search, "generate": generate, "peers_bound": peers}


def test_page_states_only_concluded_ratios(tmp_path):
    rng = np.random.default_rng(1234)
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Measured\n\n" + page.BEGIN + "\nold text 9.99x\n" + page.END + "\n\ntail\n")
    paths = page.write(_raw(rng), str(tmp_path), str(readme))
    res = json.loads((tmp_path / "results.json").read_text())  # strict JSON: loads without NaN
    by = {v["id"]: v for v in res["verdicts"]}

    fast = by["search-1t/fast_one"]
    assert fast["standing"] == "ahead" and fast["best_peer"] == "torch.compile" and fast["conclusive"]
    assert 1.7 < fast["ratio"] < 2.1 and res["ratios"]["search-1t/fast_one"]["text"] == ingest.ratio_text(fast["ratio"])
    assert fast["roofline_share"] == pytest.approx(0.8e-3 / np.median(_raw(np.random.default_rng(1234))["search-1t"]
                                                                     ["rows"][0]["timings"]["searched"]["samples"]))
    same = by["search-1t/same_one"]
    assert same["standing"] == "not concluded" and "search-1t/same_one" not in res["ratios"]
    assert "interval" in same["why_not"] or "spread" in same["why_not"]

    dec = by["generate/llama-tiny/1t/b1/p16/egraft_compile/decode"]
    assert dec["standing"] == "ahead" and dec["best_peer"] == "hf_eager" and 1.8 < dec["ratio"] < 2.2
    pre = by["generate/llama-tiny/1t/b1/p16/egraft_compile/prefill"]
    assert pre["standing"] == "not concluded"  # equal prefill medians: no ratio

    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# egraft: measured results") and "2026-12-02" in md and "Test CPU 9000" in md
    assert "Test CPU 9000 (family 25 model 1, avx2)" in md  # which host of that name: speeds differ between them
    assert "torch 2.13.0" in md and "20.0 GB/s" in md and "110 GFLOP/s" in md and "python -m bench --quick" in md
    assert "not concluded against" in md
    quoted = {r["text"] for r in res["ratios"].values()}
    assert set(RATIO.findall(md)) <= quoted  # every ratio on the page is a registered, concluded one

    for name in ("headline.png", "speedup.png", "decode.png", "search.png"):
        f = tmp_path / "results" / name
        assert f.exists() and f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(f) in paths, name
    assert not (tmp_path / "results" / "compile_depth.png").exists()  # no data: no plot

    assert "| peers_bound | llama-135m | float32 | 2 | 70.0 | F32 87.5 | 25.0 | F32: 0.80x |" in md
    assert res["ratios"]["peers_bound/llama-135m/float32/2t/llama.cpp F32"]["text"] == "0.80x"
    assert "peers_bound/llama-135m/float32/1t/llama.cpp F32" not in res["ratios"]  # not concluded: no ratio
    assert "| peers_bound | llama-135m | float32 | 1 | 62.0 | vLLM 50.0 | 24.0 | vLLM: 1.24x | 116 (53% / 43%) | 35 / 30 |" in md
    assert res["ratios"]["peers_bound/llama-135m/float32/1t/vllm-process/vllm"]["text"] == "1.24x"
    assert "| 1 | 61.5 | F32 57.0 (its extra buffer types off: they crashed) | 25.0 |" in md  # (a rerun without them)
    assert "peers_bound/llama-135m/float32/1t/vllm-process/hf_eager" not in res["ratios"]  # (none measured)

    text = readme.read_text()
    assert "9.99x" not in text and text.endswith("\n\ntail\n") and page.BEGIN in text and page.END in text
    block = text.split(page.BEGIN)[1].split(page.END)[0]
    assert set(RATIO.findall(block)) <= quoted
    # the README's table: every number from the page's rows; a bound below a measured speed is not shown
    assert "| 135 M float32 | 61.5 / 70.0 | F32 57.0 / 87.5 | 25.0 | 116 / n/a † |" in block
    assert "Compile 81-81 s" in block and "ahead of the fastest peer on 2" in block


def test_host_names_the_cpu_family_and_vector_extensions():
    import machine

    h = machine.host()
    assert h["cpu_id"] and h["cpu_id"] in machine.host_line(h)


def test_readme_without_block_is_a_clear_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no block here\n")
    with pytest.raises(SystemExit, match="no results block"):
        page.update_readme(str(readme), page.BEGIN + "\n" + page.END)
    assert readme.read_text() == "# no block here\n"  # nothing lost


def test_every_ratio_the_readme_quotes_is_in_results_json():
    res = json.loads((ROOT / "docs" / "results.json").read_text())
    known = {r["text"] for r in res["ratios"].values()}
    quoted = RATIO.findall((ROOT / "README.md").read_text())
    missing = sorted(set(quoted) - known)
    assert not missing, f"README quotes ratios that docs/results.json does not hold: {missing}"
    assert page.BEGIN in (ROOT / "README.md").read_text()


def test_plan_covers_every_benchmark():
    scripts = {s.script for q in (False, True) for s in suite.plan(q, "cpu")}
    for f in sorted(p.name for p in BENCH.glob("*.py")):
        assert f in scripts or f in suite.PARTS or f in suite.BY_HAND, f"bench/{f} is in no step of the suite"
    full = [s.name for s in suite.plan(False, "cpu")]
    assert full == ["trace", "saturation", "compile_depth", "search-1t", "search-2t", "call_overhead", "generate"]
    quick = suite.plan(True, "cpu")
    assert all("--quick" in s.args for s in quick) and sum(s.minutes for s in quick) < 10
    assert any("--device" in s.args and "cuda" in s.args for s in suite.plan(False, "cuda"))


def test_unknown_step_is_refused():
    p = subprocess.run([sys.executable, "-m", "bench", "--only", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "unknown step" in p.stderr and "search-1t" in p.stderr


@pytest.mark.host_specific
@pytest.mark.skipif(os.environ.get("EGRAFT_TEST_DEVICE") == "cuda", reason="a GPU is present: the mode would run")
def test_cuda_mode_without_a_gpu_fails_clearly(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the cuda mode would run")
    p = subprocess.run([sys.executable, "-m", "bench", "--device", "cuda", "--quick", "--out-dir", str(tmp_path),
                        "--readme", ""], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "needs an NVIDIA GPU" in p.stderr and "make results" in p.stderr
    assert not any(tmp_path.iterdir())  # nothing measured, nothing written
