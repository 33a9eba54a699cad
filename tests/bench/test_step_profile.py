"""bench/step_profile.py: a decode step's XLA operations by kind, from JAX's profiler."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import step_profile  # noqa: E402


def _ev(start, dur, name):
    return NS(start_ns=start, duration_ns=dur, name=name)


def test_only_the_last_executions_operations_are_counted_by_kind():
    """Two executions (a prompt's, then one decode step): the prompt's operations and the executor's own
    markers are left out, and the numbered names of one kind are summed together."""
    xla = NS(name="tf_XLAPjRtCpuClient/1", events=[
        _ev(0, 100, "ThunkExecutor::Execute"), _ev(10, 50, "ffi_call.3"), _ev(70, 5, "end: ffi_call.3"),
        _ev(200, 40, "ThunkExecutor::Execute"), _ev(201, 10, "ffi_call.3"), _ev(212, 6, "ffi_call.17"),
        _ev(219, 1, "end: ffi_call.17"), _ev(220, 15, "ynn_fusion"), _ev(236, 0, "ThreadpoolListener::StopRegion"),
        _ev(300, 9, "ffi_call.4")])  # after the last execution: not one of its operations
    python = NS(name="python3", events=[_ev(205, 30, "ffi_call.9")])  # not an XLA thread
    kinds, runs = step_profile.by_kind([NS(lines=[python, xla])], decode_steps=1)
    assert runs == [40]
    assert kinds == {"ffi_call": [16, 2], "ynn_fusion": [15, 1]}


@pytest.mark.slow  # a bench script's whole run (compile, save, timing children): by hand with -m slow
def test_a_tiny_model_is_compiled_profiled_and_recorded(tmp_path):
    out = tmp_path / "profile.json"
    assert step_profile.main(["--model", "llama-tiny", "--quantize", "int8", "--budget", "2s", "--new", "4",
                              "--rounds", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    got = doc["profile"]
    assert doc["host"]["cpu"] and doc["command"].startswith("python3 bench/step_profile.py")
    assert got["decode_steps"] == got["tokens"] - 1 == 3
    assert got["kinds"] and all(k["per_step"] > 0 and k["ms_per_step"] >= 0 for k in got["kinds"])
    # the operations lie inside the decode executions they are counted for
    assert 0 < got["operations_ms"] <= got["execute_ms_mean"] * 1.001
    assert abs(sum(k["share_of_operations"] for k in got["kinds"]) - 1) < 0.01
