"""Programs that update state in place: the graph's checks, the tracer, the backends' in-place contract.

Every result is compared with the numpy reference (``ir.evaluate``) on random inputs, fresh seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import egraft
from egraft.backends import lower
from egraft.errors import InputError, IRError
from egraft.ir import evaluate
from egraft.ir.builder import GraphBuilder
from egraft.testing import fresh_seed


class Cache(torch.nn.Module):
    """A KV-cache step: write k at positions pos along dim 2 (index_copy_ or indexed assignment), count steps."""

    def __init__(self, how="index_copy", shape=(1, 2, 16, 4)):
        super().__init__()
        self.how = how
        self.register_buffer("k", torch.zeros(shape))
        self.register_buffer("n", torch.zeros((), dtype=torch.int64))

    def forward(self, pos, k):
        if self.how == "index_copy":
            self.k.index_copy_(2, pos, k)
        else:
            self.k[:, :, pos] = k
        self.n.add_(1)
        return self.k.sum(-1) * 2


class ReadsOld(torch.nn.Module):
    """Reads the old buffer after writing it: the in-place decision must not take this one."""

    def __init__(self):
        super().__init__()
        self.register_buffer("s", torch.zeros(3, 6))

    def forward(self, pos, v):
        old = self.s * 1
        self.s.index_copy_(1, pos, v)
        return old + self.s


def _pos(rng, n, k):
    return torch.from_numpy(rng.permutation(n)[:k].astype(np.int64))


def test_graph_state_checks():
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    s = b.input("s", (3,), "float32", role="state")
    g = b.build([s + x, x * 2], aliases={0: "s"})
    assert g.state_names() == ["s"] and g.input_names() == ["x", "s"] and g.aliases == {0: "s"}
    assert [sp.name for sp in g.signature.run_inputs] == ["x", "s"]
    with pytest.raises(IRError, match="no output carrying their new value"):
        b.build([s + x])
    with pytest.raises(IRError, match="cannot overwrite state"):
        b.build([(s + x).cast("float16")], aliases={0: "s"})
    with pytest.raises(IRError, match="repeats"):
        b.build([s + x, s * x], aliases={0: "s", 1: "s"})
    with pytest.raises(InputError, match="state 's' has shape"):
        evaluate(g, [np.ones(3, np.float32), np.ones(4, np.float32)])


@pytest.mark.parametrize("how", ["index_copy", "setitem"])
def test_traced_cache_step_matches_eager(how):
    rng = np.random.default_rng(fresh_seed())
    m = Cache(how)
    pos, k = _pos(rng, 16, 3), torch.randn(1, 2, 3, 4)
    g = egraft.trace(m, (pos, k))
    assert g.state_names() == ["k", "n"] and g.aliases == {0: "k", 1: "n"}
    assert "Scatter" in g.op_counts()
    state = np.random.default_rng(rng.integers(1 << 30)).standard_normal((1, 2, 16, 4)).astype(np.float32)
    got = evaluate(g, [pos.numpy(), k.numpy(), state, np.array(7)])
    m.k.copy_(torch.from_numpy(state))
    m.n.fill_(7)
    with torch.no_grad():
        want = m(pos, k)
    np.testing.assert_array_equal(got[0], m.k.numpy())
    assert int(got[1]) == 8
    np.testing.assert_allclose(got[2], want.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_backend_matches_reference_and_reads_old_state(backend):
    rng = np.random.default_rng(fresh_seed())
    for model, args, shape in [(Cache(), (_pos(rng, 16, 3), torch.randn(1, 2, 3, 4)), (1, 2, 16, 4)),
                               (ReadsOld(), (_pos(rng, 6, 2), torch.randn(3, 2)), (3, 6))]:
        g = egraft.trace(model, args)
        exe = lower(g, backend, "cpu", {})
        states = [rng.standard_normal(shape).astype(np.float32)] + ([np.array(3)] if len(g.state_ids) == 2 else [])
        xs = [a.numpy() for a in args]
        want = evaluate(g, xs + [s.copy() for s in states])
        got = exe(*xs, *[torch.from_numpy(s.copy()) for s in states]) if backend == "torch" else exe(*xs, *states)
        for w, o in zip(want, got):
            np.testing.assert_allclose(np.asarray(o), w, rtol=1e-6, atol=1e-6)


def test_torch_in_place_decision():
    from egraft.backends.torch.fx_module import in_place_scatters

    rng = np.random.default_rng(fresh_seed())
    g = egraft.trace(Cache(), (_pos(rng, 16, 3), torch.randn(1, 2, 3, 4)))
    assert len(in_place_scatters(g)) == 1
    g_old = egraft.trace(ReadsOld(), (_pos(rng, 6, 2), torch.randn(3, 2)))
    assert in_place_scatters(g_old) == set()  # the old value is read: functional Scatter, then copy_


def test_torch_state_no_allocation_per_step():
    """1,000 steps: the returned state is the passed tensor (data_ptr), and the cache never moves."""
    rng = np.random.default_rng(fresh_seed())
    m = Cache(shape=(1, 2, 64, 8))
    g = egraft.trace(m, (_pos(rng, 64, 1), torch.randn(1, 2, 1, 8)))
    exe = lower(g, "torch", "cpu", {})
    k = torch.from_numpy(rng.standard_normal((1, 2, 64, 8)).astype(np.float32))
    n = torch.tensor(0)
    ref_k = k.numpy().copy()
    ptr = k.data_ptr()
    for step in range(1000):
        pos = torch.tensor([step % 64])
        kv = torch.from_numpy(rng.standard_normal((1, 2, 1, 8)).astype(np.float32))
        out = exe(pos, kv, k, n)
        assert out[0] is k and out[0].data_ptr() == ptr and out[1] is n
        ref_k[:, :, step % 64] = kv.numpy()[:, :, 0]
    np.testing.assert_array_equal(k.numpy(), ref_k)
    assert int(n) == 1000


def test_jax_state_is_donated():
    import jax

    rng = np.random.default_rng(fresh_seed())
    g = egraft.trace(Cache(), (_pos(rng, 16, 3), torch.randn(1, 2, 3, 4)))
    exe = lower(g, "jax", "cpu", {})
    k0 = rng.standard_normal((1, 2, 16, 4)).astype(np.float32)
    pos, kv = _pos(rng, 16, 3).numpy(), rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    out = exe(pos, kv, k0, np.array(0))
    assert isinstance(out[0], jax.Array)  # the new state stays a jax array
    k, ptr = out[0], out[0].unsafe_buffer_pointer()
    out2 = exe(pos, kv, k, out[1])
    assert k.is_deleted() and out2[0].unsafe_buffer_pointer() == ptr
    want = evaluate(g, [pos, kv, evaluate(g, [pos, kv, k0, np.array(0)])[0], np.array(1)])
    np.testing.assert_array_equal(np.asarray(out2[0]), want[0])


class RowCache(torch.nn.Module):
    """A batch of rows each writing one token at its own position (a decode step's cache update), in bfloat16."""

    def __init__(self, shape=(3, 2, 16, 4)):
        super().__init__()
        self.register_buffer("k", torch.zeros(shape, dtype=torch.bfloat16))

    def forward(self, pos, k):
        rows = torch.arange(self.k.shape[0])
        self.k[rows, :, pos] = k
        return self.k.float().sum(-1)


def _np(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy (bfloat16 as ml_dtypes' bfloat16)."""
    from egraft.ir.tensors import to_numpy

    return to_numpy(t)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("model", ["one position", "a position per row"])
def test_jax_holds_a_half_type_state_as_its_bits(model, dtype):
    """A half-type state crosses as int16 (the same bytes): the update is an int16 scatter in the donated buffer,
    never the whole cache widened to float32 and narrowed back; values equal the reference's, bit for bit."""
    rng = np.random.default_rng(fresh_seed())
    half = getattr(torch, dtype)
    if model == "one position":
        m, args = Cache(shape=(2, 2, 16, 4)).to(half), (_pos(rng, 16, 3), torch.randn(2, 2, 3, 4))
    else:
        m, args = RowCache().to(half), (_pos(rng, 16, 3), torch.randn(3, 2, 4))
    args = tuple(a.to(half) if a.is_floating_point() else a for a in args)
    g = egraft.trace(m, args)
    exe = lower(g, "jax", "cpu", {})
    k = g.state_ids[0]
    assert g.nodes[k].dtype == dtype and exe.runner.program_dtypes[g.input_ids.index(k)] == np.int16
    hlo = exe.hlo_text()
    short = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    assert "s16[" in hlo and not [ln for ln in hlo.splitlines() if " scatter(" in ln and f"= {short}[" in ln]
    states = [torch.randn(m.k.shape, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))
                          ).to(half)] + [torch.tensor(3)] * (len(g.state_ids) - 1)
    want = evaluate(g, [_np(a) for a in (*args, *states)])
    for got in (exe(*[_np(a) for a in (*args, *states)]), exe(*args, *[s.clone() for s in states])):
        new, out = (torch.from_numpy(np.array(o, np.float32)) if not isinstance(o, torch.Tensor) else o.float()
                    for o in (got[0], got[-1]))
        np.testing.assert_array_equal(new.numpy(), want[0].astype(np.float32))
        np.testing.assert_allclose(out.numpy(), want[-1].astype(np.float32), rtol=2e-2, atol=2e-2)


def test_search_runs_on_a_state_program_and_validates_its_winner():
    from egraft.measure.inputs import random_inputs
    from egraft.measure.validate import validate
    from egraft.search.config import CompileConfig
    from egraft.search.pipeline import compile_signature

    rng = np.random.default_rng(fresh_seed())
    g = egraft.trace(Cache(), (_pos(rng, 16, 3), torch.randn(1, 2, 3, 4)))
    xs = random_inputs(g, int(rng.integers(1 << 30)))
    assert len(set(xs[0].tolist())) == 3 and np.abs(xs[2]).sum() > 0  # distinct positions, random state
    config = CompileConfig.parse({"fitness": "model", "backend": "torch", "cache": False,
                                  "budget": {"seconds": None, "trials": 3, "population": 2}})
    done = compile_signature(g, config)
    exe = done.executable
    assert validate(exe, g, xs)
    want = evaluate(g, [x.copy() for x in xs])
    got = exe(*[x.copy() for x in xs])
    for w, o in zip(want, got):
        np.testing.assert_allclose(np.asarray(o), w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_compiled_model_updates_its_buffers_like_eager(backend):
    rng = np.random.default_rng(fresh_seed())
    eager, model = Cache(), Cache()
    init = torch.from_numpy(rng.standard_normal((1, 2, 16, 4)).astype(np.float32))
    for m in (eager, model):
        m.k.copy_(init)
    pos, kv = _pos(rng, 16, 3), torch.randn(1, 2, 3, 4)
    cm = egraft.compile(model, example_inputs=(pos, kv), backend=backend, fitness="model", cache=False,
                        budget={"seconds": None, "trials": 2, "population": 2}, progress=False)
    assert torch.equal(model.k, init)  # compiling (its checks run the model) leaves the buffers as they were
    (prog,) = cm._programs.values()  # its compiled program: device, state calling convention, evidence
    names, order, own = prog.compiled.state
    assert sorted(names) == ["k", "n"] and sorted(order + own) == list(range(len(prog.executable.graph.outputs)))
    assert prog.compiled.device.kind == "cpu" and prog.validation is prog.compiled.check is not None
    ptr = model.k.data_ptr()
    for _ in range(4):
        pos, kv = _pos(rng, 16, 3), torch.from_numpy(rng.standard_normal((1, 2, 3, 4)).astype(np.float32))
        with torch.no_grad():
            want = eager(pos, kv)
        got = cm(pos, kv)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(model.k, eager.k, rtol=0, atol=0)
        assert int(model.n) == int(eager.n)
    if backend == "torch":
        assert model.k.data_ptr() == ptr  # written in place
    model.k = torch.zeros(1, 2, 16, 4, dtype=torch.float64)
    with pytest.raises(InputError, match=r"state buffer 'k' is \(1, 2, 16, 4\) float64, the compiled program "
                                         r"expects \(1, 2, 16, 4\) float32"):
        cm(pos, kv)


class Running(torch.nn.Module):
    """A running mean buffer rewritten whole (``copy_``), read before and after the write."""

    def __init__(self):
        super().__init__()
        self.register_buffer("m", torch.zeros(4, 5))

    def forward(self, x):
        old = self.m * 1
        self.m.copy_(self.m * 0.9 + x * 0.1)
        return self.m - old


@pytest.mark.parametrize("backend", ["torch", "triton", "jax"])
def test_whole_state_rewrite_is_written_back_into_the_passed_state(backend):
    rng = np.random.default_rng(fresh_seed())
    x = torch.from_numpy(rng.standard_normal((4, 5)).astype(np.float32))
    g = egraft.trace(Running(), (x,))
    exe = lower(g, backend, "cpu", {})
    m0 = rng.standard_normal((4, 5)).astype(np.float32)
    want = evaluate(g, [x.numpy(), m0.copy()])
    m = torch.from_numpy(m0.copy())
    got = exe(x, m)
    if backend != "jax":
        assert got[0] is m  # the passed state tensor, updated
    for w, o in zip(want, got):
        np.testing.assert_allclose(np.asarray(o), w, rtol=1e-6, atol=1e-6)


def test_compile_refuses_a_model_writing_into_its_input():
    class Step(torch.nn.Module):
        def forward(self, x, cache):
            cache.mul_(2)
            return x + 1

    with pytest.raises(InputError, match=r"writes into its input\(s\) \['cache'\] in place"):
        egraft.compile(Step(), example_inputs=(torch.randn(2), torch.randn(2, 2)), backend="torch", progress=False)
