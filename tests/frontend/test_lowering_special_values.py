"""NaN, +-inf and +-0.0 through every ATen lowering rule, against eager PyTorch.

``tests/backends/test_special_values.py`` covers the IR's primitives and
idioms; this module covers the rules that lower ATen onto them
(``egraft.frontend.lowering``).  Each rule's per-op cases (``opcases.CASES``)
are traced again with every float input holding NaN, +inf, -inf, +0.0 and
-0.0 mixed among ordinary values drawn from the case's own spec (integer and
bool inputs are left as they are), and each float output must agree with
torch eager: the same NaN positions, the same infinities with their sign,
the same sign wherever torch gives a zero, finite values within tolerance;
integer and bool outputs exactly.

A difference PyTorch itself is the odd one in, or one inherent to how egraft
computes a rule, is listed in ``EXPECTED`` by rule and by kind of check, with
its reason; nothing else is excused.  ``NO_FLOAT_INPUT`` names the rules that
cannot take float inputs at all.

Tiers (``pytest -m slow`` runs the sweep):

- every rule through ``ir.evaluate`` (float32);
- ``BACKEND_RULES``, one or more rules of each family, on the jax and torch
  backends, and ``TRITON_RULES`` under Triton's interpreter;
- the sweep: every rule on every backend, and the half-precision cases
  through ``evaluate``::

    PYTHONPATH=$PWD python -m pytest -q -m slow tests/frontend/test_lowering_special_values.py

On two CPU cores the first two tiers take about 80 s, the sweep about 3 min.
Inputs are drawn from the test's seed (``EGRAFT_SEED`` replays a failure).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.attention

import egraft
from egraft.backends import lower
from egraft.frontend.lowering import LOWERINGS
from egraft.frontend.tracer import export_program, lower_program
from egraft.ir import evaluate
from egraft.ir.evaluate import to_numpy
from egraft.testing import TOLERANCE, fresh_seed

from opcases import CASES
from test_lowering_ops import _Bundle

SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0)
FLOAT_KINDS = ("normal", "positive", "uniform")
CHECKS = ("NaN", "inf", "signed zero", "finite", "exact")


# --- what is excused, and why -------------------------------------------------------------------

@dataclass(frozen=True)
class Expected:
    """A named difference from torch: ``check`` is not compared for ``outputs`` (None: every output) of a rule."""

    check: str
    reason: str
    outputs: tuple | None = None  # (case index, output index) pairs

    def covers(self, check: str, case: int, output: int) -> bool:
        return self.check == check and (self.outputs is None or (case, output) in self.outputs)


NO_FLOAT_INPUT = {op: "bitwise ops are lowered for bool tensors only (integer bit manipulation has no IR primitive)"
                  for op in ("aten.bitwise_and", "aten.bitwise_or", "aten.bitwise_xor", "aten.bitwise_not")}

_ZERO_TIE = ("the larger (or smaller) of +0.0 and -0.0, which compare equal, is either one: torch's kernels and "
             "egraft's MaxReduce pick by evaluation order")
_SORT_TIE = ("tied values (equal, or +0.0 against -0.0) may come in either order: egraft's sort is stable, torch "
             "documents no order for the ties of topk, kthvalue and median")
_WELFORD = ("torch computes this mean with Welford's update, which turns a row holding an infinity into nan; "
            "egraft gives the plain mean (+-inf), as torch.mean does")

_INT_CAST = ("a float -> integer cast of nan or +-inf is undefined (C, XLA and torch differ: torch and numpy give "
             "INT_MIN on x86, XLA saturates)")

_ZERO_SUM = ("where the target is written, a sum of -0.0 contributions comes out +0.0 (the reduction starts at "
             "+0.0); torch adds into the target in order, so -0.0 + -0.0 stays -0.0")

_LERP_ZERO = ("an interpolated zero's sign follows the order its weighted terms are added (-0.0 + -0.0 is -0.0, "
              "-0.0 + 0.0 is +0.0): egraft interpolates one axis after another, torch's kernels nest the axes "
              "the other way round")

EXPECTED: dict[str, tuple[Expected, ...]] = {
    **{op: (Expected("signed zero", _LERP_ZERO),) for op in (
        "aten.upsample_linear1d", "aten.upsample_bilinear2d", "aten.upsample_trilinear3d")},
    "aten.scatter": (Expected("signed zero", _ZERO_SUM, ((0, 1),)),),  # output 1: reduce="add"
    "aten.scatter_add": (Expected("signed zero", _ZERO_SUM),),
    "aten.index_add": (Expected("signed zero", _ZERO_SUM),),
    "aten.index_put": (Expected("signed zero", _ZERO_SUM, ((3, 0),)),),  # case 3: accumulate=True
    "aten.cat": (Expected("finite", _INT_CAST, ((0, 2),)),),  # torch.cat([a, b.int()])
    "aten._to_copy": (Expected("exact", _INT_CAST, ((0, 0),)),),  # x.to(torch.int32)
    "aten.scaled_dot_product_attention": (Expected(
        "NaN", "torch's math kernel adds the causal mask (or a boolean mask) as a -inf bias, so a nan score at a "
               "masked key still makes the row nan; egraft selects (Where), so masked keys never reach the output, "
               "as torch's default fused kernel does (whether a special value lands on a masked key depends on the "
               "seed)", ((0, 1), (0, 2), (0, 4), (1, 0), (2, 0))),),
    "aten.gelu": (Expected("NaN", "torch's exact (erf) gelu gives nan at +inf; egraft gives the limit +inf, as "
                                  "torch's own tanh form does", ((0, 0), (0, 2))),
                  Expected("signed zero", "gelu(-0.0): x * Phi(x) is -0.0, which egraft and torch's scalar loop give; "
                                          "torch's vectorised CPU loop (AVX2, measured) gives +0.0, so torch's sign "
                                          "depends on where the element falls in a row")),
    "aten.native_layer_norm": (Expected("NaN", _WELFORD, ((0, 1),)),),
    "aten.native_group_norm": (Expected(  # case 0 output 0: the group norm with a weight and a bias
        "NaN", "torch's CPU kernel folds the affine into x * (rstd w) + (b - mean rstd w), so an infinite weight "
               "makes the shift infinite and x * inf + shift nan for whole channels; egraft normalises first, "
               "(x - mean) rstd w + b, as the formula reads, and gives +-inf at some of those places",
        ((0, 0),)),),
    "aten.var_mean": (Expected("NaN", _WELFORD, ((0, 1), (0, 3))),),
    "aten.convolution": (Expected("NaN", "egraft pads (and zero-stuffs, for a transposed convolution) the input "
                                         "explicitly, so an infinite or nan weight meets those zeros (0 * inf is nan); "
                                         "torch's kernels never multiply a padded tap",
                                  ((0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (2, 3))),),  # the padded ones
    "aten.topk": (Expected("exact", _SORT_TIE, ((0, 1), (0, 3))), Expected("signed zero", _SORT_TIE)),  # indices
    "aten.kthvalue": (Expected("exact", _SORT_TIE, ((0, 1), (0, 3))), Expected("signed zero", _SORT_TIE)),
    "aten.median": (Expected("exact", _SORT_TIE, ((0, 2),)), Expected("signed zero", _SORT_TIE)),
    **{op: (Expected("signed zero", _ZERO_TIE),) for op in (
        "aten.amax", "aten.amin", "aten.max.dim", "aten.min.dim", "aten.max.default", "aten.min.default",
        "aten.max_pool2d_with_indices", "aten.max_pool3d_with_indices", "aten.max_pool1d", "aten.max_pool2d",
        "aten.scatter_reduce")},
}

# Rules whose torch reference runs under a context: the kernel torch picks by default is the odd one.
TORCH_CONTEXT = {
    # the default CPU kernel (flash attention) gives 0 where the query/key rows hold nan or inf; torch's
    # math kernel, and softmax(q k^T) v written out, give nan, as egraft does
    "aten.scaled_dot_product_attention": lambda: torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH),
}


# --- inputs -----------------------------------------------------------------------------------------

def _takes_float(spec) -> bool:
    return spec.kind in FLOAT_KINDS and spec.dtype is None


def special_inputs(c, seed: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """The case's inputs, with a third of each float input's elements (and at least five: each special once, or
    every element of a smaller input) replaced by special values, at seeded random places."""
    trng, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    out = []
    for spec in (s for specs in c.sets for s in specs):
        t = spec.make(trng, dtype)
        if _takes_float(spec) and t.numel():
            flat = t.view(-1)
            n = flat.numel()
            start = int(rng.integers(len(SPECIALS)))
            for j, p in enumerate(rng.permutation(n)[:max(min(n, len(SPECIALS)), n // 3)]):
                flat[int(p)] = SPECIALS[(start + j) % len(SPECIALS)]
        out.append(t)
    return out


def _lower(model, args, raw: bool):
    if raw:  # mid-level ops reach their own rules only without the core-ATen decomposition
        return lower_program(export_program(model, args, decompositions={}))
    return egraft.trace(model, args)


@dataclass
class Traced:
    key: str
    index: int
    graph: object
    inputs: list  # numpy
    want: list  # numpy, torch eager's outputs
    tol: float


def traced(key: str, seed: int, dtype: str = "float32") -> list[Traced]:
    """Each of the rule's cases (the half-precision ones only, for a half dtype), traced on special inputs."""
    out = []
    for i, c in enumerate(CASES[key]):
        if dtype != "float32" and not c.half:
            continue
        args = special_inputs(c, seed, getattr(torch, dtype))
        model = _Bundle(c.fn, [len(s) for s in c.sets])
        with torch.no_grad(), TORCH_CONTEXT.get(key, contextlib.nullcontext)():
            want = [to_numpy(w) for w in model(*args)]
        graph = _lower(model, args, c.raw)  # that the case reaches its rule, test_lowering_ops checks
        out.append(Traced(key, i, graph, [to_numpy(a) for a in args], want,
                          c.tol if dtype == "float32" else TOLERANCE[dtype]))
    return out


