"""Targeted cases for the idiom and model rules (the generic per-rule soundness test in
test_rule_soundness.py runs each rule on its own witness; these cover the
interplay with the other rules, near misses that must NOT match, and edge cases
such as fully masked softmax rows)."""

from __future__ import annotations

import numpy as np
import pytest

from egraft.ir.builder import GraphBuilder, Tensor
from egraft.ir.evaluate import evaluate
from egraft.ir.decompose import attention_decomposed
from egraft.rewrites import saturate
from egraft.rewrites.ruleset import all_rules
from egraft.rewrites import Limits
from egraft.search.space import Space
from egraft.testing import fresh_seed, random_inputs, rel_err

IDIOMS = all_rules(families=["idioms"])
MODEL_RULES = all_rules(families=["models"])
LIMITS = Limits(iterations=12, seconds=30, repeated_layers=False)


def _grow(graph, rules):
    res = saturate(graph, rules=rules, limits=LIMITS)
    return res, res.snapshot(), Space.from_egraph(res)


def _check(graph, got, seed):
    ins = random_inputs(graph, seed)
    want = evaluate(graph, ins, np.float64)
    out = evaluate(got, ins, np.float64)
    for a, b in zip(out, want):
        e = rel_err(a, b)
        assert e <= 1e-9, f"rel err {e:.3g} (seed {seed})\n{got.dump()}"


def _pick(snap, space, cls, op):
    """Extraction that chooses the first `op` e-node of class `cls`, or None."""
    for k, ni in enumerate(space.classes[cls]):
        if snap.nodes[ni].op == op:
            return space.extract({cls: k})
    return None


def _ops(snap):
    return {n.op for n in snap.nodes}


# --- idioms recognised from the builder's primitive forms ---------------------------------------------

def _prog(kind, rng):
    b = GraphBuilder()
    sh = tuple(int(d) for d in rng.integers(2, 6, size=int(rng.integers(2, 4))))
    x = b.input("x", sh, "float32")
    if kind == "MatMul":
        w = b.weight("w", rng.standard_normal((int(rng.integers(2, 6)), sh[-1])).astype(np.float32))
        return b.build([x @ w.T])
    if kind == "Softmax":
        return b.build([x.softmax(-1)])
    if kind == "LayerNorm":
        return b.build([x.layer_norm(1e-5)])
    if kind == "RMSNorm":
        return b.build([x.rms_norm(1e-6)])
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["MatMul", "Softmax", "LayerNorm", "RMSNorm"])
def test_idiom_is_in_the_root_class(kind):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    for _ in range(2):  # two random shapes
        g = _prog(kind, rng)
        res, snap, sp = _grow(g, IDIOMS)
        got = _pick(snap, sp, sp.roots[0], kind)
        assert got is not None, f"{kind} not in the root class (seed {seed})"
        assert kind in got.op_counts()
        _check(g, got, seed)


@pytest.mark.parametrize("causal,bias", [(False, False), (True, False), (False, True), (True, True)])
def test_attention_idiom_from_its_decomposition(causal, bias):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    sq, sk, d = (int(v) for v in rng.integers(2, 6, size=3))
    sk = sq if causal else sk
    q, k, v = (b.input(n, (2, s, d), "float32") for n, s in (("q", sq), ("k", sk), ("v", sk)))
    bb = b.input("bias", (2, sq, sk), "float32") if bias else None
    g = b.build([attention_decomposed(q, k, v, bias=bb, causal=causal)])
    res, snap, sp = _grow(g, IDIOMS)
    att = [n for n in snap.nodes if n.op == "Attention" and n.cls == sp.roots[0]]
    assert att and all(n.attrs["causal"] == causal for n in att), f"seed {seed}"
    assert {len(n.children) for n in att} == {4 if bias else 3}
    _check(g, _pick(snap, sp, sp.roots[0], "Attention"), seed)


# --- near misses: same shape of program, different meaning --------------------------------------------------

def _near_miss(kind):
    b = GraphBuilder()
    x = b.input("x", (3, 5), "float32")
    if kind == "Softmax":  # exp2 without the log2(e) factor is not exp
        e = (x - x.max(-1, keepdim=True)).exp2()
        return b.build([e * e.sum(-1, keepdim=True).recip()])
    if kind == "RMSNorm":  # mean over the wrong count
        return b.build([x * ((x * x).sum(-1, keepdim=True) * (1 / 6) + 1e-6).rsqrt()])
    if kind == "LayerNorm":  # variance of a different tensor than the one normalised
        y = b.input("y", (3, 5), "float32")
        d = x - x.mean(-1, keepdim=True)
        return b.build([d * ((y * y).mean(-1, keepdim=True) + 1e-5).rsqrt()])
    if kind == "MatMul":  # an elementwise product summed: no operand is broadcast
        y = b.input("y", (3, 5, 4), "float32")
        return b.build([(x.unsqueeze(-1).expand((3, 5, 4)) * y).sum(-2)])
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["Softmax", "RMSNorm", "LayerNorm", "MatMul"])
def test_near_misses_are_not_idioms(kind):
    g = _near_miss(kind)
    _, snap, _ = _grow(g, IDIOMS)
    assert kind not in _ops(snap)


