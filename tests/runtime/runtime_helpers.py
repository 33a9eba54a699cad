"""Shared pieces of the runtime tests: models with structured outputs, building and saving artifacts."""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

import egraft
from egraft.backends import lower
from egraft.backends.artifact import save_artifact
from egraft.runtime import outputs
from egraft.testing import random_array

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class DictHeads(nn.Module):
    """Several outputs in a nested structure: a dict with a tuple holding a None, an int64 argmax, a list."""

    def __init__(self, d: int = 16, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.proj = nn.Linear(d, 2 * d)
        self.head = nn.Linear(2 * d, 5)

    def forward(self, x, bias):
        h = torch.relu(self.proj(x)) + bias
        logits = self.head(h)
        return {"logits": logits, "extra": (h.sum(-1), None), "best": [logits.argmax(-1)]}


class Bf16Block(nn.Module):
    """bfloat16 weights and activations: Linear, SiLU, Linear (weights must round trip as bfloat16)."""

    def __init__(self, d: int = 16, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(d, 32)
        self.b = nn.Linear(32, d)
        self.to(torch.bfloat16)

    def forward(self, x):
        return self.b(torch.nn.functional.silu(self.a(x)))


def dict_heads(seed: int = 0):
    m = DictHeads(seed=seed).eval()
    g = torch.Generator().manual_seed(seed)
    return m, (torch.randn(2, 3, 16, generator=g), torch.randn(32, generator=g))


def bf16_block(seed: int = 0):
    m = Bf16Block(seed=seed).eval()
    return m, (torch.randn(4, 16, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16),)


def workload(name: str, seed: int = 0):
    """(model, example inputs) for an egraft.models workload or one of the models above."""
    if name == "dict_heads":
        return dict_heads(seed)
    if name == "bf16_block":
        return bf16_block(seed)
    return egraft.models.make(name, seed=seed)


def build(name: str, backend: str, directory: str, seed: int = 0, knobs=None, **options):
    """Trace, lower and save `name` (`options` go to the writer); returns (model, args, graph, executable, directory)."""
    model, args = workload(name, seed)
    g = egraft.trace(model, args)
    ex = lower(g, backend, "cpu", knobs)
    with torch.no_grad():
        tree = outputs.describe(model(*args))
    save_artifact(ex, directory, meta={"model": name, "output_tree": tree, "report": {"speedup": 1.0},
                                       "source": f"egraft.models:{name}"}, **options)
    return model, args, g, ex, directory


def random_args(graph, rng) -> list[np.ndarray]:
    """Random inputs for `graph` (never all zero)."""
    return [random_array(s, d, rng) for s, d in graph.input_types()]


def flat(obj) -> list:
    """The tensors of a model output in trace order (torch's pytree leaves; None is no leaf)."""
    return [t for t in torch.utils._pytree.tree_leaves(obj) if t is not None]


def kernel_on_cores(spec, arrays, cores: int, tmp_path, calls: int = 1) -> tuple[np.ndarray, dict]:
    """The generated CPU product `spec` (runtime.llvm_kernels) of `arrays` through XLA's FFI, in a new process
    pinned to its first `cores` cores (on one XLA's pool has one thread and the caller computes every panel, on
    two the panels are shared with a helper thread, ``runtime.llvm_pool``), called `calls` times or until a
    helper joined one (at most `calls` times, 20 s); and the pool's stats then."""
    import sys

    import ml_dtypes

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generation"))
    from compiled_helpers import run_python

    loads = []
    for k, a in enumerate(arrays):
        half = a.dtype == ml_dtypes.bfloat16  # (np.save keeps no bfloat16: saved as its bits)
        np.save(tmp_path / f"a{k}.npy", a.view(np.uint16) if half else a)
        loads.append(f"np.load({str(tmp_path / f'a{k}.npy')!r})" + (".view(ml_dtypes.bfloat16)" if half else ""))
    code = ("import os, json, numpy as np, ml_dtypes; os.sched_setaffinity(0, list(sorted(os.sched_getaffinity(0)))"
            f"[:{cores}]); import jax; from egraft.runtime import llvm_kernels as lk; "
            f"s = lk.KernelSpec.from_json({spec.to_json()!r}); "
            f"f = jax.jit(lambda *a: lk.call(s, *a)); a = [{', '.join(loads)}]; y = f(*a); "
            "from egraft.runtime import llvm_pool; import time; t = time.time(); n = 1\n"
            f"while n < {calls} and llvm_pool.stats()['joined'] == 0 and time.time() - t < 20:\n"
            "    y = f(*a); n += 1\n"
            f"np.save({str(tmp_path / 'y.npy')!r}, np.asarray(y)); "
            "print(json.dumps(llvm_pool.stats()))")
    stats = run_python(code)
    return np.load(tmp_path / "y.npy"), stats
