"""The torch backend beyond the conformance suite (which runs every per-op case on it, eagerly).

* ``mode="inductor"`` on a few graphs (a traced gated MLP; attention and
  softmax in float16; views and a primitive matmul; Scatter) matches the reference,
  and a non-contiguous or grad-requiring tensor does not make Dynamo recompile.
* The call path: torch tensors in -> torch tensors out on their device with
  no weight copied (the profiler sees no copy op during a call, and on the
  CPU the weights are the bound arrays' own memory); numpy in -> numpy out in
  exactly the graph's dtypes and shapes (int64, bool, float16, bfloat16,
  float64, 0-d); every output is a tensor of its own.
* A wrong input raises ``InputError`` naming it; knobs are validated.
* Conversions ATen rounds twice (float64 -> float16/bfloat16, int ->
  bfloat16) are rounded once, as the reference does.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conformance import case

import egraft
from egraft.backends import get_backend, lower, resolve
from egraft.backends.base import Executable
from egraft.errors import BackendError, InputError
from egraft.backends.torch.emit import from_numpy, to_numpy
from egraft.ir import GraphBuilder, Op, Tensor, dtypes, evaluate
from egraft.models import MODELS
from egraft.testing import assert_close, fresh_seed, random_inputs


def _check(ex, graph, inputs, what):
    """`ex` on numpy `inputs` against ``evaluate``: exact dtypes and shapes, values within the graph's tolerance."""
    got = ex(*inputs)
    want = evaluate(graph, inputs)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} output {k}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    assert_close(got, want, [d for _, d in graph.output_types()], what=what, graph=graph)
    return got


def _gated_mlp(seed):
    spec = MODELS["gated_mlp"]
    model = spec.build("tiny", seed=seed % 1000, hidden=16, intermediate=32)
    args = spec.example_inputs(model, batch=2, seq=4, seed=seed % 1000)
    return egraft.trace(model, args), model, args


def _attention_softmax_f16():
    b = GraphBuilder()
    q, k, v = (b.input(n, (2, 2, 5, 8), "float16") for n in "qkv")
    bias = b.input("bias", (2, 2, 5, 5), "float16")
    return b.build([b.add("Attention", (q, k, v), scale=0.35, causal=True),  # scaled_dot_product_attention
                    b.add("Attention", (q, k, v, bias), scale=0.35, causal=False),  # composed
                    b.add("Softmax", (q,), axis=3), q.softmax(-1).cast("float32")])


def _views_and_matmul():
    b = GraphBuilder()
    x = b.input("x", (4, 6, 5), "float32")
    w = b.weight("w", np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32))
    y = (x * 2.0).exp2()
    return b.build([x.permute((2, 0, 1)) + 0.0, x.flip(1) * y, b.view(y.reshape((120,)), (3, 2), (-6, 2), 19) + 0.0,
                    x.slice(1, 2, 3).expand((4, 3, 5)) * 1.0, x.matmul(w), y.sum(1)])


