"""The roofline cost model: a lower bound on a program's per-call time, kernel by kernel.

``estimate(graph, backend, knobs, device)`` cuts the graph into the kernels
the backend would run (``kernels.py``), prices each as
``max(flops / peak, bytes / bandwidth) + launch`` and sums them.  It is a
bound, not a prediction: every kernel is assumed to reach the device's peak
arithmetic rate or its peak bandwidth, whichever binds.  Its use is ranking
candidates before (or instead of) timing them, which
:func:`rank_correlation` checks against measurements.

Assumptions, each a single place to change:

* **Per call only.** Weight-only work is folded at build
  (``backends.fold.plan``, which each backend's plan applies): folded values
  are weights the kernels read (their bytes count), their computation does not.
* **Peaks.** ``spec`` if given, else ``egraft.measure.spec_for(device)`` (measured
  once per process on CPU, about a second; the datasheet table on CUDA/TPU,
  an assumed H100 SXM / TPU v5e, named so, where the device cannot be asked).
  Contractions and attention run at the peak of their dtype (``tf32`` under
  Triton's ``tf32`` knob); everything else computes in float32 (half types
  are widened, as the IR's semantics say), float64 in float64.  A dtype the
  spec does not list falls back to float32, then to the spec's best rate.
* **Launch overhead** per kernel, by device kind (:data:`LAUNCH_S`): about
  1 µs per XLA op boundary on CPU and on TPU, 3 µs per CUDA kernel launch.
  Fixed per-call costs (argument handling, Python) are not included.
* **Fusion.** Each backend's record says which kernels a call runs
  (``Backend.plan`` -> ``backends.base.KernelPlan``, given every knob, the
  defaults filling in those not chosen): Triton its own partitioner after the
  idiom expansion its build does; ``jax`` / ``torch`` the XLA-like rules of
  ``backends.xla_fusion`` (knobs ``idioms`` and ``peephole`` honoured, the
  others do not change the work; causal attention priced as full attention).
  A graph that only returns its inputs runs no kernel and is bounded by 0.
* **Extraction.** :func:`node_cost` prices one e-node alone (no fusion, no
  sharing); ``Space.greedy`` sums it over trees, so it cannot see that a
  value shared by two consumers is computed once (it may pick
  ``x @ (0.5 * W)`` beside ``x @ W`` where one product would do).
  ``estimate`` of the extracted graph is the judge.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from ..backends import get_backend, resolve
from ..backends.base import default_knobs
from ..ir import egraph
from ..ir.egraph import ENode
from ..ir import Group, Op
from ..ir.graph import Graph
from ..measure import DeviceSpec, parse, spec_for
from ..measure.specs import H100_SXM, TPU_V5E
from . import kernels as K
from .space import Space

LAUNCH_S = {"cpu": 1e-6, "cuda": 3e-6, "tpu": 1e-6}
"""Seconds of fixed cost per kernel, by device kind (an assumption, not a measurement)."""


@dataclass(frozen=True)
class KernelCost:
    ops: tuple[str, ...]  # IR ops fused in this kernel (computed ones, in node order; views and leaves left out)
    flops: float  # arithmetic ops (a multiply-add = 2)
    bytes: float  # bytes read from + written to memory by the kernel
    dtype: str  # the dtype its arithmetic runs in (for the peak)
    bound_s: float  # max(flops/peak, bytes/bandwidth) + launch overhead


@dataclass(frozen=True)
class Estimate:
    kernels: tuple[KernelCost, ...]
    flops: float
    bytes: float
    bound_s: float  # roofline lower bound of the whole program (sum of kernel bounds)
    device: str
    spec_name: str

    def as_dict(self) -> dict:
        d = asdict(self)
        d["kernels"] = [{**k, "ops": list(k["ops"])} for k in d["kernels"]]
        return d


# -- device peaks ------------------------------------------------------------------------------
_SPECS: dict[str, DeviceSpec] = {}


def device_spec(device: str = "cpu") -> DeviceSpec:
    """`device`'s spec, resolved once per process.

    A CUDA or TPU device that is absent here or missing from the datasheet
    table gets H100 SXM's or TPU v5e's figures, with the assumption in its name.
    """
    d = parse(device)
    key = str(d)
    if key not in _SPECS:
        try:
            spec, why = spec_for(key), "is not in the datasheet table"
        except Exception as e:  # no such device on this machine (no GPU, no TPU runtime)
            if d.kind == "cpu":
                raise
            spec, why = None, f"could not be queried here ({type(e).__name__})"
        if spec is None:
            like = TPU_V5E if d.kind == "tpu" else H100_SXM
            spec = DeviceSpec(f"{like.name} (assumed: {key} {why})", dict(like.flops), like.bandwidth, like.source)
        _SPECS[key] = spec
    return _SPECS[key]


def peak(spec: DeviceSpec, dtype: str) -> float:
    """Peak rate for `dtype`, falling back to float32, then to the best rate listed (inf: compute is free)."""
    p = spec.peak(dtype) or spec.peak("float32") or max(spec.flops.values(), default=0.0)
    return p if p and p > 0 else math.inf


def roofline(spec: DeviceSpec, flops: float, nbytes: float, dtype: str, launch: float) -> float:
    compute = flops / peak(spec, dtype)
    memory = nbytes / spec.bandwidth if spec.bandwidth > 0 else 0.0
    return max(compute, memory) + launch


def _arith_dtype(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def _kernel_dtype(graph: Graph, k: K.Kernel, tf32: bool) -> str:
    if k.contraction is None:
        return _arith_dtype(graph.nodes[k.root].dtype)
    dt = graph.nodes[k.contraction].dtype
    return "tf32" if tf32 and dt == "float32" else dt


def estimate(graph: Graph, backend: str = "jax", knobs: dict | None = None, device: str = "cpu",
             spec: DeviceSpec | None = None) -> Estimate:
    """The roofline lower bound of one call of `graph` lowered by `backend` (a registered one, or ``"auto"``)
    for `device`, on the kernels of the backend's plan."""
    b = get_backend(resolve(backend, device))
    knobs = {**default_knobs(b.knobs(graph)), **(knobs or {})}
    spec = spec or device_spec(device)
    launch = LAUNCH_S[parse(device).kind]
    p = b.plan(graph, knobs)
    main = p.graph
    out = []
    for k in K.kernels(main, set(p.roots), dict(p.dots)):
        root = main.nodes[k.root]
        nbytes = sum(n * K.itemsize(p.stored.get(j, main.nodes[j].dtype)) for j, n in k.reads.items())
        nbytes += k.writes * K.itemsize(root.dtype)
        dt = _kernel_dtype(main, k, p.tf32)
        ops = tuple(main.nodes[i].op for i in k.nodes if main.nodes[i].op not in Group.LEAF | Group.MOVEMENT)
        out.append(KernelCost(ops, float(k.flops), float(nbytes), dt, roofline(spec, k.flops, nbytes, dt, launch)))
    return Estimate(tuple(out), sum(k.flops for k in out), sum(k.bytes for k in out), sum(k.bound_s for k in out),
                    str(device), spec.name)


