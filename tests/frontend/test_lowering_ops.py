"""Every lowering rule against eager PyTorch on random inputs (fresh seed per run)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch

from egraft.ir import evaluate
from egraft.frontend import tracer
from egraft.frontend.tracer import export_program, lower_program
from egraft.frontend.lowering import LOWERINGS, lookup
from egraft.testing import TOLERANCE, fresh_seed, rel_err

from opcases import CASES

HALF = ("float16", "bfloat16")


class _Bundle(torch.nn.Module):
    """One module running a case's function on each of its input sets (one export per case)."""

    def __init__(self, fn, sizes):
        super().__init__()
        self.fn, self.sizes = fn, sizes

    def forward(self, *flat):
        outs, k = [], 0
        for n in self.sizes:
            r = self.fn(*flat[k:k + n])
            k += n
            outs.extend(r if isinstance(r, (tuple, list)) else [r])
        return tuple(outs)


def _inputs(c, seed, float_dtype):
    rng = torch.Generator().manual_seed(seed)
    return [spec.make(rng, float_dtype) for specs in c.sets for spec in specs]


def _np(t: torch.Tensor) -> np.ndarray:
    from egraft.ir.evaluate import to_numpy

    return to_numpy(t)


def run_case(key, c, dtype="float32", seed=None):
    seed = fresh_seed() if seed is None else seed
    args = _inputs(c, seed, getattr(torch, dtype))
    model = _Bundle(c.fn, [len(s) for s in c.sets])
    with torch.no_grad():
        want = model(*args)
    ep = export_program(model, args, decompositions={} if c.raw else None)
    reached = set()  # the rules the lowering looks up (after each node's decomposition: module training_ir)

    def seen(target):
        rule = lookup(target)
        if rule is not None:
            reached.add(rule.name)
        return rule

    with mock.patch.object(tracer, "lookup", seen):
        g = lower_program(ep)
    assert key in reached, f"case for {key} does not reach its rule (reached: {sorted(reached)})"
    got = evaluate(g, [_np(a) for a in args])
    assert len(got) == len(want)
    for k, (a, w) in enumerate(zip(got, want)):
        w_np = _np(w)
        assert a.shape == w_np.shape, f"{key} output {k}: shape {a.shape} != torch {w_np.shape} (seed {seed})"
        assert a.dtype == w_np.dtype, f"{key} output {k}: dtype {a.dtype} != torch {w_np.dtype} (seed {seed})"
        if np.issubdtype(w_np.dtype, np.floating) or w_np.dtype.name == "bfloat16":
            tol = c.tol if dtype == "float32" else TOLERANCE[dtype]
            err = rel_err(a, w_np, floor=c.floor)
            assert err <= tol, f"{key} output {k} ({dtype}): relative error {err:.3g} > {tol:g} (seed {seed})"
        else:
            assert np.array_equal(a, w_np), f"{key} output {k} ({w_np.dtype}) differs (seed {seed}):\n{a}\nvs\n{w_np}"


@pytest.mark.parametrize("key", sorted(CASES))
def test_op_float32(key):
    for c in CASES[key]:
        run_case(key, c)


HALF_KEYS = sorted(k for k, cs in CASES.items() if any(c.half for c in cs))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("key", HALF_KEYS)
def test_op_half(key, dtype):
    for c in CASES[key]:
        if c.half:
            run_case(key, c, dtype)


def test_every_rule_has_a_case():
    missing = sorted(set(LOWERINGS) - set(CASES))
    assert not missing, f"lowering rules without a per-op test case in tests/lowering/opcases.py: {missing}"
    unknown = sorted(set(CASES) - set(LOWERINGS))
    assert not unknown, f"test cases for ops with no lowering rule: {unknown}"
