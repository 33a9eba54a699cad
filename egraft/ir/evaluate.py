"""The reference interpreter: numpy, exact to the op table's semantics.

``evaluate(graph, inputs, dtype=None)`` runs a graph on numpy arrays.  With
``dtype=np.float64`` every floating-point value is computed in float64:
that is the oracle every rewrite and backend is checked against.  A weight
stays in its own dtype (the model's memory, never a float64 copy of it):
data movement (views, gathers) and casts between float types run on it as
it is, which is exact, and a product widens it a block at a time.
Otherwise values are stored in their own dtype and half types are computed
in float32 and rounded after each op.
"""

from __future__ import annotations

import string
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InputError, IRError
from . import dtypes
from .graph import Graph
from .op_groups import Group, Op, get_op
from .signature import shape_accepts, shape_str
from .tensors import as_numpy as to_numpy  # a numpy array, a torch tensor or a scalar/list, as numpy


def _storage(dt: str, oracle: bool) -> np.dtype:
    return np.dtype(np.float64) if oracle and dtypes.is_float(dt) else dtypes.to_numpy(dt)


def _compute(dt: str, oracle: bool) -> np.dtype:
    return np.dtype(np.float64) if oracle and dtypes.is_float(dt) else dtypes.compute_dtype(dt)


# ops exact in any dtype (they copy elements): the oracle runs them on a weight in its own dtype
_MOVES = Group.MOVEMENT | {Op.Gather}
_BLOCK_BYTES = 64 << 20  # the most of one operand a product widens to float64 at a time


def _dtype_ok(got: np.dtype, want: str, oracle: bool) -> bool:
    """Exactly the declared dtype; the oracle also takes any float array for a float input."""
    return got == dtypes.to_numpy(want) or (oracle and dtypes.is_float(want) and np.issubdtype(got, np.floating))


def check_inputs(graph: Graph, inputs: Sequence[Any], oracle: bool = False) -> list[np.ndarray]:
    """Convert the call inputs and check them against ``graph.signature`` (count, then each shape and dtype).

    The inputs are the signature's ``run_inputs``: the model's own inputs, then each state's current value.
    """
    specs = graph.signature.run_inputs
    if len(inputs) != len(specs):
        state = [s.name for s in specs if s.role == "state"]
        raise InputError(
            f"the graph takes {len(specs)} input(s) ({', '.join(s.name for s in specs)}), got {len(inputs)}; "
            "pass the model's own inputs in the model's order (weights are bound)"
            + (f", then the current value of each state ({', '.join(state)})" if state else "")
        )
    out = []
    for spec, x in zip(specs, inputs):
        name, dt = spec.name, spec.dtype
        what = "state" if spec.role == "state" else "input"
        arr = to_numpy(x, f"{what} {name!r}")
        if not shape_accepts(spec.shape, arr.shape):
            raise InputError(f"{what} {name!r} has shape {shape_str(arr.shape)}, the graph expects "
                             f"{shape_str(spec.shape)} (a {dt} tensor)")
        got = arr.dtype
        if not _dtype_ok(got, dt, oracle):
            raise InputError(
                f"{what} {name!r} has dtype {got}, the graph expects {dt} (shape {shape_str(spec.shape)}); convert it "
                f"(e.g. x.astype('{dt}') or tensor.to(torch.{dt}))"
            )
        out.append(arr)
    return out


