"""The traced graph's weight arrays: copies, one per parameter for every trace sharing a WeightCopies, aligned so
the JAX backend aliases them instead of copying (``egraft.frontend.weights``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from egraft.frontend import trace
from egraft.frontend.weights import ALIGN, WeightCopies, aligned_copy


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _model():
    torch.manual_seed(0)
    return _Mlp().eval()


def test_traces_sharing_weight_copies_bind_the_same_arrays_and_a_change_gets_a_new_copy():
    model, copies = _model(), WeightCopies()
    g1 = trace(model, (torch.randn(1, 16),), weights=copies)
    g4 = trace(model, (torch.randn(4, 16),), weights=copies)
    assert sorted(g1.weights) == sorted(g4.weights) and len(g1.weights) == 4 == len(copies)
    assert all(g1.weights[n] is g4.weights[n] for n in g1.weights)
    alone = trace(model, (torch.randn(4, 16),))  # no WeightCopies given: a trace's own copies
    assert all(alone.weights[n] is not g1.weights[n] for n in g1.weights)
    with torch.no_grad():
        model.up.weight.add_(1.0)  # the parameter changes: the graphs traced before keep their values
    g2 = trace(model, (torch.randn(2, 16),), weights=copies)
    name = next(n for n in g1.weights if n.endswith("up.weight"))
    assert g2.weights[name] is not g1.weights[name]
    np.testing.assert_array_equal(g2.weights[name], g1.weights[name] + 1.0)
    assert g2.weights[name.replace("up.weight", "down.weight")] is g1.weights[name.replace("up.weight", "down.weight")]


def test_weight_copies_are_read_only_aligned_and_not_the_parameters_memory():
    model = _model()
    g = trace(model, (torch.randn(2, 16),))
    for name, w in g.weights.items():
        assert w.ctypes.data % ALIGN == 0 and not w.flags.writeable, name
        assert w.ctypes.data != model.get_parameter(name).data_ptr()
    odd = np.arange(7, dtype=np.float32)[1:]  # a view at a 4-byte offset
    out = aligned_copy(odd)
    assert out.ctypes.data % ALIGN == 0 and out.dtype == odd.dtype
    np.testing.assert_array_equal(out, odd)


def test_the_jax_backend_uses_the_traced_weights_memory():
    pytest.importorskip("jax")
    from egraft.backends import lower

    g = trace(_model(), (torch.randn(2, 16),))
    ex = lower(g, "jax", "cpu", {"panels": 0})  # (panels are a relaid copy made at build: test_jax_panels.py)
    host = {id(w): w.ctypes.data for w in g.weights.values()}
    placed = [w.unsafe_buffer_pointer() for w in ex.weights]
    assert set(host.values()) <= set(placed)  # each weight aliased, none copied


def test_inference_tensors_get_a_copy_each_time():
    """An inference tensor has no version counter: it is copied every time, never served from a stale copy."""
    copies = WeightCopies()
    with torch.inference_mode():
        t = torch.randn(4, 3)
        a = copies.get(t)
        t.add_(1.0)  # an in-place update no version counter records
        b = copies.get(t)
    assert a is not b and len(copies) == 0
    np.testing.assert_array_equal(b, t.numpy())
    assert not np.array_equal(a, b)
