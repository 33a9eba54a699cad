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


def _built(g):
    from egraft.backends import default_knobs
    from egraft.backends.triton import build, knobs

    return build(g, default_knobs(knobs(g)))


def test_int32_index_range_counts_what_kernels_walk():
    # a product whose broadcast form has 2**38 elements reads only its operands (a dot): it builds (generation only,
    # nothing runs); a bench-size model's matmuls were refused on a GPU before
    b = GraphBuilder()
    x, w = b.input("x", (4096, 8192), "float32"), b.input("w", (8192, 8192), "float32")
    _, _, specs = _built(b.build([(x @ w).exp()]))
    assert specs
    # a buffer of 2**31 elements, and a tile kernel that reduces a walked broadcast of 2**36: refused, naming it
    b = GraphBuilder()
    with pytest.raises(BackendError, match=r"node %0 \(Input\) makes a kernel walk 2,147,483,648 elements"):
        _built(b.build([b.input("x", (2**16, 2**15), "float32").exp()]))
    b = GraphBuilder()
    x, y = b.input("x", (2**12, 2**12), "float32"), b.input("y", (2**12, 2**12), "float32")
    with pytest.raises(BackendError, match=r"SumReduce\) makes a kernel walk 68,719,476,736 elements.*split"):
        _built(b.build([(x.reshape((2**12, 2**12, 1)) + y.reshape((1, 2**12, 2**12))).exp().sum(1)]))


@pytest.mark.parametrize("computed", [True, False])
def test_outer_product_operands_are_zero_past_k(computed):
    # K = 1 in a dot kernel whose K block is wider: an operand that does not vary along K (a broadcast load, or a
    # value computed before the K loop, as a rotary embedding's positions are) must be zero past K, in the loop
    # where the K mask lives (found on a GPU: the mask was referenced before the loop defined it, and two
    # broadcast loads summed BLOCK_K copies of the product)
    b = GraphBuilder()
    u = b.input("u", (32,), "float32")
    t = b.input("t", (1, 1, 8), "int64").cast("float32") if computed else b.input("t", (8,), "float32")
    y = u.reshape((1, 32, 1)) @ t.reshape((1, 1, 8))
    r, seed = rng()
    xt = r.integers(0, 255, (1, 1, 8)) if computed else r.standard_normal(8).astype(np.float32)
    check(b.build([y.sin()]), [r.standard_normal(32).astype(np.float32), xt], seed=seed)
