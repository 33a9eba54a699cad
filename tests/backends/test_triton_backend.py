"""Triton backend plumbing: knobs, weight folding, executables, errors."""

from __future__ import annotations

import numpy as np
import pytest
from triton_helpers import DEVICE, check, require_mode, rng

from egraft.backends import get_backend, lower
from egraft.errors import BackendError, InputError
from egraft.ir import GraphBuilder, evaluate
from egraft.testing import assert_close, random_array

pytestmark = pytest.mark.usefixtures("_mode")


@pytest.fixture
def _mode():
    require_mode()


def _block_graph(seed):
    """A small transformer-ish graph: norm, matmul + epilogue, softmax, reduction."""
    r = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (2, 5, 16), "float32")
    w = b.weight("w", random_array((20, 16), "float32", r))
    bias = b.weight("bias", random_array((20,), "float32", r))
    h = x.layer_norm(1e-5).matmul(w.T) + bias
    y = h.softmax(-1) * h.silu() + h.sum(-1, keepdim=True)
    return b.build([y, h.max(1)])


KNOB_SETS = [
    {"fuse_epilogue": False},
    {"fuse_prologue": False},
    {"persistent_rows": False},
    {"tile_elems": 512, "num_warps": 2},
    {"matmul_block": (16, 16, 16), "num_stages": 3},
    {"tile_elems": 8192, "matmul_block": (32, 32, 32)},
]


@pytest.mark.parametrize("knobs", KNOB_SETS, ids=lambda k: ",".join(k))
def test_non_default_knobs_match_reference(knobs):
    _, seed = rng()
    check(_block_graph(seed), knobs=knobs, seed=seed)


def test_knobs_change_the_partition():
    g = _block_graph(0)
    counts = {}
    for name, kn in [("default", {}), ("cut", {"fuse_epilogue": False}), ("rows", {"persistent_rows": False})]:
        counts[name] = len(lower(g, "triton", DEVICE, kn).kernels)
    assert counts["cut"] > counts["default"] and counts["rows"] > counts["default"], counts


def test_per_anchor_fuse_knobs_exist_and_cut():
    g = _block_graph(1)
    space = get_backend("triton").knobs(g)
    per = [k for k in space if k.startswith("fuse_") and k[5:].isdigit()]
    assert per, space.keys()
    base = len(lower(g, "triton", DEVICE).kernels)
    cut_all = lower(g, "triton", DEVICE, {k: False for k in per})
    assert len(cut_all.kernels) > base
    xs = [random_array((2, 5, 16), "float32", np.random.default_rng(3))]
    assert_close(cut_all(*xs), evaluate(g, xs))


def test_unknown_knob_is_an_error():
    with pytest.raises(BackendError, match="no knob"):
        lower(_block_graph(0), "triton", DEVICE, {"blocksize": 3})


def test_weight_only_work_is_folded_at_build_not_per_call():
    r, seed = rng()
    b = GraphBuilder()
    x = b.input("x", (3, 8), "float32")
    w = b.weight("w", random_array((8, 6), "float32", r))
    a = b.weight("a", random_array((8, 2), "float32", r))
    bb = b.weight("b", random_array((2, 6), "float32", r))
    merged = w + a.matmul(bb) * 0.5  # LoRA merge: weight-only
    g = b.build([x.matmul((merged * 2.0).exp2())])
    ex = check(g, seed=seed)
    assert len(ex.folded) == 1 and len(ex.kernels) == 1, "the weight-only chain is computed once, at build"
    kernel_nodes = {ex.main.nodes[i].op for k in ex.kernels for i in k.covers}
    assert "Exp2" not in kernel_nodes
    # the folded value is used as-is per call: rebinding the graph's weights afterwards changes nothing
    xs = [random_array((3, 8), "float32", r)]
    before = ex(*xs)[0]
    n0 = ex.launches
    again = ex(*xs)[0]
    assert ex.launches - n0 == 1
    np.testing.assert_array_equal(before, again)


def test_torch_in_torch_out_and_numpy_in_numpy_out():
    import torch

    g = _block_graph(2)
    ex = lower(g, "triton", DEVICE)
    x = random_array((2, 5, 16), "float32", np.random.default_rng(4))
    out_np = ex(x)
    out_t = ex(torch.from_numpy(x).to(DEVICE))
    assert isinstance(out_np[0], np.ndarray) and isinstance(out_t[0], torch.Tensor)
    assert_close([t.cpu().numpy() for t in out_t], out_np)


def test_bad_inputs_are_input_errors():
    ex = lower(_block_graph(0), "triton", DEVICE)
    with pytest.raises(InputError):
        ex(np.zeros((2, 5, 15), np.float32))
    with pytest.raises(InputError):
        ex(np.zeros((2, 5, 16), np.float64))


def test_wrong_device_mode_is_a_clear_error():
    other = "cuda" if DEVICE == "cpu" else "cpu"
    with pytest.raises(BackendError, match="TRITON_INTERPRET"):
        lower(_block_graph(0), "triton", other)


def test_kernel_source_is_readable_and_names_ir_nodes():
    ex = lower(_block_graph(0), "triton", DEVICE)
    for k in ex.kernels:
        assert "@triton.jit" in k.source and "Covers IR nodes" in k.source and "# %" in k.source
        assert k.path.endswith(".py") and open(k.path).read() == k.source


def test_graph_output_that_is_an_input_or_a_view():
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    ex = check(b.build([x, x.T, x.sum(0)]))
    assert len(ex.kernels) == 2
