"""A compiled and a loaded program run the same code: each backend's executable calls through the runtime's runner.

For each backend the executable ``egraft.backends.lower`` builds and the
artifact ``egraft.load`` reads back hold a runner of the same class, and the
two agree bit for bit on the fast path and the checking path, numpy and
torch, with the same errors; the torch backend's Inductor options are
written once.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from egraft.backends import lower
from egraft.backends.artifact import save_artifact
from egraft.backends.base import Executable
from egraft.errors import InputError
from egraft.ir import GraphBuilder
from egraft.runtime import load
from egraft.runtime.jax_runner import JaxRunner
from egraft.runtime.torch_runner import INDUCTOR_OPTIONS, TorchRunner
from egraft.runtime.triton_runner import TritonRunner
from egraft.testing import random_array

RUNNERS = {"jax": JaxRunner, "torch": TorchRunner, "triton": TritonRunner}


def _graph(dt="float32", shape=(3, 8)):
    """Two inputs, a weight, three outputs (one reduced, one an int64 argmax when floating)."""
    b = GraphBuilder()
    x, y = b.input("x", shape, dt), b.input("y", shape, dt)
    w = b.weight("w", random_array(shape, dt, np.random.default_rng(0)))
    outs = [x * w + y, (x - y).sum(-1)]
    if dt in ("float32", "float64", "bfloat16"):
        outs.append((x * y).argmax(-1))
    return b.build(outs)


def _pair(backend, tmp_path, dt="float32", knobs=None):
    g = _graph(dt)
    ex = lower(g, backend, "cpu", knobs)
    art = load(save_artifact(ex, str(tmp_path / f"{backend}-{dt}"), **({"ptx_archs": ()} if backend == "triton"
                                                                       else {})))
    return g, ex, art


def _same(a, b):
    assert len(a) == len(b)
    for p, q in zip(a, b):
        assert type(p) is type(q)
        if isinstance(p, torch.Tensor):
            assert p.dtype == q.dtype and p.device == q.device
            assert torch.equal(p.view(torch.int16) if p.dtype == torch.bfloat16 else p,
                               q.view(torch.int16) if q.dtype == torch.bfloat16 else q)
        else:
            assert p.dtype == q.dtype
            np.testing.assert_array_equal(p, q)


@pytest.mark.parametrize("backend", ["jax", "torch", "triton"])
def test_executable_and_artifact_share_the_runner_and_agree(backend, tmp_path):
    g, ex, art = _pair(backend, tmp_path)
    assert type(ex.runner) is type(art.runner) is RUNNERS[backend]
    rng = np.random.default_rng(1)
    xs = [random_array(s, d, rng) for s, d in g.input_types()]
    ts = [torch.from_numpy(a.copy()) for a in xs]
    _same(ex(*xs), art.run_flat(*xs))  # numpy in, numpy out
    _same(ex(*xs), art(*xs))
    _same(ex(*ts), art.run_flat(*ts))  # torch in, torch out
    _same(ex(*ts), art(*ts))
    _same(Executable.__call__(ex, *ts), art.run_flat(*ts))  # both checking paths
    fast = ex.fast_path()
    if fast is not None:  # the backend has a fast path: the artifact takes the same one
        assert getattr(art.runner, "fast", None) is not None
        for ins in (xs, ts):
            got = fast(tuple(ins))
            assert got is not None
            _same(got, art.runner.fast(tuple(ins)))
    for bad in (np.zeros((3, 7), np.float32), np.zeros((3, 8), np.float64)):
        with pytest.raises(InputError, match="input 'y'"):
            ex(xs[0], bad)
        with pytest.raises(InputError, match="input 'y'"):
            art(xs[0], bad)


@pytest.mark.parametrize("dt", ["float64", "bfloat16"])
def test_a_loaded_jax_program_takes_the_executables_fast_path_for_every_dtype(dt, tmp_path):
    """x64 programs, bfloat16 and outputs cast back (int64 argmax) take the fast path, loaded or not."""
    g, ex, art = _pair("jax", tmp_path, dt)
    rng = np.random.default_rng(2)
    xs = [random_array(s, d, rng) for s, d in g.input_types()]
    ts = [torch.from_numpy(a.copy()) if dt != "bfloat16" else torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
          for a in xs]
    for ins in (tuple(xs), tuple(ts)):
        got, want = art.runner.fast(ins), ex.fast_path()(ins)
        assert got is not None and want is not None
        _same(got, want)
        _same(got, art.run_flat(*ins))


def test_int64_held_as_int32_is_range_checked_the_same_way(tmp_path):
    b = GraphBuilder()
    i = b.input("i", (5,), "int64")
    ex = lower(b.build([i + i]), "jax", "cpu")
    art = load(save_artifact(ex, str(tmp_path / "a")))
    assert ex.fast_path().np_dtypes is None and art.runner.fast.np_dtypes is None  # every call checked
    big = np.full(5, 2**40, np.int64)
    for call in (ex, art):
        for ins in ((big,), (torch.from_numpy(big),)):
            with pytest.raises(InputError, match="input 'i' holds int64 values outside the int32 range"):
                call(*ins)
    ok = np.arange(5, dtype=np.int64)
    _same(ex(ok), art(ok))


def test_the_inductor_options_are_written_once():
    root = pathlib.Path(__file__).resolve().parents[2] / "egraft"
    holders = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "emulate_precision_casts" in p.read_text())
    assert holders == ["runtime/torch_runner.py"]
    assert INDUCTOR_OPTIONS == {"emulate_precision_casts": True}