def test_anti_causal_mask_is_not_causal_attention():
    b = GraphBuilder()
    q, k, v = (b.input(n, (2, 4, 3), "float32") for n in "qkv")
    s = b.add("MatMul", [q, k.transpose(-2, -1)]) * 0.5
    i = b.iota(4, "int64").reshape((4, 1))
    j = b.iota(4, "int64").reshape((1, 4))
    s = Tensor.where(j >= i, s, float("-inf"))  # keeps the future: not causal
    g = b.build([b.add("MatMul", [b.add("Softmax", [s], axis=2), v])])
    _, snap, _ = _grow(g, IDIOMS)
    assert not any(n.op == "Attention" and n.attrs["causal"] for n in snap.nodes)


# --- online softmax edge cases ---------------------------------------------------------------------

def test_online_softmax_with_fully_masked_tiles_and_rows():
    """Causal with Sq < Sk leaves whole key tiles masked (must contribute 0, not NaN);
    a fully masked row must stay NaN exactly as softmax gives."""
    seed = fresh_seed()
    b = GraphBuilder()
    sq, sk = 3, 8
    s = b.input("s", (2, sq, sk), "float32")
    v = b.input("v", (2, sk, 3), "float32")
    i = b.iota(sq, "int64").reshape((sq, 1))
    j = b.iota(sk, "int64").reshape((1, sk))
    keep = (j <= i) & (i > 0)  # row 0 fully masked
    p = b.add("Softmax", [Tensor.where(keep, s, float("-inf"))], axis=2)
    g = b.build([b.add("MatMul", [p, v])])
    res, snap, sp = _grow(g, [r for r in IDIOMS if r.name == "idioms.online-softmax"])
    got = _pick(snap, sp, sp.roots[0], "Mul")
    assert got is not None and "Softmax" not in got.op_counts()
    ins = random_inputs(g, seed)
    want = evaluate(g, ins, np.float64)[0]
    out = evaluate(got, ins, np.float64)[0]
    assert np.isnan(want[:, 0]).all() and np.array_equal(np.isnan(out), np.isnan(want))
    assert rel_err(out[:, 1:], want[:, 1:]) <= 1e-9, f"seed {seed}"


# --- model rules together ------------------------------------------------------------------------------------

def test_qkv_three_way_fusion():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (2, 4, 6), "float32")
    ns = [int(n) for n in rng.integers(2, 6, size=3)]
    outs = [x @ b.weight(f"w{i}", rng.standard_normal((n, 6)).astype(np.float32)).T for i, n in enumerate(ns)]
    g = b.build([(outs[0] * outs[0]).sum(-1) + (outs[1] * outs[1]).sum(-1) + outs[2].sum(-1)])
    res, snap, sp = _grow(g, IDIOMS + MODEL_RULES)
    fused = [n for n in snap.nodes if n.op == "MatMul" and snap.shape[n.cls][-1] == sum(ns)]
    assert fused, f"no fused QKV matmul (seed {seed})"
    _check(g, sp.greedy(), seed)


def test_batchnorm_folds_into_the_conv_weights():
    """conv (sliding-window view + matmul) then eval-mode BN: an extraction exists whose
    per-call work after the product is only bias additions."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rule = next(r for r in MODEL_RULES if r.name == "models.affine-fold")
    g = rule.witness(rng).lhs
    res, snap, sp = _grow(g, IDIOMS + MODEL_RULES)
    root = sp.roots[0]
    for ai in sp.classes[root]:
        add = snap.nodes[ai]
        if add.op != "Add":
            continue
        for prev in add.children:
            for k, pi in enumerate(sp.classes[prev]):
                inner = snap.nodes[pi]
                if inner.op != "Add":
                    continue
                for mm in inner.children:
                    for m, mi in enumerate(sp.classes[mm]):
                        if snap.nodes[mi].op != "MatMul":
                            continue
                        got = sp.extract({root: sp.classes[root].index(ai), prev: k, mm: m})
                        dep = [False] * len(got.nodes)
                        for i, n in enumerate(got.nodes):
                            dep[i] = i in got.input_ids or any(dep[j] for j in n.inputs)
                        per_call = {n.op for i, n in enumerate(got.nodes) if dep[i]} - {"Input", "View"}
                        if per_call == {"MatMul", "Add"}:
                            _check(g, got, seed)
                            return
    pytest.fail(f"no extraction with the batch norm folded into the weights (seed {seed})")