# --- the comparison ---------------------------------------------------------------------------------------

def mismatches(got, want, tol: float) -> dict[str, str]:
    """Each check (of ``CHECKS``) ``got`` fails against torch's ``want``, with the first place it fails."""
    w0 = np.asarray(want)
    if w0.dtype.kind in "iub":
        same = np.asarray(got).shape == w0.shape and np.array_equal(np.asarray(got), w0)
        return {} if same else {"exact": f"{w0.dtype} values differ:\n{np.asarray(got)}\nvs torch\n{w0}"}
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if g.shape != w.shape:
        return {"exact": f"shape {g.shape} vs torch {w.shape}"}
    fin = np.isfinite(g) & np.isfinite(w)
    scale = max(1.0, float(np.abs(w[fin]).max())) if fin.any() else 1.0
    with np.errstate(invalid="ignore"):
        far = np.abs(g - w) > tol * scale
    bad = {"NaN": np.isnan(g) != np.isnan(w),
           "inf": (np.isinf(g) | np.isinf(w)) & ~np.isnan(g) & ~np.isnan(w) & (g != w),
           "signed zero": (w == 0) & (g == 0) & (np.signbit(g) != np.signbit(w)),
           "finite": fin & far}
    out = {}
    for check, b in bad.items():
        if b.any():
            i = tuple(int(j) for j in np.argwhere(b)[0])
            out[check] = f"at {i}: got {g[i]!r}, torch {w[i]!r} ({int(b.sum())} places)"
    return out


