"""The device table, its lookup, and the measured CPU spec."""

from __future__ import annotations

import time

import pytest

import egraft.testing as testing
from egraft.measure import TABLE, calibrate_cpu, lookup, spec_for
from egraft.measure import inputs as prof_inputs
from egraft.measure import specs
from egraft.measure import tolerances as prof_tol


@pytest.mark.parametrize("name,want", [
    ("NVIDIA H100 80GB HBM3", specs.H100_SXM),
    ("NVIDIA H200", specs.H200),
    ("NVIDIA A100-SXM4-80GB", specs.A100_80GB),
    ("NVIDIA A100 80GB PCIe", specs.A100_80GB),
    ("TPU v5 lite", specs.TPU_V5E),
    ("TPU v5e", specs.TPU_V5E),
])
def test_lookup_by_reported_name(name, want):
    assert lookup(name) is want


def test_unknown_device_is_none():
    assert lookup("NVIDIA GeForce GTX 1080") is None
    assert lookup("NVIDIA A100-SXM4-40GB") is None


def test_table_is_complete_and_consistent():
    assert len(TABLE) == 4
    for s in TABLE.values():
        assert s.bandwidth > 0 and s.source
        assert all(v > 0 for v in s.flops.values())
        assert s.peak("bfloat16") and s.peak("int8")
    for s in (specs.H100_SXM, specs.H200, specs.A100_80GB):
        f = s.flops
        assert f["float32"] < f["tf32"] < f["bfloat16"] == f["float16"] < f["int8"]
    assert specs.H200.bandwidth > specs.H100_SXM.bandwidth > specs.A100_80GB.bandwidth
    assert specs.TPU_V5E.peak("float32") is None and specs.TPU_V5E.peak("float16") == specs.TPU_V5E.peak("bfloat16")


def test_calibrate_cpu_is_quick_positive_and_cached():
    t0 = time.perf_counter()
    s = calibrate_cpu(seconds=0.2, refresh=True)
    assert time.perf_counter() - t0 < 3.0
    assert s.flops["float32"] > 0 and s.bandwidth > 0 and s.peak("float32") > 0
    assert "GEMM peak: " in s.source and "numpy" in s.source and "xla" in s.source  # both libraries measured
    assert calibrate_cpu(seconds=0.2) is s
    assert spec_for("cpu") is s


def test_testing_reexports_the_profiler_core():
    for name in ("rel_err", "TOLERANCE", "tolerance", "eps", "error_budgets", "tolerance_for", "ULPS_PER_OP"):
        assert getattr(testing, name) is getattr(prof_tol, name)
    assert testing.random_array is prof_inputs.random_array
    assert testing.random_inputs is prof_inputs.random_inputs