def test_inductor_gated_mlp_matches_reference_and_eager_torch():
    seed = fresh_seed()
    g, model, args = _gated_mlp(seed)
    ex = lower(g, "torch", "cpu", {"mode": "inductor"})
    assert ex.stats["peephole_dots"] == 3
    _check(ex, g, [a.numpy() for a in args], f"gated MLP under inductor (seed {seed})")
    (got,) = ex(*args)
    with torch.no_grad():
        want = model(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_inductor_attention_and_softmax_in_float16():
    seed = fresh_seed()
    g = _attention_softmax_f16()
    ex = lower(g, "torch", "cpu", {"mode": "inductor"})
    _check(ex, g, random_inputs(g, seed), f"attention/softmax float16 under inductor (seed {seed})")


@pytest.mark.parametrize("name", ["scatter_kv_cache_int32", "scatter_computed"])
def test_inductor_scatter_matches_reference(name):
    """Scatter under Inductor (warmed up on all-zero indices, whose repeated writes land in a discarded result)."""
    c, seed = case(name), fresh_seed()
    g = c.graph()
    ex = lower(g, "torch", "cpu", {"mode": "inductor"})
    _check(ex, g, c.inputs(g, np.random.default_rng(seed)), f"{name} under inductor (seed {seed})")


def test_inductor_views_without_recompiling():
    seed = fresh_seed()
    g = _views_and_matmul()
    ex = lower(g, "torch", "cpu", {"mode": "inductor"})
    (x,) = random_inputs(g, seed)
    _check(ex, g, [x], f"views under inductor (seed {seed})")
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))).permute(1, 2, 0)  # same values, strided
    assert not xt.is_contiguous()
    got = ex(xt.requires_grad_())
    assert counters["stats"]["unique_graphs"] == graphs, "a strided or grad-requiring input recompiled"
    for a, w in zip(got, evaluate(g, [x])):
        assert isinstance(a, torch.Tensor) and not a.requires_grad
        np.testing.assert_allclose(a.numpy(), w, rtol=1e-5, atol=1e-5)


def test_overlapping_views_read_as_a_stack_or_one_gather():
    """Dims whose strides overlap (sliding windows) become a stack of nesting views; past 64 pieces a gather."""
    b = GraphBuilder()
    x = b.input("x", (200,), "float32")
    y = x * 1.0
    g = b.build([b.view(x, (4, 3), (2, 1), 0) + 0.0, b.view(y, (3, 4, 3), (20, 2, 1), 5) * 1.0,
                 b.view(x, (100, 100), (1, 1), 0) + 0.0, b.view(x, (2, 3, 4), (-7, 1, 2), 150) * 1.0])
    ex = lower(g, "torch", "cpu")
    xa = np.random.default_rng(fresh_seed()).standard_normal(200).astype(np.float32)
    for k, (o, w) in enumerate(zip(ex(xa), evaluate(g, [xa]))):
        np.testing.assert_array_equal(o, w, err_msg=f"output {k}")
    assert "aten.stack" in ex.sources() and ex.sources().count("aten.index_select") == 1


def test_torch_in_torch_out_without_copying_weights():
    seed = fresh_seed()
    g, model, args = _gated_mlp(seed)
    ex = lower(g, "torch", "cpu")
    assert set(ex.weights) == set(g.weights)
    for name, t in ex.weights.items():  # on the CPU the module holds the bound arrays themselves
        assert t.data_ptr() == g.weights[name].__array_interface__["data"][0], name
    ex(*args)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        (got,) = ex(*args)
    copies = {e.name for e in prof.events()} & {"aten::copy_", "aten::_to_copy", "aten::to", "aten::clone",
                                                  "aten::contiguous", "aten::empty_like"}
    assert not copies, f"a call copied data: {copies}"
    assert isinstance(got, torch.Tensor) and got.device == args[0].device and got.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(got, model(*args), rtol=1e-5, atol=1e-5)


def _typed_graph():
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    i = b.input("i", (3, 4), "int64")
    h = b.input("h", (3, 4), "bfloat16")
    outs = [i * 3 + b.iota(4, "int64").expand((3, 4)), x < 0.5, (x * 1.5).cast("float16"), h * h,
            x.cast("float64") * 0.1, x.sum(1).sum(0), b.iota(5, "bfloat16")]
    return b.build(outs)


def test_numpy_in_numpy_out_in_the_graphs_dtypes():
    seed = fresh_seed()
    g = _typed_graph()
    ex = lower(g, "torch", "cpu")
    inputs = random_inputs(g, seed)
    got = _check(ex, g, inputs, f"typed outputs (seed {seed})")
    assert all(type(o) is np.ndarray for o in got)
    assert [o.dtype.name for o in got] == ["int64", "bool", "float16", "bfloat16", "float64", "float32", "bfloat16"]
    assert got[5].shape == ()
    assert not any(np.shares_memory(o, x) for o in got for x in inputs)


