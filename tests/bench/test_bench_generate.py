"""bench/generate.py's plumbing: the quick mode for HF eager on a tiny model, and the decode bound's byte counts.

The full benchmark runs by hand (``make bench-generate``); here one worker
process runs HF eager on the tiny Llama (prompt 16, batch 1, 8 tokens, one
core) and the JSON is checked field by field, a system whose environment
is missing must come back as a "not run: ..." row, and the bound's
parameter and KV-cache byte counts are checked against real transformers
models and the cache a forward pass actually fills.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import generate_models as gm  # noqa: E402


def test_quick_mode_plumbing_for_hf_eager(tmp_path):
    out = tmp_path / "generate.json"
    missing = tmp_path / "no-such-venv"
    cmd = [sys.executable, str(BENCH / "generate.py"), "--quick", "--systems", "hf_eager", "vllm",
           "--vllm-venv", str(missing), "--rounds", "2", "--bw-repeats", "3", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=BENCH.parent, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert Path(str(out)[:-5] + ".log").exists()

    info = res["info"]
    assert info["config"]["models"] == ["llama-tiny"] and info["config"]["threads"] == [1]
    assert info["command"].startswith("python3 bench/generate.py --quick")
    assert "torch" in info["versions_line"] and info["machine"]
    bw = res["bandwidth"]["1"]
    assert bw["cores"] and len(bw["seconds"]) == 3 and bw["bytes"] == 256 << 20
    assert 1e8 < bw["bytes_per_s"]["median"] < 1e13  # 0.1 GB/s .. 10 TB/s: a real measurement

    eager, vllm = res["runs"]
    assert (eager["system"], eager["status"], eager["threads"]) == ("hf_eager", "ok", 1)
    assert eager["parameters"] == gm.parameter_counts("llama-tiny")["total"] and "bound_note" not in eager
    assert eager["peak_rss_bytes"] >= eager["memory_after_setup"]["VmRSS"] > 50 << 20
    assert eager["first_call_s"] > 0 and eager["extra_bucket_s"] is None  # one config: no extra bucket
    (c,) = eager["configs"]
    assert (c["batch"], c["prompt"], c["new_tokens"], c["role"]) == (1, 16, 8, "model's first call")
    (toks,) = c["tokens"]
    assert len(toks) == 8 and all(0 <= t < gm.MODELS["llama-tiny"]["vocab"] for t in toks)
    assert c["repeats_tokens"] is True and c["check"] == {"match": None}  # the reference checks nothing
    for key in ("prefill", "generate", "decode_step", "decode_tokens_per_s"):
        assert c[key]["n"] == 2 and c[key]["median"] > 0 and math.isfinite(c[key]["spread"]), key
    assert c["generate"]["median"] > c["prefill"]["median"]
    b = c["bound"]
    assert b["tokens_per_s"] > 0
    assert b["fraction"] == pytest.approx(c["decode_tokens_per_s"]["median"] / b["tokens_per_s"])

    assert vllm["system"] == "vllm" and vllm["status"].startswith("not run: no vLLM virtual environment at")
    assert str(missing) in vllm["status"]
    assert "| HF eager (dynamic cache) | 1 |" in res["table"] and "reference" in res["table"]
    assert "not run: no vLLM virtual environment" in res["table"] and res["table"] in p.stdout


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_bound_bytes_match_the_real_model(name):
    """The bound's parameter count is the model's; the KV bytes are those of the cache a forward fills."""
    import torch

    model = gm.build(name)
    m = gm.MODELS[name]
    params = dict(model.named_parameters())
    assert sum(p.numel() for p in params.values()) == gm.parameter_counts(name)["total"]
    batch, length = 3, 11
    # what a step reads: everything but the gathered table, plus one row of it per sequence (llama) or one
    # position row (gpt2; its token table is the tied output projection, read in full)
    gathered = "model.embed_tokens.weight" if m["kind"] == "llama" else "transformer.wpe.weight"
    rows = batch if m["kind"] == "llama" else 1
    want = 4 * (sum(p.numel() for k, p in params.items() if k != gathered) + rows * m["hidden"])
    assert gm.weight_bytes_per_step(name, batch) == want
    ids = torch.randint(0, m["vocab"], (batch, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    filled = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert gm.kv_bytes(name, batch, length) == filled
    bound = gm.decode_bound(name, batch, length, 5, 1e10)
    per_step = [want + gm.kv_bytes(name, batch, length + k) for k in (1, 2, 3, 4)]
    assert bound["bytes_per_step_mean"] == sum(per_step) / 4
    assert bound["tokens_per_s"] == pytest.approx(batch * 4 / (sum(per_step) / 1e10))


def test_a_token_mismatch_is_reported_with_its_first_position():
    import generate

    ref = [[5, 6, 7, 8], [1, 2, 3, 4]]
    assert generate._compare([[5, 6, 7, 8], [1, 2, 3, 4]], ref) == {"match": True, "mismatches": []}
    got = generate._compare([[5, 6, 7, 8], [1, 2, 9, 9]], ref)
    assert got["match"] is False
    assert got["mismatches"] == [{"sequence": 1, "first_difference": 2, "got": [9, 9], "want": [3, 4]}]
    short = generate._compare([[5, 6]], ref)  # a system that returned fewer sequences / tokens
    assert short["match"] is False and {m["sequence"] for m in short["mismatches"]} == {0, None}