def evaluate(
    graph: Graph,
    inputs: Sequence[Any],
    dtype=None,
    weights: Mapping[str, Any] | None = None,
) -> list[np.ndarray]:
    """Run `graph` on `inputs` (the model's own inputs, in order, then each state's current value); returns the outputs.

    `weights` overrides bound weight values by name.  `dtype=np.float64`
    selects the float64 oracle mode.
    """
    oracle = dtype is not None and np.dtype(dtype) == np.float64
    if dtype is not None and not oracle:
        raise IRError("evaluate's dtype may only be None or numpy.float64 (the oracle mode)")
    args = check_inputs(graph, inputs, oracle)
    wmap = dict(graph.weights)
    for k, v in (weights or {}).items():
        wmap[k] = to_numpy(v, f"weight {k!r}")
    vals: list[np.ndarray | None] = [None] * len(graph.nodes)
    for i, arr in zip(graph.input_ids, args):
        vals[i] = arr.astype(_storage(graph.nodes[i].dtype, oracle), copy=False)
    alive = graph.live()
    fused = _contractions(graph) if oracle else {}
    skip = set(fused.values())
    # a value is dropped after its last reader, and a weight is read (in the oracle: widened to float64) only
    # when first needed, so a model's weights are never all held twice (once as float64) at the same time
    reads = {i: (graph.nodes[fused[i]].inputs if i in fused else n.inputs) for i, n in enumerate(graph.nodes)
             if alive[i] and i not in skip and n.op != Op.Input}
    last = {}
    for i, ins in reads.items():
        for j in ins:
            last[j] = i
    keep = set(graph.outputs) | set(graph.input_ids)
    with np.errstate(all="ignore"):
        for i, ins in reads.items():
            if vals[i] is not None:
                continue
            for j in ins:
                if vals[j] is None and graph.nodes[j].op == Op.Input:
                    vals[j] = _eval_node(graph, j, graph.nodes[j], vals, wmap, oracle)
            n = graph.nodes[i]
            if i in fused:
                vals[i] = _contract(vals[ins[0]], vals[ins[1]], n.attrs["axis"], n.shape)
            else:
                vals[i] = _eval_node(graph, i, n, vals, wmap, oracle)
            for j in ins:
                if last.get(j) == i and j not in keep:
                    vals[j] = None
        for o in graph.outputs:  # an output that is a weight itself
            if vals[o] is None and graph.nodes[o].op == Op.Input:
                vals[o] = _eval_node(graph, o, graph.nodes[o], vals, wmap, oracle)
    # an output that is an input or weight would alias the caller's (or the graph's bound) array, and a
    # View's value may be a read-only strided view
    outs = [vals[o] if not oracle or not dtypes.is_float(graph.nodes[o].dtype) else
            np.asarray(vals[o], np.float64) for o in graph.outputs]
    return [np.array(v) if graph.nodes[o].op == Op.Input or not np.asarray(v).flags.writeable
            else np.asarray(v) for o, v in zip(graph.outputs, outs)]


def _contractions(graph: Graph) -> dict[int, int]:
    """SumReduce -> its float Mul operand, where nothing else reads the Mul: a matrix product in primitives.

    The oracle runs those as one contraction instead of materialising the
    whole ``[..., M, K, N]`` product (the same sum of the same products, in
    float64), which is what made the oracle of a traced matmul slow.
    """
    uses = [len(c) for c in graph.consumers()]
    outs = set(graph.outputs)
    out = {}
    for i, n in enumerate(graph.nodes):
        if n.op != Op.SumReduce or not dtypes.is_float(n.dtype):
            continue
        j = n.inputs[0]
        if graph.nodes[j].op == Op.Mul and uses[j] == 1 and j not in outs:
            out[i] = j
    return out


def _contract(a: np.ndarray, b: np.ndarray, axis: int, shape: tuple) -> np.ndarray:
    """``sum(a * b, axis)`` in float64 for same-shape `a`, `b`, reading a stride-0 (broadcast) axis once."""
    a, b = np.asarray(a), np.asarray(b)
    letters = string.ascii_letters[:a.ndim]

    def compact(x):
        keep = [d for d in range(x.ndim) if not (x.strides[d] == 0 and x.shape[d] > 1)]
        sub = x[tuple(slice(None) if d in keep else 0 for d in range(x.ndim))]
        return sub, "".join(letters[d] for d in keep)

    (ca, la), (cb, lb) = compact(a), compact(b)
    present = [d for d in range(a.ndim) if d != axis and (letters[d] in la or letters[d] in lb)]
    lo = "".join(letters[d] for d in present)
    r = _blocked_einsum(ca, la, cb, lb, lo)
    if letters[axis] not in la and letters[axis] not in lb:  # both broadcast along it: K equal terms
        r = r * a.shape[axis]
    full = [d for d in range(a.ndim) if d != axis]
    r = r.reshape([a.shape[d] if d in present else 1 for d in full])
    return np.array(np.broadcast_to(r, shape))  # (ascontiguousarray would make a 0-d result 1-d)


