"""Idioms: the idiom node, its primitive decomposition and an independent torch computation agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from egraft.ir import IDIOMS, GraphBuilder, evaluate
from egraft.ir.decompose import DECOMPOSITIONS
from egraft.testing import rel_err

from ir_testlib import rand


def _both(shapes, make_idiom, make_decomp, dtype="float32"):
    """Two graphs over the same inputs: one with the idiom node, one with its decomposition."""
    graphs = []
    for make in (make_idiom, make_decomp):
        b = GraphBuilder()
        xs = [b.input(f"x{i}", s, dtype) for i, s in enumerate(shapes)]
        graphs.append(b.build([make(b, *xs)]))
    return graphs


def _check(rng, shapes, make_idiom, make_decomp, torch_fn, what):
    g_idiom, g_dec = _both(shapes, make_idiom, make_decomp)
    assert any(n.op in IDIOMS for n in g_idiom.nodes), "the idiom graph must hold the idiom node"
    assert not any(n.op in IDIOMS for n in g_dec.nodes), "the decomposition must be primitives only"
    xs = [rand(s, "float32", rng) for s in shapes]
    (a,) = evaluate(g_idiom, xs, dtype=np.float64)
    (d,) = evaluate(g_dec, xs, dtype=np.float64)
    assert a.dtype == np.float64 and d.dtype == np.float64
    want = torch_fn(*[torch.from_numpy(x.astype(np.float64)) for x in xs]).numpy()
    assert rel_err(d, a) <= 1e-9, f"{what} {shapes}: decomposition vs idiom {rel_err(d, a):.3g}; {rng.tag}"
    assert rel_err(a, want) <= 1e-9, f"{what} {shapes}: idiom vs torch {rel_err(a, want):.3g}; {rng.tag}"
    # the float32 evaluation of the idiom stays within float32 tolerance of the oracle
    (a32,) = evaluate(g_idiom, xs)
    assert a32.dtype == np.float32 and rel_err(a32, want) <= 1e-5, f"{what} float32; {rng.tag}"


def case_matmul(rng):
    for sa, sb in [((3, 4), (4, 5)), ((1, 1), (1, 1)), ((2, 3, 7), (2, 7, 2)), ((2, 2, 3, 4), (2, 2, 4, 6))]:
        _check(rng, [sa, sb], lambda b, x, y: b.add("MatMul", (x, y)),
               lambda b, x, y: DECOMPOSITIONS["MatMul"](x, y), torch.matmul, "MatMul")


def _rowwise(name, torch_fn, attrs):
    def case(rng):
        for shape, axis in [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 9), 2)]:
            _check(rng, [shape], lambda b, x: b.add(name, (x,), axis=axis, **attrs),
                   lambda b, x: DECOMPOSITIONS[name](x, axis, *attrs.values()),
                   lambda t: torch_fn(t, axis, **attrs), name)
    return case


def _torch_layernorm(t, axis, eps):
    t = t.movedim(axis, -1)
    return F.layer_norm(t, t.shape[-1:], eps=eps).movedim(-1, axis)


def _torch_rmsnorm(t, axis, eps):
    t = t.movedim(axis, -1)
    return F.rms_norm(t, t.shape[-1:], eps=eps).movedim(-1, axis)


def case_attention(rng):
    for (q, k, v), with_bias, causal in [
        (((4, 8), (6, 8), (6, 3)), False, False),
        (((2, 5, 8), (2, 5, 8), (2, 5, 8)), False, True),
        (((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5)), True, False),
        (((2, 2, 6, 4), (2, 2, 9, 4), (2, 2, 9, 4)), True, True),  # causal with Sq < Sk (top-left aligned)
        (((1, 7, 4), (1, 3, 4), (1, 3, 2)), False, True),  # causal with Sq > Sk
    ]:
        scale = float(rng.gen.uniform(0.1, 1.0))
        shapes = [q, k, v] + ([q[:-1] + (k[-2],)] if with_bias else [])

        def torch_fn(*ts):
            mask = ts[3] if with_bias else None
            if causal:
                keep = torch.ones(q[-2], k[-2], dtype=torch.bool).tril()
                cm = torch.zeros(q[-2], k[-2], dtype=ts[0].dtype).masked_fill(~keep, float("-inf"))
                mask = cm if mask is None else mask + cm
            return F.scaled_dot_product_attention(ts[0], ts[1], ts[2], attn_mask=mask, scale=scale)

        _check(rng, shapes, lambda b, *xs: b.add("Attention", xs, scale=scale, causal=causal),
               lambda b, *xs: DECOMPOSITIONS["Attention"](*xs[:3], xs[3] if with_bias else None, scale, causal),
               torch_fn, f"Attention bias={with_bias} causal={causal}")


def test_causal_attention_matches_torch_is_causal(rng):
    """The causal flag means torch's is_causal (top-left aligned mask)."""
    shapes = [(2, 5, 8), (2, 7, 8), (2, 7, 8)]
    g, _ = _both(shapes, lambda b, *xs: b.add("Attention", xs, scale=8 ** -0.5, causal=True),
                 lambda b, *xs: xs[0])
    xs = [rand(s, "float32", rng) for s in shapes]
    (a,) = evaluate(g, xs, dtype=np.float64)
    want = F.scaled_dot_product_attention(*[torch.from_numpy(x.astype(np.float64)) for x in xs], is_causal=True)
    assert rel_err(a, want.numpy()) <= 1e-9, rng.tag


IDIOM_CASES = {
    "MatMul": case_matmul,
    "Softmax": _rowwise("Softmax", lambda t, axis: torch.softmax(t, axis), {}),
    "LayerNorm": _rowwise("LayerNorm", _torch_layernorm, {"eps": 1e-5}),
    "RMSNorm": _rowwise("RMSNorm", _torch_rmsnorm, {"eps": 1e-6}),
    "Attention": case_attention,
}


def test_every_idiom_is_tested():
    assert set(IDIOM_CASES) == set(IDIOMS) == set(DECOMPOSITIONS)


@pytest.mark.parametrize("name", sorted(IDIOM_CASES))
def test_idiom_matches_decomposition_and_torch(name, rng):
    IDIOM_CASES[name](rng)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_idioms_compute_in_float32(dt, rng):
    b = GraphBuilder()
    x, y = b.input("x", (3, 16), dt), b.input("y", (16, 4), dt)
    g = b.build([b.add("MatMul", (x, y)), b.add("Softmax", (x,), axis=1)])
    xs = [rand((3, 16), dt, rng), rand((16, 4), dt, rng)]
    mm, sm = evaluate(g, xs)
    assert str(mm.dtype) == dt and str(sm.dtype) == dt
    tx, ty = (torch.from_numpy(a.astype(np.float32)) for a in xs)
    want_mm = (tx @ ty).numpy().astype(mm.dtype)  # float32 math, one rounding
    want_sm = torch.softmax(tx, 1).numpy().astype(sm.dtype)
    assert rel_err(mm, want_mm) <= 1e-2 and rel_err(sm, want_sm) <= 1e-2, rng.tag


def test_idiom_table_does_not_import_the_builder():
    """The table sits below the builder (the registry needs it for every type check): no import upward."""
    import ast

    import egraft.ir.idioms as mod

    tree = ast.parse(open(mod.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"builder", "idiom_forms", "decompose", "tensor_base"}, imported