def test_torch_in_torch_out_in_the_graphs_dtypes():
    seed = fresh_seed()
    g = _typed_graph()
    ex = lower(g, "torch", "cpu")
    inputs = random_inputs(g, seed)
    got = ex(*[from_numpy(a) for a in inputs])
    assert [(o.dtype, tuple(o.shape)) for o in got] == [(getattr(torch, d), s) for s, d in g.output_types()]
    assert_close([to_numpy(o) for o in got], evaluate(g, inputs), [d for _, d in g.output_types()], graph=g,
                 what=f"typed outputs from torch inputs (seed {seed})")


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_every_output_is_its_own(kind):
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    w = b.weight("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    y = x * 2.0
    g = b.build([x, w, x.T, y, y, y.reshape((4, 3)), x.sum(1, keepdim=True).expand((3, 4))])
    ex = lower(g, "torch", "cpu")
    xa = np.random.default_rng(fresh_seed()).standard_normal((3, 4)).astype(np.float32)
    xin = xa if kind == "numpy" else torch.from_numpy(xa)
    outs = [np.asarray(o) for o in ex(xin)]
    for k, o in enumerate(outs):
        assert not np.shares_memory(o, xa), f"output {k} shares the input's memory"
        assert not np.shares_memory(o, g.weights["w"]), f"output {k} shares the weight's memory"
        for j in range(k):
            assert not np.shares_memory(o, outs[j]), f"outputs {j} and {k} share memory"
    assert outs[6].flags.c_contiguous  # a broadcast output is materialised
    for o in outs:
        o[...] = -1  # writable, and disturbs nothing
    np.testing.assert_array_equal(ex(xin)[1], g.weights["w"])


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_wrong_inputs_raise_input_error_naming_them(kind):
    b = GraphBuilder()
    x, y = b.input("x", (4, 6), "float32"), b.input("y", (4, 6), "float32")
    ex = lower(b.build([x * y]), "torch", "cpu")
    mk = (lambda a: a) if kind == "numpy" else torch.from_numpy
    good = mk(np.ones((4, 6), np.float32))
    for bad, what in ((mk(np.ones((4, 5), np.float32)), "shape"), (mk(np.ones((4, 6), np.float64)), "dtype")):
        with pytest.raises(InputError, match=f"input 'y' has {what}") as fast:
            ex(good, bad)
        with pytest.raises(InputError) as slow:
            Executable.__call__(ex, good, bad)
        assert str(fast.value) == str(slow.value)
    with pytest.raises(InputError, match="takes 2 input"):
        ex(good)


def test_knobs_are_listed_validated_and_serialisable():
    g = case("binary_Add_float32").graph()
    space = get_backend("torch").knobs(g)
    assert space["mode"] == ["eager", "inductor"] and space["idioms"][0] == "library"
    json.dumps(space)
    assert lower(g, "torch", "cpu").knobs == {k: v[0] for k, v in space.items()}
    with pytest.raises(BackendError, match="has no knob 'fast'"):
        lower(g, "torch", "cpu", {"fast": True})
    with pytest.raises(BackendError, match="'mode' takes one of"):
        lower(g, "torch", "cpu", {"mode": "jit"})
    with pytest.raises(BackendError, match="'peephole' takes one of"):
        lower(g, "torch", "cpu", {"peephole": 1})
    with pytest.raises(BackendError, match="does not run on 'tpu'"):
        lower(g, "torch", "tpu")
    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match="no CUDA device"):
            lower(g, "torch", "cuda")
    assert resolve("auto", "cpu") == "jax" and resolve("auto", "cuda") == "triton"


@pytest.mark.parametrize("knobs", [{"idioms": "primitive"}, {"attention": "composed"}, {"peephole": False}])
def test_other_knob_choices_match_the_reference(knobs):
    seed = fresh_seed()
    for name in ("attention_float32", "rows_together", "matmul_primitive_batched"):
        g = case(name).graph()
        _check(lower(g, "torch", "cpu", knobs), g, random_inputs(g, seed), f"{name} with {knobs} (seed {seed})")