def check_rule(key: str, cases: list[Traced], outputs_of, what: str):
    """Compare ``outputs_of(traced case)`` with torch for every case; fail listing every unexcused difference."""
    expected = EXPECTED.get(key, ())
    problems = []
    for t in cases:
        got = outputs_of(t)
        assert len(got) == len(t.want), f"{what}: case {t.index} gives {len(got)} outputs, torch {len(t.want)}"
        for k, (g, w) in enumerate(zip(got, t.want)):
            for check, where in mismatches(g, w, t.tol).items():
                if not any(e.covers(check, t.index, k) for e in expected):
                    problems.append(f"case {t.index} output {k}: {check} {where}")
    assert not problems, f"{what}:\n  " + "\n  ".join(problems)


def _evaluated(t: Traced):
    with np.errstate(all="ignore"):
        return evaluate(t.graph, t.inputs)


FLOAT_RULES = sorted(k for k in CASES if k not in NO_FLOAT_INPUT)


def test_rules_without_float_inputs_are_named():
    """Every rule is either swept here or named in NO_FLOAT_INPUT with its reason, and the tables are current."""
    assert set(CASES) == set(LOWERINGS)
    no_float = {k for k, cs in CASES.items() if not any(_takes_float(s) for c in cs for ss in c.sets for s in ss)}
    assert no_float == set(NO_FLOAT_INPUT), f"rules with no float input: {sorted(no_float)}; named: {sorted(NO_FLOAT_INPUT)}"
    assert set(EXPECTED) <= set(FLOAT_RULES), f"EXPECTED names unknown rules: {sorted(set(EXPECTED) - set(FLOAT_RULES))}"
    assert all(e.check in CHECKS and e.reason for es in EXPECTED.values() for e in es)


@pytest.mark.parametrize("key", FLOAT_RULES)
def test_rule_evaluate_matches_torch(key):
    seed = fresh_seed()
    check_rule(key, traced(key, seed), _evaluated, f"{key} through evaluate (seed {seed})")


# --- the backends ---------------------------------------------------------------------------------------

