"""The Triton backend: an ``ir.Graph`` as a sequence of generated, fused Triton kernels.

Pipeline (each step its own module):

1. ``fold.fold_weights`` - weight-only subgraphs are evaluated once, at build;
2. ``expand`` - idioms too wide for a one-kernel template become primitives;
3. ``partition`` - choose the materialised nodes; one kernel per such node;
4. ``kernel`` + ``emitter`` + ``rules`` (+ ``reduction``, ``matmul``,
   ``attention``) - readable Triton source per kernel, written to a cache
   directory and imported;
5. ``launcher`` - allocate outputs and launch the kernels in order.

Devices: ``cuda`` compiles the kernels for the GPU.  ``cpu`` runs them in
Triton's interpreter, which must be chosen *before triton is first imported*
(``TRITON_INTERPRET=1`` in the environment: triton decides when its own
library functions are defined); lowering for ``cpu`` without it, or for
``cuda`` with it, raises a ``BackendError`` that says so.  ``ptx.py``
cross-compiles generated kernels (``generate_kernels(graph)``) for sm_80 /
sm_90 without a GPU.
"""

from __future__ import annotations

from ...errors import BackendError
from ...ir import Op
from ...ir.graph import Graph
from ...runtime.triton_loader import interpreter_active  # one definition, shared with the artifact loader
from ..base import Backend, KernelPlan, default_knobs, device_kind, register
from ..fold import fold_weights, plan as fold_plan
from .expand import expand_idioms
from .partition import anchors, partition
from .rules import RULES


def _check_mode(device: str):
    kind = device_kind(device)
    active = interpreter_active()
    if kind == "cpu" and not active:
        raise BackendError(
            "the Triton backend runs on device 'cpu' only in Triton's interpreter, which must be enabled "
            "before triton is first imported: set TRITON_INTERPRET=1 in the environment (or use "
            "backend='jax' for CPU)"
        )
    if kind == "cuda" and active:
        raise BackendError(
            "TRITON_INTERPRET=1 was set when triton was imported, so kernels cannot be compiled for "
            f"{device!r}; unset it to run on the GPU (or use device='cpu' for the interpreter)"
        )


def knobs(graph: Graph) -> dict[str, list]:
    """The backend's search space; the first choice of each knob is its default."""
    space = {
        "tile_elems": [2048, 512, 8192],  # elements per program for elementwise / row / reduction tiles
        "matmul_block": [(64, 64, 32), (32, 32, 32), (128, 128, 32), (128, 64, 64), (16, 16, 16)],
        "attention_block": [(64, 64), (32, 32), (128, 64), (16, 16)],
        "num_warps": [4, 2, 8],
        "num_stages": [2, 3, 4],
        "fuse_epilogue": [True, False],
        "fuse_prologue": [True, False],
        "persistent_rows": [True, False],
        "tf32": [False, True],
    }
    main = fold_plan(graph).main
    for a in anchors(main):
        space[f"fuse_{a}"] = [True, False]
    return space


def build(graph: Graph, knobs: dict):
    """Generate (not load) the kernels for `graph` under `knobs`: (per-call graph, folded, specs)."""
    from .kernel import buffer_names, generate

    main, folded = fold_weights(graph)
    main = expand_idioms(main)
    plans = partition(main, knobs)
    _check_index_range(main, plans)
    names = buffer_names(main, {p.root for p in plans})
    specs = [generate(main, p, names, knobs, k) for k, p in enumerate(plans)]
    return main, folded, specs


def plan(graph: Graph, knobs: dict) -> KernelPlan:
    """The kernels one call runs (for the cost model): the partitioner's, after the idiom expansion of the build."""
    main = expand_idioms(fold_plan(graph).main)
    plans = partition(main, knobs)
    dots = {nid: (f.a, f.b) for p in plans for nid, f in p.dots.items() if main.nodes[nid].op == Op.SumReduce}
    return KernelPlan(main, frozenset(p.root for p in plans), dots, tf32=bool(knobs.get("tf32")))


def generate_kernels(graph: Graph, knobs: dict | None = None) -> list:
    """The kernels (KernelSpecs, sources written and loaded) `graph` lowers to under `knobs`.

    The defaults fill in the knobs not given.  Loading needs no device: under
    the interpreter it only imports the source; ``ptx.compile_in_subprocess``
    cross-compiles the result for a GPU.
    """
    from .kernel import load

    chosen = {**default_knobs(BACKEND.knobs(graph)), **(knobs or {})}
    _, _, specs = build(graph, chosen)
    return [load(s) for s in specs]


def _check_index_range(main: Graph, plans) -> None:
    """Refuse a graph whose kernels would index past int32: a buffer (an input, a weight, a kernel's output or
    operand) of 2**31 elements or more, or a tile kernel whose rows times its reduced extent reach that.  A view
    that no kernel walks (the broadcast operands of a product computed as a dot) is not counted: a matmul whose
    broadcast form has 2**31 elements reads only its operands."""
    walked = {i: _numel(n.shape) for i, n in enumerate(main.nodes) if n.op == Op.Input}  # inputs and weights
    for p in plans:
        walked[p.root] = max(walked.get(p.root, 0),
                             _numel(main.nodes[p.root].shape) * (max(1, p.reduce_k) if p.kind == "tile" else 1))
        walked.update({i: _numel(main.nodes[i].shape) for i in p.inputs})
    big = [(i, n) for i, n in walked.items() if n >= 2**31]
    if big:
        i, count = big[0]
        raise BackendError(f"node %{i} ({main.nodes[i].op}) makes a kernel walk {count:,} elements; the Triton "
                           "backend's int32 index arithmetic supports below 2**31 - split the batch")


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def lower(graph: Graph, device: str, knobs: dict):
    _check_mode(device)
    from .kernel import load
    from .launcher import TritonExecutable

    main, folded, specs = build(graph, knobs)
    for s in specs:
        load(s)
    dev = "cpu" if device_kind(device) == "cpu" else device
    return TritonExecutable(graph=graph, backend="triton", device=dev, knobs=dict(knobs), kernels=specs, main=main,
                            folded=folded)


# on cpu only in Triton's interpreter (a test and debugging aid): run there when named, never picked by auto
BACKEND = register(Backend(name="triton", devices={"cuda": 30, "cpu": None}, lower=lower, knobs=knobs,
                           rule_table=lambda: RULES, plan=plan, recomputes=True, state_in_place=True,
                           writer="egraft.backends.triton.export", loader="egraft.runtime.triton_loader"))

__all__ = ["BACKEND", "RULES", "build", "generate_kernels", "interpreter_active", "knobs", "lower", "plan"]