def test_a_widened_weight_is_folded_only_when_copies_are_allowed():
    """fold_widened=True folds Cast(W.T) of a bfloat16 weight into a float32 copy (twice its bytes);
    False, what the default weight_copies=False holds it to, widens it in the call: no copy, the same outputs."""
    import ml_dtypes

    from egraft.backends.base import search_knobs

    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (3, 64), "bfloat16")
    w = b.weight("w", rng.standard_normal((96, 64)).astype(ml_dtypes.bfloat16))
    g = b.build([x @ w.T])
    inputs = random_inputs(g, seed)
    copy = lower(g, "torch", "cpu", {"fold_widened": True})
    free = lower(g, "torch", "cpu", {"fold_widened": False})
    assert [v.dtype for v in copy.folded.values()] == [np.float32] and free.folded == {}
    _check(copy, g, inputs, f"folded float32 copy (seed {seed})")
    _check(free, g, inputs, f"widened in the call (seed {seed})")
    assert search_knobs(get_backend("torch"), g)["fold_widened"] == [False]
    assert search_knobs(get_backend("torch"), g, weight_copies=True)["fold_widened"] == [True, False]


def _torch_dtype(fx_node):
    """The torch dtype an FX node of an egraft module holds (its IR dtype)."""
    from egraft.backends.torch.emit import TORCH_DTYPES

    return TORCH_DTYPES[fx_node.meta["egraft_dtype"]]


def test_a_bfloat16_linear_runs_as_torchs_bfloat16_product():
    """A traced bfloat16 Linear (its sum only rounded back to bfloat16) runs as torch's product of the bfloat16
    operands: no float32 copy of the weight in the program, the reference's values; a product whose float32 sum
    is read as it is keeps the float32 product."""
    import ml_dtypes

    from egraft.backends.torch import peephole
    from egraft.frontend.tracer import trace

    seed = fresh_seed()
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.SiLU(), torch.nn.Linear(96, 32)).to(torch.bfloat16)
    g = trace(m, (torch.randn(5, 64, dtype=torch.bfloat16),))
    plans = peephole.find(g)
    assert len(plans) == 2 and all(p.half is not None for p in plans.values())
    ex = lower(g, "torch", "cpu", {"fold_widened": False})
    calls = [n for n in ex.module.graph.nodes if n.op == "call_function" and "bmm" in str(n.target)]
    assert len(calls) == 2 and all(_torch_dtype(a) == torch.bfloat16 for n in calls for a in n.args[:2])
    _check(ex, g, random_inputs(g, seed), f"bfloat16 Linear (seed {seed})")
    b = GraphBuilder()
    x = b.input("x", (3, 64), "bfloat16")
    w = b.weight("w", np.random.default_rng(seed).standard_normal((32, 64)).astype(ml_dtypes.bfloat16))
    wide = x.cast("float32") @ w.T.cast("float32")  # the float32 sum of widened halves, read as it is
    kept = b.build([wide, (wide * 2.0).cast("bfloat16")])
    assert len(peephole.find(kept)) == 1 and all(p.half is None for p in peephole.find(kept).values())
    _check(lower(kept, "torch", "cpu"), kept, random_inputs(kept, seed), f"float32 sum kept (seed {seed})")
    # the same through the MatMul idiom (the library form a candidate of the e-graph holds)
    b = GraphBuilder()
    x = b.input("x", (3, 64), "bfloat16")
    w = b.weight("w", np.random.default_rng(seed).standard_normal((32, 64)).astype(ml_dtypes.bfloat16))
    idiom = b.build([b.add(Op.MatMul, (x.cast("float32"), w.T.cast("float32"))).cast("bfloat16")])
    ex = lower(idiom, "torch", "cpu", {"fold_widened": False})
    mms = [n for n in ex.module.graph.nodes if n.op == "call_function" and "mm" in str(n.target)]
    assert mms and all(_torch_dtype(a) == torch.bfloat16 for n in mms for a in n.args[:2]), mms
    _check(ex, idiom, random_inputs(idiom, seed), f"bfloat16 MatMul idiom (seed {seed})")


