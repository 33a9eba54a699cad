"""Triton-specific op tests: kernel counts and kinds (what fuses into one kernel) and tiling knobs.

The per-op checks (every primitive, View form and idiom against
``ir.evaluate``) are in ``test_conformance.py``, run on every backend; the
tests here reuse its graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
from conformance import case
from triton_helpers import DEVICE, check, require_mode

from egraft.backends import lower
from egraft.ir import Group
from egraft.testing import fresh_seed

pytestmark = pytest.mark.usefixtures("_mode")


@pytest.fixture
def _mode():
    require_mode()


def _kernels(name, knobs=None):
    return lower(case(name).graph(), "triton", DEVICE, knobs or {}).kernels


def _check_case(name, knobs):
    c, seed = case(name), fresh_seed()
    g = c.graph()
    return check(g, c.inputs(g, np.random.default_rng(seed)), knobs=knobs, seed=seed, tol=c.tol)


def test_long_reduction_axis_runs_as_a_loop():
    _check_case("reduce_long_and_mixed", {"tile_elems": 64})  # a 64-element tile: the 300-long axis loops


@pytest.mark.parametrize("op", sorted(Group.ROW_IDIOM))
def test_row_idiom_with_prologue_and_epilogue_is_one_kernel(op):
    assert len(_kernels(f"row_fused_{op}_axis2")) == 1


@pytest.mark.parametrize("name", ["rows_together", "rows_primitive"])
def test_softmax_and_norms_idiom_and_primitive_form_are_one_kernel_each(name):
    ks = _kernels(name)
    assert len(ks) == len(Group.ROW_IDIOM), [k.name for k in ks]


@pytest.mark.parametrize("form", ["idiom", "primitive"])
@pytest.mark.parametrize("shape", ["batched", "ragged"])
def test_matmul_is_one_dot_kernel(form, shape):
    assert [k.kind for k in _kernels(f"matmul_{form}_{shape}")] == ["dot"]


def test_linear_with_fused_epilogue_and_prologue():
    assert [k.kind for k in _kernels("linear_epilogue")] == ["dot"], \
        "bias, activation, row scale and residual fuse into the matmul"


@pytest.mark.parametrize("name", ["attention_no_causal_no_bias_no_gqa", "attention_causal_no_bias_gqa",
                                  "attention_no_causal_bias_no_gqa", "attention_causal_bias_gqa"])
def test_attention_idiom_is_one_kernel(name):
    assert [k.kind for k in _kernels(name)] == ["attention"]


def test_device_string():
    assert DEVICE in ("cpu", "cuda")


@pytest.mark.parametrize("name", ["scatter_int64", "scatter_kv_cache_int32", "scatter_computed"])
def test_scatter_lines_longer_than_a_tile_loop_in_chunks(name):
    _check_case(name, {"tile_elems": 16})  # BLOCK_C = 16: the 33- and 40-long lines loop over 3 chunks


def test_scatter_is_one_kernel_with_its_operands_inlined_and_never_inlined_itself():
    ks = _kernels("scatter_computed")
    roots = [k for k in ks if k.kind == "scatter"]
    assert len(roots) == 2, [k.name for k in ks]  # the Scatter and the Scatter of it: a kernel each
    assert all("tl.debug_barrier()" in k.source for k in roots)
    assert all(k.kind != "scatter" for k in ks if k not in roots)
    # x * 2 + 1 and sin(u) * 3 are computed inside the first Scatter's kernel, not materialised
    assert "tl.sin(" in roots[0].source, roots[0].source