# -- per e-node cost, for extraction ------------------------------------------------------------------
def weight_only_classes(space: Space) -> list[bool]:
    """Per class: does it hold a program reading only weights, constants and iotas (folded at build)?"""
    return egraph.weight_only_classes(space.nodes, space.n_classes)


def stored_sizes(space: Space, wo: list[bool]) -> list[int]:
    """Per class, bytes per element a product reads it in: a weight-only class that is a view or widening of a
    narrower weight (``Cast`` of a bfloat16 or int8 weight to float32) is read as stored (the CPU products widen
    it in registers); any other class in its own dtype."""
    size = [K.itemsize(d) for d in space.dtype]
    moves = [(c, space.nodes[ni].children[0]) for c, members in enumerate(space.classes) if wo[c]
             for ni in members if space.nodes[ni].op in (Op.Cast, Op.View) and space.nodes[ni].children]
    for _ in range(8):  # chains of views and casts are short; a fixed point in a few passes
        changed = False
        for c, child in moves:
            if wo[child] and size[child] < size[c]:
                size[c], changed = size[child], True
        if not changed:
            break
    return size


def node_cost(spec: DeviceSpec | None = None, device: str = "cpu") -> Callable[[ENode, Space], float]:
    """Roofline seconds of one e-node run alone, for ``Space.greedy(cost_fn=...)``.

    The node reads its children and writes its output (no fusion: that is
    what makes an idiom beat its primitive form and a matmul beat the
    broadcast product), plus one launch.  Leaves, views and weight-only
    nodes (folded at build) cost 0; a weight-only operand is read in its
    stored dtype (:func:`stored_sizes`).
    """
    spec = spec or device_spec(device)
    launch = LAUNCH_S[parse(device).kind]
    memo: dict = {}

    def cost(node: ENode, space: Space) -> float:
        if memo.get("space") is not space:
            memo.clear()
            memo.update(space=space, wo=weight_only_classes(space))
            memo.update(stored=stored_sizes(space, memo["wo"]))
        if node.op in Group.LEAF or node.op in Group.MOVEMENT or all(memo["wo"][c] for c in node.children):
            return 0.0
        out, dt = space.shape[node.cls] or (), space.dtype[node.cls] or "float32"
        ins = [space.shape[c] or () for c in node.children]
        flops = K.op_flops(node.op, out, ins)
        nbytes = K.numel(out) * K.itemsize(dt) + sum(K.numel(s) * memo["stored"][c]
                                                    for s, c in zip(ins, node.children))
        if node.op == Op.Scatter:  # the updates are stored too (over the copy of the target)
            nbytes += K.numel(ins[2]) * K.itemsize(dt)
        arith = dt if node.op in K.CONTRACTING else _arith_dtype(dt)
        return roofline(spec, flops, nbytes, arith, launch)

    return cost


# -- checking the model against measurements ----------------------------------------------------------
def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1  # ties share their average rank
        i = j + 1
    return ranks


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rho of paired samples (ties get their average rank); nan when either side has < 2 distinct values."""
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    if len(xs) != len(ys):
        raise ValueError(f"rank_correlation needs paired samples, got {len(xs)} and {len(ys)} values")
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return math.nan
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy)


__all__ = ["LAUNCH_S", "Estimate", "KernelCost", "device_spec", "estimate", "node_cost",
           "rank_correlation", "roofline", "stored_sizes", "weight_only_classes"]
