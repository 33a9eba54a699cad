"""The JSON files of bench/trace_time.py, saturation.py, call_overhead.py and search.py, at their smallest.

Each script runs once in a subprocess, ``--quick`` with the smallest
settings its flags allow and ``--out`` into the test's folder; the file
must be strict JSON holding bench/envelope.py's envelope (the exact command,
this interpreter's and libraries' versions, the cores the script ran on)
and the benchmark's own keys, every timing a record whose median is its
samples' median, from which ``egraft.measure.compare`` gives back the
verdicts the file holds.  ``search.py --device cuda`` on a machine without a
GPU must stop at once with status 2 and say what is missing and what to do.
Nothing here judges a speed: the numbers are whatever this machine gave.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
import envelope  # noqa: E402

ENVELOPE = {"bench", "date", "command", "quick", "device", "threads", "cores", "versions"}
VERSIONS = {"python", "torch", "jax", "jaxlib", "numpy", "egglog", "deap", "triton", "transformers"}
TIMING = {"median", "spread", "n", "samples"}


def _strict(text: str):
    def refuse(token):
        raise AssertionError(f"non-strict JSON token {token} in the benchmark's file")

    return json.loads(text, parse_constant=refuse)


def run(script: str, args: list[str], tmp_path, timeout: float = 240):
    """Run bench/`script` with `args` (``--out`` added); its record and the process."""
    out = tmp_path / f"{script}.json"
    argv = [*args, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EGRAFT_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, str(BENCH / script), *argv], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    record = _strict(out.read_text())
    check_envelope(record, script, argv)
    return record, p


def check_envelope(record: dict, script: str, argv: list[str]) -> None:
    assert ENVELOPE <= set(record)
    assert record["bench"] == {"trace_time.py": "trace"}.get(script, script[:-3])
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"])
    assert record["command"] == shlex.join(["python3", f"bench/{script}", *argv])
    assert record["quick"] is ("--quick" in argv) and record["device"] == "cpu"
    assert isinstance(record["threads"], int) and record["threads"] >= 1
    assert record["cores"] and set(record["cores"]) <= os.sched_getaffinity(0)
    assert all(isinstance(c, int) for c in record["cores"])
    v = record["versions"]
    assert set(v) == VERSIONS
    assert v["python"] == platform.python_version() and v["numpy"] == np.__version__
    assert all(isinstance(v[k], str) and v[k] for k in VERSIONS - {"triton", "transformers"})


def check_timing(t: dict, n: int | None = None) -> None:
    assert set(t) == TIMING
    assert t["n"] == len(t["samples"]) > 0 and (n is None or t["n"] == n)
    assert all(s > 0 for s in t["samples"])
    assert t["median"] == pytest.approx(statistics.median(t["samples"]), rel=1e-12)
    assert t["spread"] >= 0


def test_trace_time(tmp_path):
    rec, p = run("trace_time.py", ["--quick", "--runs", "1"], tmp_path)
    assert rec["settings"] == {"runs": 1}  # the explicit flag wins over the quick default (2)
    m = rec["model"]
    assert (m["layers"], m["hidden"], m["seq"], m["batch"]) == (12, 768, 128, 1)
    assert m["parameters"] > 80e6 and m["ir_nodes"] > 1000 and m["weights"] > 100
    for key in ("export_s", "lower_s", "total_s"):
        check_timing(rec[key], 1)
    assert rec["total_s"]["samples"][0] == pytest.approx(rec["export_s"]["samples"][0] + rec["lower_s"]["samples"][0])
    assert f"graph: {m['ir_nodes']} IR nodes, {m['weights']} weights" in p.stdout


def test_saturation(tmp_path):
    rec, p = run("saturation.py", ["--quick", "--layers", "1", "--no-llama"], tmp_path)
    assert rec["settings"]["layers"] == [1] and rec["settings"]["reps"] == 1 and rec["settings"]["llama"] is False
    rows = rec["rows"]
    assert [(r["model"], r["layers"], r["mode"]) for r in rows] == [("gpt2_stack", 1, "plain"),
                                                                    ("gpt2_stack", 1, "layered")]
    for r in rows:
        assert r["ir_nodes"] > 50 and r["enodes"] >= r["ir_nodes"]
        check_timing(r["seconds"], 1)
    assert rec["relative_to_1_layer"] == {"plain": {"1": 1.0}, "layered": {"1": 1.0}}
    assert "gpt2_stack L=1" in p.stdout and "time relative to L=1" in p.stdout


def test_call_overhead(tmp_path):
    rec, p = run("call_overhead.py", ["--quick", "--repeats", "3", "--calls", "2"], tmp_path)
    assert rec["settings"]["rounds"] == 3 and rec["settings"]["calls"] == 2
    assert rec["cores"] == [rec["settings"]["core"]]  # pinned to one core before anything ran
    assert rec["shape"] == [16, 24] and "x * y" in rec["graph"]
    variants = rec["variants"]
    assert {"torch eager", "egraft executable, numpy", "CompiledModel, torch"} <= set(variants)
    for t in variants.values():
        check_timing(t, 3)
        assert t["median"] < 1.0  # seconds per call, not microseconds
    assert len(rec["overheads"]) == 7
    for o in rec["overheads"]:
        assert o["what"] and o["variant"] in variants and o["baseline"] in variants
        assert o["seconds"] == pytest.approx(variants[o["variant"]]["median"] - variants[o["baseline"]]["median"])
    assert "torch eager" in p.stdout and "(medians)" in p.stdout


def test_search(tmp_path):
    from egraft.measure import compare
    from egraft.search.statuses import STATUSES

    rec, p = run("search.py", ["--quick", "--only", "rmsnorm_linear", "--budget", "2", "--rounds", "2",
                               "--calls", "1"], tmp_path)
    assert rec["settings"]["workloads"] == ["rmsnorm_linear"] and rec["settings"]["budget_s"] == 2.0
    assert rec["settings"]["rounds"] == 2 and rec["settings"]["gpt2_compile"] is False
    (row,) = rec["rows"]
    variants = {"eager", "torch.compile", "direct", "greedy", "searched"}
    assert set(row["timings"]) == variants == set(row["median_s"])
    for k, t in row["timings"].items():
        check_timing(t, 2)
        assert t["median"] == row["median_s"][k]
    assert set(row["verdicts"]) == variants - {"searched"}
    searched = envelope.load_timing(row["timings"]["searched"])
    for k, verdict in row["verdicts"].items():  # the file's verdicts are compare() of its own samples
        assert verdict == compare(searched, envelope.load_timing(row["timings"][k]))
    trials = row["trials"]
    assert trials and all(len(t) == 4 for t in trials)
    indices = [t[0] for t in trials]
    assert indices == sorted(set(indices))
    for _, time_s, status, block in trials:
        assert status in STATUSES and isinstance(block, str)
        assert (time_s is not None) == (status in ("timed", "estimated"))
    assert row["n_trials"] == sum(t[2] in ("timed", "rejected", "failed") for t in trials)
    assert row["roofline_bound_s"] > 0 and row["flops"] > 0 and row["bytes"] > 0
    assert row["direct_backend"] == "jax" and row["backend"] in ("jax", "torch")
    assert "| rmsnorm_linear |" in p.stdout


@pytest.mark.host_specific
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the refusal is for machines "
                    "without one")
def test_search_on_cuda_without_a_gpu_exits_2(tmp_path):
    out = tmp_path / "search.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(BENCH / "search.py"), "--device", "cuda", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stdout == "" and not out.exists()  # stopped before any work
    msg = p.stderr.strip()
    assert "\n" not in msg
    assert "no CUDA device is visible to torch" in msg
    assert "NVIDIA GPU" in msg and "--device cpu" in msg