def _blocked_einsum(ca: np.ndarray, la: str, cb: np.ndarray, lb: str, lo: str) -> np.ndarray:
    """``einsum(la,lb->lo)`` in float64, widening the larger operand (a weight in its own dtype) in blocks
    of one output axis it holds, so no more than ``_BLOCK_BYTES`` of it is ever float64 at once."""
    (big, lbig), (small, lsmall) = sorted([(ca, la), (cb, lb)], key=lambda t: -t[0].size)
    cut = max((c for c in lbig if c in lo), key=lambda c: big.shape[lbig.index(c)], default=None)
    if cut is None or big.size * 8 <= _BLOCK_BYTES:
        return np.einsum(f"{la},{lb}->{lo}", np.asarray(ca, np.float64), np.asarray(cb, np.float64), optimize=True)
    n = big.shape[lbig.index(cut)]
    step = max(1, _BLOCK_BYTES // (8 * big.size // n))
    small64 = np.asarray(small, np.float64)
    parts = []
    for s in range(0, n, step):
        def part(x, lx):
            if cut not in lx:
                return x
            return x[tuple(slice(s, s + step) if c == cut else slice(None) for c in lx)]
        parts.append(np.einsum(f"{lbig},{lsmall}->{lo}", np.asarray(part(big, lbig), np.float64),
                               part(small64, lsmall), optimize=True))
    return np.concatenate(parts, axis=lo.index(cut))


def _eval_node(graph, i, n, vals, wmap, oracle):
    store = _storage(n.dtype, oracle)
    if n.op == Op.Input:
        name = n.attrs["name"]
        if name not in wmap:
            raise InputError(f"weight {name!r} has no bound value; pass weights={{{name!r}: array}}")
        w = np.asarray(wmap[name])
        if tuple(w.shape) != n.shape:
            raise InputError(f"weight {name!r} has shape {w.shape}, the graph expects {n.shape}")
        if not _dtype_ok(w.dtype, n.dtype, oracle):
            raise InputError(
                f"weight {name!r} has dtype {w.dtype}, the graph expects {n.dtype}; convert it "
                f"(e.g. w.astype('{n.dtype}'))"
            )
        return w if oracle else w.astype(store, copy=False)  # the oracle widens a weight where it reads it
    d = get_op(n.op)
    # exact in the operand's own dtype, widened by its readers: data movement, and a cast between float types
    # (the identity in the oracle, which holds every float in float64)
    as_is = oracle and (n.op in _MOVES or (n.op == Op.Cast and dtypes.is_float(n.dtype)
                                           and dtypes.is_float(graph.nodes[n.inputs[0]].dtype)))
    ins = []
    for j in n.inputs:
        v = vals[j]
        src = graph.nodes[j]
        widen = dtypes.is_float(src.dtype) and not as_is
        ins.append(v.astype(_compute(src.dtype, oracle), copy=False) if widen else v)
    if as_is and n.op == Op.Cast:
        return ins[0]
    out = d.compute(*ins, n.attrs, n.shape, _compute(n.dtype, oracle))
    out = np.asarray(out)
    if tuple(out.shape) != n.shape:  # pragma: no cover - guards the op table itself
        raise IRError(f"op {n.op} produced shape {out.shape}, expected {n.shape}")
    return out if as_is else out.astype(store, copy=False)