def _double_rounding_cases():
    """(source dtype, values): values where rounding through float32 first differs from rounding once."""
    rng = np.random.default_rng(0)
    d = rng.standard_normal(4000) * 100
    mids = []
    for half in (np.dtype(np.float16), dtypes.to_numpy("bfloat16")):  # midpoints between neighbours of each half type
        lo = d.astype(half)
        nxt = (lo.view(np.uint16) + 1).view(half)  # the neighbour one ulp further from zero
        mids.append((lo.astype(np.float64) + nxt.astype(np.float64)) / 2)
    mid = np.concatenate(mids)
    f64 = np.concatenate([mid + np.abs(mid) * 1e-12, mid - np.abs(mid) * 1e-12, mid,
                          [np.inf, -np.inf, 0.0, -0.0, 1e300, -1e-300, 65519.99, 3.5e38]])
    k = rng.integers(20, 55, 2000)
    i64 = np.concatenate([(rng.integers(2**7, 2**8, 2000) << k) + (1 << (k - 1)) + 1,
                          [2**63 - 1, -(2**63), 2**63 - 512, 2**60 + 2**52 + 1, 0, -1]])
    i32 = np.array([2**24 + 2**16 + 1, 2**30 + 2**22 + 1, -(2**31), 2**31 - 1, 7], np.int32)
    return [("float64", f64), ("int64", i64), ("int32", i32)]


# the conversions ATen rounds twice (the negative control checks that torch's own conversion is off on the cases)
TWICE = {("float64", "float16"), ("float64", "bfloat16"), ("int64", "bfloat16"), ("int32", "bfloat16")}


@pytest.mark.parametrize("mode", ["eager", "inductor"])
def test_conversions_round_once(mode):
    for src, arr in _double_rounding_cases():
        b = GraphBuilder()
        x = b.input("x", arr.shape, src)
        g = b.build([x.cast("float16"), x.cast("bfloat16")])
        got = lower(g, "torch", "cpu", {"mode": mode})(arr)
        for dt, o, w in zip(("float16", "bfloat16"), got, evaluate(g, [arr])):
            o64, w64 = o.astype(np.float64), w.astype(np.float64)
            assert np.array_equal(o64, w64), f"{src} -> {dt} under {mode}: {int((o64 != w64).sum())} values differ"
            assert np.array_equal(np.signbit(o64), np.signbit(w64))
            if (src, dt) in TWICE:
                naive = torch.from_numpy(arr).to(getattr(torch, dt)).double().numpy()
                assert not np.array_equal(naive, w64), f"negative control: torch's own {src} -> {dt} rounds once"


def test_integer_mod_by_zero_raises_like_the_reference():
    b = GraphBuilder()
    a, d = b.input("a", (4,), "int32"), b.input("d", (4,), "int32")
    ex = lower(b.build([a % d]), "torch", "cpu")
    np.testing.assert_array_equal(ex(np.array([7, -7, 7, -2**31], np.int32), np.array([2, 2, -3, -1], np.int32))[0],
                                  [1, -1, 1, 0])
    with pytest.raises(RuntimeError, match="ZeroDivision"):
        ex(np.array([1, 2, 3, 4], np.int32), np.array([1, 0, 1, 1], np.int32))


def test_where_keeps_signed_zeros_and_infinities():
    b = GraphBuilder()
    x = b.input("x", (6,), "float32")
    g = b.build([Tensor.where(x < 0.0, x, -0.0), x + 0.0])
    xa = np.array([-0.0, 0.0, -np.inf, np.inf, np.nan, -1.0], np.float32)
    got, want = lower(g, "torch", "cpu")(xa), evaluate(g, [xa])
    for o, w in zip(got, want):
        np.testing.assert_array_equal(np.signbit(o), np.signbit(w))
        np.testing.assert_array_equal(o, w)