# One or more rules of each family, and every rule a fix here touched (the slow sweep runs them all).
BACKEND_RULES = ["aten.abs", "aten.mul", "aten.hypot", "aten.atan", "aten.sign", "aten.trunc", "aten.floor", "aten.ceil", "aten.frac", "aten.tanh",
                 "aten.sinh", "aten.elu", "aten.copysign", "aten.pow", "aten.log1p", "aten.expm1", "aten.atan2",
                 "aten.asinh", "aten.acosh", "aten.fmax", "aten.fmin", "aten.maximum", "aten.clamp", "aten.where",
                 "aten.div", "aten.remainder", "aten.isinf", "aten.round", "aten.lerp", "aten.sum", "aten.amax",
                 "aten.argmax", "aten.var", "aten.logsumexp", "aten.cumsum", "aten.linalg_vector_norm", "aten.softmax",
                 "aten._safe_softmax", "aten.log_softmax", "aten.layer_norm", "aten._native_batch_norm_legit_no_training",
                 "aten.scaled_dot_product_attention", "aten.gather", "aten.scatter_add", "aten.index_put", "aten.cat",
                 "aten.constant_pad_nd", "aten.mm", "aten.addmm", "aten.median", "aten._adaptive_avg_pool2d"]
TRITON_RULES = ["aten.abs", "aten.sign", "aten.trunc", "aten.pow", "aten.fmax", "aten.amax", "aten.softmax",
                "aten.layer_norm"]
DEVICE = os.environ.get("EGRAFT_TEST_DEVICE", "cpu")


def _compiled(backend: str):
    device = DEVICE if backend == "triton" else "cpu"

    def outputs(t: Traced):
        return [np.asarray(o) for o in lower(t.graph, backend, device)(*t.inputs)]
    return outputs


def _on_backend(backend: str, key: str):
    seed = fresh_seed()
    check_rule(key, traced(key, seed), _compiled(backend), f"{key} on {backend} (seed {seed})")


def test_backend_rules_exist():
    assert set(BACKEND_RULES) <= set(FLOAT_RULES) and set(TRITON_RULES) <= set(BACKEND_RULES)


@pytest.mark.parametrize("key", BACKEND_RULES)
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_rule_on_backend_matches_torch(backend, key):
    _on_backend(backend, key)


@pytest.mark.parametrize("key", TRITON_RULES)
def test_rule_on_triton_matches_torch(key):
    _on_backend("triton", key)


@pytest.mark.slow
@pytest.mark.parametrize("key", FLOAT_RULES)
@pytest.mark.parametrize("backend", ["jax", "torch", "triton"])
def test_sweep_rule_on_backend(backend, key):
    _on_backend(backend, key)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("key", sorted(k for k in FLOAT_RULES if any(c.half for c in CASES[k])))
def test_sweep_rule_half_evaluate(key, dtype):
    seed = fresh_seed()
    check_rule(key, traced(key, seed, dtype), _evaluated, f"{key} ({dtype}) through evaluate (seed {seed})")


# --- the bug that started this -------------------------------------------------------------------------------

class _RsqrtAbs(torch.nn.Module):
    def forward(self, x):
        return torch.rsqrt(x.abs())


RSQRT_X = torch.tensor([-0.0, 0.0, -4.0, 0.25, math.nan, -math.inf])


def _rsqrt_abs_ok(got, what):
    want = torch.rsqrt(RSQRT_X.abs()).numpy()
    assert np.isposinf(want[:2]).all()  # torch: +inf at both zeros
    got = np.asarray(got)
    assert np.isposinf(got[:2]).all(), f"{what}: rsqrt(abs(+-0.0)) is {got[:2]}, torch gives +inf"
    assert not mismatches(got, want, 1e-6), f"{what}: {mismatches(got, want, 1e-6)}"


@pytest.mark.parametrize("where", ["evaluate", "jax", "torch", "triton"])
def test_rsqrt_of_abs_of_negative_zero_is_plus_inf(where):
    graph = egraft.trace(_RsqrtAbs(), (RSQRT_X,))
    x = RSQRT_X.numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        got = evaluate(graph, [x])[0] if where == "evaluate" else lower(graph, where, DEVICE if where == "triton" else "cpu")(x)[0]
    _rsqrt_abs_ok(got, where)


def test_rsqrt_of_abs_of_negative_zero_through_compile():
    cm = egraft.compile(_RsqrtAbs(), example_inputs=(RSQRT_X,), backend="torch", budget=1, fitness="model",
                        cache=False, progress=False)
    _rsqrt_abs_ok(cm(RSQRT_X).numpy(), "egraft.compile")
