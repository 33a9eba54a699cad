"""After saturation with every registered rule, the optimised forms the idiom and
model rules exist for are in the e-graph of real (traced) workloads, and an
extraction that chooses them evaluates equal to the original in float64.

"Contains" means: an e-node of the wanted form sits in a class reachable from
the outputs, an extraction forced to choose it (and the nodes under it that
make the form) still contains it after cycle repair, and that program
matches the traced graph on random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import egraft
from egraft.ir.evaluate import evaluate
from egraft.models import make
from egraft.rewrites import saturate
from egraft.search.space import Space
from egraft.testing import fresh_seed, random_inputs, rel_err


class Saturated:
    def __init__(self, name, **overrides):
        model, args = make(name, **overrides)
        self.graph = egraft.trace(model, args)
        self.res = saturate(self.graph)
        self.snap = self.res.snapshot()
        self.space = Space.from_egraph(self.res)
        self.reach = self._reachable()

    def _reachable(self):
        seen, stack = set(), list(self.space.roots)
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            for n in self.snap.nodes_of(c):
                stack.extend(n.children)
        return seen

    def is_x(self, c):
        """Class c is the model input or a reshape view of it."""
        x = self.space.inputs[0]
        return c == x or any(self.snap.nodes[k].op == "View" and self.snap.nodes[k].children == (x,)
                             for k in self.snap.classes[c])

    def greedy_avoiding(self, prefer: set, avoid: set):
        """Least-cost extraction where `prefer` e-nodes are nearly free and `avoid` ones prohibitive."""
        from egraft.search.space import default_cost

        ids = {id(n): i for i, n in enumerate(self.snap.nodes)}

        def cost(node, space):
            i = ids[id(node)]
            base = default_cost(node, space)
            return base * 1e-6 if i in prefer else base * 1e9 if i in avoid else base
        return self.space.greedy(cost)

    def shape(self, c):
        return tuple(self.snap.shape[c])

    def nodes(self, c, op):
        return [i for i in self.snap.classes[c] if self.snap.nodes[i].op == op]

    def extract(self, picks: dict[int, int]):
        """Extraction choosing e-node `picks[c]` in class c (the rest: the space's defaults)."""
        choices = {c: self.space.classes[c].index(ni) for c, ni in picks.items()}
        return self.space.extract(choices)

    def assert_equal(self, g):
        seed = fresh_seed()
        ins = random_inputs(self.graph, seed)
        want = evaluate(self.graph, ins, np.float64)
        got = evaluate(g, ins, np.float64)
        for a, b in zip(got, want):
            e = rel_err(a, b)
            assert e <= 1e-9, f"extraction differs from the traced graph: rel err {e:.3g} (seed {seed})\n{g.dump()}"


def _fused_extraction(s: Saturated, n_out: int):
    """An extraction that computes every x @ W_i through one matmul with n_out columns.

    It prefers the fused product and the slice views reading it, and rules out
    every other product of x: each class a slice lives in must take the slice.
    """
    fused = {ni for c in s.reach for ni in s.nodes(c, "MatMul")
             if s.shape(c)[-1] == n_out and s.is_x(s.snap.nodes[ni].children[0])}
    if not fused:
        return None
    fcls = {s.snap.nodes[ni].cls for ni in fused}
    slices = {vi for c in s.reach for vi in s.nodes(c, "View") if s.snap.nodes[vi].children[0] in fcls}
    slice_classes = {s.snap.nodes[vi].cls for vi in slices}
    avoid = {ni for c in slice_classes for ni in s.snap.classes[c] if ni not in slices}
    avoid |= {ni for c in s.reach for ni in s.nodes(c, "MatMul")
              if ni not in fused and s.is_x(s.snap.nodes[ni].children[0])}
    return s.greedy_avoiding(fused | slices, avoid)


def _uses_fused(g, n_out):
    fused = [i for i, n in enumerate(g.nodes) if n.op == "MatMul" and n.shape[-1] == n_out]
    slices = [n for n in g.nodes if n.op == "View" and n.inputs and n.inputs[0] in fused]
    return len(fused) == 1 and len(slices) >= 2 and len(_per_call_products(g)) == len(fused) + _later(g, fused)


def _later(g, fused):
    """Per-call products that consume the fused product's output (the down/B projections)."""
    dep = [False] * len(g.nodes)
    for i, n in enumerate(g.nodes):
        dep[i] = i in fused or any(dep[j] for j in n.inputs)
    return sum(1 for i, n in enumerate(g.nodes) if dep[i] and i not in fused and n.op in ("MatMul", "SumReduce"))


def test_gated_mlp_has_one_matmul_on_concatenated_gate_up_weights():
    s = Saturated("gated_mlp")
    inter = s.graph.weights["gate_proj.weight"].shape[0]
    g = _fused_extraction(s, 2 * inter)
    assert g is not None, "no matmul against concatenated gate/up weights reachable from the output"
    assert _uses_fused(g, 2 * inter), g.dump()
    s.assert_equal(g)


def test_lora_has_x_at_A_fused_with_x_at_W():
    s = Saturated("lora_linear")
    n_out = s.graph.weights["weight"].shape[0] + s.graph.weights["lora_A"].shape[1]
    g = _fused_extraction(s, n_out)
    assert g is not None, "no matmul of x against cat(W^T, A) reachable from the output"
    assert _uses_fused(g, n_out), g.dump()
    s.assert_equal(g)


def _per_call_products(g):
    """Products (MatMul / SumReduce) that depend on a model input, i.e. run on every call."""
    dep = [False] * len(g.nodes)
    for i, n in enumerate(g.nodes):
        dep[i] = i in g.input_ids or any(dep[j] for j in n.inputs)
    return [n for i, n in enumerate(g.nodes) if dep[i] and n.op in ("MatMul", "SumReduce")]


def test_lora_adapter_merges_into_the_weight():
    """x @ W^T + ((x @ A) @ B) * s  ->  x @ (W^T + (A @ B) * s): one per-call product."""
    s = Saturated("lora_linear")
    x = s.space.inputs[0]
    for root in s.space.roots:
        for vi in s.nodes(root, "View") + s.nodes(root, "MatMul"):
            node = s.snap.nodes[vi]
            inner = node.children[0] if node.op == "View" else root
            for mi in s.nodes(inner, "MatMul"):
                a = s.snap.nodes[mi].children[0]
                if a != x and not any(s.snap.nodes[k].children == (x,) for k in s.snap.classes[a]):
                    continue
                picks = {root: vi, inner: mi} if node.op == "View" else {root: mi}
                picks.update({a: k for k in s.snap.classes[a] if s.snap.nodes[k].children == (x,)})
                g = s.extract(picks)
                if len(_per_call_products(g)) == 1:
                    s.assert_equal(g)
                    return
    pytest.fail("no single x @ merged-weight product in the output class")


def _is_input_or_view(g, i):
    n = g.nodes[i]
    return n.op == "Input" or (n.op == "View" and g.nodes[n.inputs[0]].op == "Input")


def test_rmsnorm_linear_applies_the_scale_after_the_matmul():
    s = Saturated("rmsnorm_linear")
    for c in s.reach:
        for mi in s.nodes(c, "Mul"):
            p, r = s.snap.nodes[mi].children
            for p, r in ((p, r), (r, p)):
                for mm in s.nodes(p, "MatMul"):
                    if not s.is_x(s.snap.nodes[mm].children[0]):
                        continue  # the norm must be entirely behind the product
                    for vi in s.nodes(r, "View"):
                        v = s.snap.nodes[vi]
                        if v.attrs["strides"][-1] == 0:  # a per-row scale
                            g = s.extract({c: mi, p: mm, r: vi})
                            ok = [i for i, n in enumerate(g.nodes) if n.op == "Mul" and any(
                                g.nodes[j].op == "MatMul" and _is_input_or_view(g, g.nodes[j].inputs[0])
                                for j in n.inputs)]
                            if ok:
                                s.assert_equal(g)
                                return
    pytest.fail("no rsqrt-row-scale * (x @ W') form reachable from the output")


@pytest.mark.parametrize("name", ["gqa_attention"])
def test_attention_has_the_online_softmax_form(name):
    s = Saturated(name)
    for c in s.reach:
        rank = len(s.shape(c))
        for mi in s.nodes(c, "Mul"):
            o, inv = s.snap.nodes[mi].children
            for si in s.nodes(o, "SumReduce"):
                prod = s.snap.nodes[si].children[0]
                for pi in s.nodes(prod, "Mul"):
                    for kid in s.snap.nodes[pi].children:
                        for mm in s.nodes(kid, "MatMul"):
                            a = s.snap.nodes[mm].children[0]
                            ash = s.shape(a)
                            if len(ash) == rank + 1 and ash[-2] == s.shape(c)[-2] and ash[-3] >= 2:
                                g = s.extract({c: mi, o: si, prod: pi, kid: mm})
                                tiled = [n for n in g.nodes if n.op == "MatMul" and len(g.nodes[n.inputs[0]].shape) == rank + 1
                                         and g.nodes[n.inputs[0]].shape[-3] >= 2]
                                if tiled:
                                    assert not any(n.op == "Softmax" for n in g.nodes)
                                    s.assert_equal(g)
                                    return
    pytest.fail("no tiled online-softmax attention form reachable from the output")
