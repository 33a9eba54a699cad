"""The roofline cost model: kernels, FLOPs and bytes per backend, peaks, node costs, rank correlation."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from egraft.backends import NAMES
from egraft.ir.egraph import ENode
from egraft.errors import BackendError
from egraft.ir import GraphBuilder, Group, evaluate
from egraft.measure import DeviceSpec
from egraft.search import Estimate, KernelCost, Space, estimate, node_cost, rank_correlation
from egraft.search import cost as cost_mod
from egraft.search.kernels import FLOPS
from egraft.testing import assert_close, fresh_seed, random_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from conformance import all_cases  # noqa: E402

SPEC = DeviceSpec("test spec", {"float32": 1e12, "bfloat16": 1e14, "tf32": 5e13}, 1e11)
# every backend of egraft under its default knobs, plus the knobs that change a plan
PARTITIONS = [(name, {}) for name in NAMES] + [("jax", {"idioms": "primitive"}), ("jax", {"peephole": False}),
                                               ("triton", {"fuse_epilogue": False, "persistent_rows": False})]
LAUNCH = cost_mod.LAUNCH_S["cpu"]


def _space_of(graph):
    """A Space with one class per node of `graph` (no saturation): every op of the graph as one e-node."""
    nodes = [ENode(n.op, n.attrs, n.inputs, i) for i, n in enumerate(graph.nodes)]
    return Space(nodes=nodes, classes=[[i] for i in range(len(nodes))], shape=[n.shape for n in graph.nodes],
                 dtype=[n.dtype for n in graph.nodes], roots=list(graph.outputs), inputs=list(graph.input_ids),
                 input_names=graph.input_names(), weights=dict(graph.weights))


def _w(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- every op, every partition --------------------------------------------------------------------------------
def test_every_op_has_a_flop_rule_and_a_conformance_case():
    assert set(FLOPS) == set(Group.ALL)
    seen = {n.op for c in all_cases() for n in c.graph().nodes}
    assert seen >= set(Group.ALL), f"ops no conformance case exercises: {set(Group.ALL) - seen}"


def test_every_conformance_case_has_a_positive_finite_bound_under_every_partition():
    cost = node_cost(SPEC)
    for case in all_cases():
        g = case.graph()
        for backend, knobs in PARTITIONS:
            e = estimate(g, backend, knobs, spec=SPEC)
            what = f"{case.name} under {backend} {knobs}"
            assert isinstance(e, Estimate) and e.kernels, what
            assert 0 < e.bound_s < math.inf, what
            assert e.bound_s == pytest.approx(sum(k.bound_s for k in e.kernels)), what
            for k in e.kernels:
                assert isinstance(k, KernelCost) and k.flops >= 0 and 0 < k.bytes < math.inf, what
                assert k.bound_s >= LAUNCH, what
            json.dumps(e.as_dict())
        space = _space_of(g)
        for n in space.nodes:
            c = cost(n, space)
            assert 0 <= c < math.inf, (case.name, n.op)
        space.greedy(cost)  # one class per node: greedy must return the graph itself
    assert e.spec_name == "test spec" and e.device == "cpu"


def test_unknown_backend_is_an_error():
    b = GraphBuilder()
    x = b.input("x", (4,), "float32")
    with pytest.raises(BackendError, match="backends"):
        estimate(b.build([x.exp2()]), "tvm", spec=SPEC)


# -- flops and bytes ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["idiom", "primitive"])
@pytest.mark.parametrize("backend", ["jax", "triton"])
def test_matmul_flops_and_bytes_are_exact(form, backend):
    B, M, K, N = 3, 5, 7, 11
    b = GraphBuilder()
    x = b.input("x", (B, M, K), "float32")
    y = b.input("y", (B, K, N), "float32")
    out = b.add("MatMul", [x, y]) if form == "idiom" else x @ y
    e = estimate(b.build([out]), backend, spec=SPEC)
    assert len(e.kernels) == 1
    assert e.flops == 2 * B * M * N * K
    assert e.bytes == 4 * (B * M * K + B * K * N + B * M * N)


def test_fused_elementwise_chain_counts_only_its_ends():
    n = 64 * 48
    b = GraphBuilder()
    x = b.input("x", (64, 48), "float32")
    y = ((x * 2.0 + 1.0).exp2() * x).sin()
    for backend in ("jax", "torch", "triton"):
        e = estimate(b.build([y]), backend, spec=SPEC)
        assert len(e.kernels) == 1, backend
        assert e.bytes == 2 * 4 * n, backend  # x read once (twice used), y written once: no intermediates
        assert e.flops == n * (1 + 1 + 4 + 1 + 8), backend


def test_a_value_read_by_two_kernels_is_written_once():
    r, c = 32, 16
    b = GraphBuilder()
    x = b.input("x", (r, c), "float32")
    h = x.exp2()
    g = b.build([h.sum(0), h.sum(1)])
    e = estimate(g, "jax", spec=SPEC)
    assert [k.ops for k in e.kernels] == [("Exp2",), ("SumReduce",), ("SumReduce",)]
    # h: read x, write h once; each sum reads h and writes its output
    assert e.bytes == 4 * ((r * c + r * c) + (r * c + c) + (r * c + r))
    assert e.flops == 4 * r * c + 2 * r * c
    # Triton recomputes h in both reduction kernels instead of writing it
    t = estimate(g, "triton", spec=SPEC)
    assert t.bytes == 4 * (2 * r * c + c + r) and t.flops == 2 * 4 * r * c + 2 * r * c


def test_a_slice_of_a_buffer_reads_only_the_slice():
    b = GraphBuilder()
    x = b.input("x", (8, 32), "float32")
    w = b.input("w", (32, 96), "float32")
    qkv = b.add("MatMul", [x, w])  # [8, 96]
    q, k = qkv.slice(1, 0, 32), qkv.slice(1, 32, 64)
    e = estimate(b.build([q.exp2() + k]), "jax", spec=SPEC)
    assert e.kernels[-1].bytes == 4 * (8 * 32 * 2 + 8 * 32)  # two thirds of qkv read, one [8, 32] written


@pytest.mark.parametrize("backend", ["jax", "triton"])
def test_weight_only_work_is_free_per_call(backend):
    rng = np.random.default_rng(fresh_seed())
    M, K, N, R = 16, 64, 48, 4

    def graph(lora):
        b = GraphBuilder()
        x = b.input("x", (M, K), "float32")
        w = b.weight("w", _w(rng, K, N))
        if lora:
            a, bb = b.weight("a", _w(rng, K, R)), b.weight("b", _w(rng, R, N))
            w = w + b.add("MatMul", [a, bb]) * 0.5
        return b.build([b.add("MatMul", [x, w])])

    merged, plain = estimate(graph(True), backend, spec=SPEC), estimate(graph(False), backend, spec=SPEC)
    assert merged.flops == plain.flops == 2 * M * K * N
    assert merged.bytes == plain.bytes and merged.bound_s == pytest.approx(plain.bound_s)


# -- peaks ---------------------------------------------------------------------------------------------------
def test_memory_bound_graph_halves_when_bandwidth_doubles():
    b = GraphBuilder()
    x = b.input("x", (512, 512), "float32")
    g = b.build([x + 1.0])
    slow = DeviceSpec("slow", {"float32": 1e15}, 1e10)
    fast = DeviceSpec("fast", {"float32": 1e15}, 2e10)
    e1, e2 = estimate(g, spec=slow), estimate(g, spec=fast)
    assert e1.bytes == e2.bytes == 2 * 4 * 512 * 512
    assert e1.bound_s - LAUNCH == pytest.approx(e1.bytes / 1e10)
    assert (e1.bound_s - LAUNCH) == pytest.approx(2 * (e2.bound_s - LAUNCH))
    on_gpu = estimate(g, "triton", device="cuda", spec=fast)
    assert on_gpu.bound_s == pytest.approx(e2.bound_s - LAUNCH + cost_mod.LAUNCH_S["cuda"])


def test_contractions_run_at_their_dtype_peak_and_elementwise_in_float32():
    b = GraphBuilder()
    x = b.input("x", (256, 256), "bfloat16")
    y = b.input("y", (256, 256), "bfloat16")
    g = b.build([b.add("MatMul", [x, y]), (x * x).exp2()])
    spec = DeviceSpec("compute bound", {"float32": 1e9, "bfloat16": 1e11}, 1e18)
    mm, ew = estimate(g, spec=spec).kernels
    assert (mm.dtype, ew.dtype) == ("bfloat16", "float32")
    assert mm.bound_s - LAUNCH == pytest.approx(mm.flops / 1e11)
    assert ew.bound_s - LAUNCH == pytest.approx(ew.flops / 1e9)
    # a float32 matmul under Triton's tf32 knob runs at the tf32 peak; a dtype the spec lacks falls back to float32
    b = GraphBuilder()
    x = b.input("x", (64, 64), "float32")
    g = b.build([b.add("MatMul", [x, x])])
    assert estimate(g, "triton", {"tf32": True}, spec=SPEC).kernels[0].dtype == "tf32"
    assert estimate(g, "jax", {"tf32": True}, spec=SPEC).kernels[0].dtype == "float32"
    lean = DeviceSpec("bf16 only", {"bfloat16": 1e11}, 1e18)
    k = estimate(g, spec=lean).kernels[0]
    assert k.bound_s - LAUNCH == pytest.approx(k.flops / 1e11)


def test_default_spec_is_measured_once_per_process():
    b = GraphBuilder()
    x = b.input("x", (8,), "float32")
    g = b.build([x.exp2()])
    e = estimate(g)  # the measured cpu spec, cached after the first call
    assert 0 < e.bound_s < math.inf and e.spec_name.startswith("cpu")
    assert cost_mod.device_spec("cpu") is cost_mod.device_spec("cpu")
    gpu = cost_mod.device_spec("cuda")  # the datasheet entry on a GPU machine, an assumed H100 elsewhere
    assert gpu.bandwidth > 0 and gpu.peak("float32") > 0


# -- extraction under the model ------------------------------------------------------------------------------
def test_node_cost_greedy_on_a_saturated_model_is_equivalent_and_merges_lora():
    import egraft
    from egraft.models import make
    from egraft.rewrites import Limits, saturate

    seed = fresh_seed()
    model, args = make("lora_linear")
    g = egraft.trace(model, args)
    space = Space.from_egraph(saturate(g, limits=Limits(repeated_layers=False)))
    best = space.greedy(node_cost(SPEC))
    inputs = random_inputs(g, seed)
    assert_close(evaluate(best, inputs, np.float64), evaluate(g, inputs, np.float64), tol=1e-9,
                 what=f"cost-model greedy extraction of lora_linear (seed {seed})")
    # the adapter is merged into the weight: one per-call product instead of three
    before, after = estimate(g, spec=SPEC), estimate(best, spec=SPEC)
    assert after.flops < before.flops and after.bound_s < before.bound_s
    assert after.bound_s <= estimate(space.greedy(), spec=SPEC).bound_s


def test_node_cost_prefers_the_idiom_to_its_primitive_form():
    b = GraphBuilder()
    x = b.input("x", (64, 128), "float32")
    cost = node_cost(SPEC)
    prim = _space_of(b.build([x.softmax(-1)]))
    idiom = _space_of(b.build([b.add("Softmax", [x], axis=1)]))
    total = [sum(cost(n, s) for n in s.nodes) for s in (prim, idiom)]
    assert total[1] < total[0] / 3
    # weight-only e-nodes are folded at build: free per call
    a = b.weight("a", np.ones((8, 4), np.float32))
    w = b.add("MatMul", [a, b.weight("b", np.ones((4, 128), np.float32))])
    space = _space_of(b.build([b.add("MatMul", [x, w.T])]))
    costs = {n.op: cost(n, space) for n in space.nodes if n.op == "MatMul" and n.cls != space.roots[0]}
    assert costs == {"MatMul": 0.0} and cost(space.nodes[space.roots[0]], space) > LAUNCH


# -- rank correlation ----------------------------------------------------------------------------------------
def test_rank_correlation_matches_hand_computed_values():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 35, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their average rank: x ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4) -> 4.5 / sqrt(4.5 * 5)
    assert rank_correlation([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    # one swap among five: 1 - 6 * 2 / (5 * 24) = 0.9
    assert rank_correlation([1, 2, 3, 4, 5], [1, 2, 3, 5, 4]) == pytest.approx(0.9)
    assert math.isnan(rank_correlation([1, 1, 1], [1, 2, 3]))
    assert math.isnan(rank_correlation([1], [2]))
    with pytest.raises(ValueError):
        rank_correlation([1, 2], [1, 2, 3])


def test_a_scatter_costs_bytes_its_copy_and_its_updates_and_no_flops():
    """A functional Scatter reads x, idx and upd, writes its output (the copy of x) and stores upd over it."""
    b = GraphBuilder()
    x = b.input("x", (6, 10), "float32")
    out = x.scatter(1, b.input("i", (6, 4), "int64"), b.input("u", (6, 4), "float32"))
    for backend in NAMES:
        e = estimate(b.build([out]), backend, spec=SPEC)
        assert len(e.kernels) == 1 and e.flops == 0, backend
        assert e.bytes == 4 * 60 + 8 * 24 + 4 * 24 + 4 * 60 + 4 * 24, backend
