"""JAX-specific op tests: knob variants of the conformance cases, jaxpr shapes, errors, torch in/out.

The per-op checks (every primitive, View form and idiom against
``ir.evaluate``) are in ``test_conformance.py``, run on every backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from conformance import all_cases, case
from jax_helpers import check_graph

from egraft.backends import lower
from egraft.errors import BackendError
from egraft.ir import GraphBuilder, Group, evaluate
from egraft.ir.builder import Tensor
from egraft.testing import assert_close, fresh_seed


def _ops(c):
    return {n.op for n in c.graph().nodes}


# knob settings that change how the JAX backend lowers a case, and the cases they matter for
KNOB_VARIANTS = [
    ({"idioms": "primitive"}, lambda ops: bool(ops & Group.IDIOM)),  # idioms as their primitive forms
    ({"peephole": False}, lambda ops: bool(ops & Group.INDEX)),  # Gather as take_along_axis, no jnp.take
]
VARIANT_CASES = [pytest.param(k, c, id=f"{'-'.join(f'{a}={v}' for a, v in k.items())}-{c.name}")
                 for k, wants in KNOB_VARIANTS for c in all_cases() if wants(_ops(c))]


@pytest.mark.parametrize("knobs,c", VARIANT_CASES)
def test_conformance_case_under_knobs(knobs, c):
    seed = fresh_seed()
    g = c.graph()
    ins = c.inputs(g, np.random.default_rng(seed))
    got = lower(g, "jax", "cpu", knobs)(*ins)
    assert_close(got, evaluate(g, ins), [d for _, d in g.output_types()], tol=c.tol,
                 what=f"{c.name} knobs={knobs} (seed={seed})")


def test_index_select_pattern_uses_take():
    """Gather with an index broadcast along the other axes (embedding) becomes jnp.take."""
    seed = fresh_seed()
    b = GraphBuilder()
    table = b.weight("table", np.random.default_rng(seed).standard_normal((11, 6)).astype(np.float32))
    ids = b.input("ids", (2, 5), "int64")
    out = table.index_select(0, ids)
    g = b.build([out])
    ex = check_graph(g, seed, index_ranges={"ids": 11}, what="index_select")
    assert ex.stats["peephole_takes"] == 1
    assert "take_along_axis" not in str(ex.jaxpr())
    ex2 = check_graph(g, seed, knobs={"peephole": False}, index_ranges={"ids": 11}, what="index_select, no peephole")
    assert ex2.stats["peephole_takes"] == 0 and "take_along_axis" in str(ex2.jaxpr())


def test_matmul_library_call_is_dot_general():
    g = case("matmul_float32").graph()
    ex = check_graph(g, fresh_seed())
    assert "dot_general" in {e.primitive.name for e in ex.jaxpr().jaxpr.eqns}


@pytest.mark.parametrize("knobs", [{"precision": "default"}, {"weights": "constants"},
                                   {"peephole": False, "idioms": "primitive"}])
def test_non_default_knobs(knobs):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (3, 8), "float32")
    w = b.weight("w", rng.standard_normal((8, 6)).astype(np.float32))
    h = (x @ w).softmax(-1)
    g = b.build([b.add("LayerNorm", (h,), axis=1, eps=1e-5), h.argmax(-1)])
    check_graph(g, seed, knobs=knobs, what=str(knobs))


def test_unknown_knob_and_device_are_clear_errors():
    b = GraphBuilder()
    g = b.build([b.input("x", (2,), "float32")])
    with pytest.raises(BackendError, match="no knob 'bogus'"):
        lower(g, "jax", "cpu", {"bogus": 1})
    with pytest.raises(BackendError, match="unknown device"):
        lower(g, "jax", "gpu0")
    import jax

    if not any(d.platform == "gpu" for d in jax.devices()):
        with pytest.raises(BackendError, match="no cuda device"):
            lower(g, "jax", "cuda:0")


def test_torch_in_torch_out():
    import torch

    seed = fresh_seed()
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    ids = b.input("ids", (3,), "int64")
    g = b.build([x.softmax(-1), ids + 1, x.cast("bfloat16")])
    ex = lower(g, "jax", "cpu")
    gen = torch.Generator().manual_seed(seed)
    xt = torch.randn(3, 4, generator=gen)
    it = torch.randint(0, 100, (3,), generator=gen)
    y, j, h = ex(xt, it)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and j.dtype == torch.int64 and h.dtype == torch.bfloat16
    torch.testing.assert_close(y, torch.softmax(xt, -1), rtol=1e-5, atol=1e-6)
    assert torch.equal(j, it + 1)
    assert torch.equal(h, xt.to(torch.bfloat16))
    # run_jax: jax arrays in and out, no conversions
    import jax.numpy as jnp
    outs = ex.run_jax([jnp.asarray(xt.numpy()), jnp.asarray(it.numpy().astype(np.int32))])
    np.testing.assert_allclose(np.asarray(outs[0]), y.numpy(), rtol=1e-6)
    from egraft.errors import InputError
    with pytest.raises(InputError, match="shape"):
        ex(torch.zeros(2, 4), it)
    with pytest.raises(InputError, match="dtype"):
        ex(xt.double(), it)
    # bool and bfloat16 inputs (bfloat16 has no numpy view: it crosses by DLPack), a non-contiguous input
    b2 = GraphBuilder()
    m = b2.input("m", (3, 4), "bool")
    hb = b2.input("h", (3, 4), "bfloat16")
    xf = b2.input("xf", (3, 4), "float32")
    ex2 = lower(b2.build([Tensor.where(m, hb.cast("float32") + xf, 0.0)]), "jax", "cpu")
    mt = torch.rand(3, 4, generator=gen) < 0.5
    ht = torch.randn(3, 4, generator=gen).to(torch.bfloat16)
    xft = torch.randn(4, 3, generator=gen).t()
    (got,) = ex2(mt, ht, xft)
    torch.testing.assert_close(got, torch.where(mt, ht.float() + xft, torch.zeros(())), rtol=1e-6, atol=0)


@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_kv_cache_write_indexes_one_axis(idt):
    """Scatter with a position vector broadcast along the other axes (the KV-cache write) is
    ``x.at[:, :, pos].set(u)``, not a full index grid; without the peephole it is the general scatter."""
    c, seed = case(f"scatter_kv_cache_{idt}"), fresh_seed()
    g = c.graph()
    ins = c.inputs(g, np.random.default_rng(seed))
    for knobs, puts in (({}, 1), ({"peephole": False}, 0)):
        ex = lower(g, "jax", "cpu", knobs)
        assert_close(ex(*ins), evaluate(g, ins), [d for _, d in g.output_types()], what=f"kv cache {knobs}")
        assert ex.stats["peephole_puts"] == puts, ex.stats
