"""Bad input gets a clear egraft error naming what was wrong and where."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import egraft
from egraft.errors import InputError, IRError, TraceError, UnsupportedOpError
from egraft.frontend import lowering


class FFTModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        spec = torch.fft.rfft(h)  # egraft has no FFT lowering
        return spec.abs()


def test_unsupported_op_names_op_and_source_line():
    with pytest.raises(UnsupportedOpError) as info:
        egraft.trace(FFTModel(), (torch.randn(2, 8),))
    msg = str(info.value)
    assert "fft" in info.value.op
    assert f"{__file__}:" in msg and "torch.fft.rfft(h)" in msg, msg
    assert "what to do" in msg


def test_data_dependent_control_flow_is_a_trace_error():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x - 1

    with pytest.raises(TraceError, match="torch.export could not capture Branchy"):
        egraft.trace(Branchy(), (torch.randn(3),))


def test_python_scalar_input_is_refused():
    with pytest.raises(InputError, match="example input 1 is a float"):
        egraft.trace(lambda x, s: x * s, (torch.randn(3), 2.0))


def test_python_kwargs_are_baked_in():
    g = egraft.trace(lambda x, scale=1.0: x * scale, (torch.randn(3),), {"scale": 3.0})
    x = torch.randn(3)
    out = egraft.ir.evaluate(g, [x.numpy()])[0]
    assert abs(out - (x * 3).numpy()).max() < 1e-6


def test_unused_missing_output_is_fine_but_used_one_is_not():
    ok = egraft.trace(lambda x: F.max_pool2d(x, 2, return_indices=True)[0], (torch.randn(1, 2, 4, 4),))
    assert len(ok.outputs) == 1
    with pytest.raises(UnsupportedOpError, match="indices"):
        egraft.trace(lambda x: F.max_pool2d(x, 2, return_indices=True)[1].float(), (torch.randn(1, 2, 4, 4),))


def test_training_batch_norm_says_call_eval():
    bn = torch.nn.BatchNorm1d(3).train()
    with pytest.raises(UnsupportedOpError, match=r"eval\(\)"):
        egraft.trace(bn, (torch.randn(4, 3),))


def test_buffer_mutation_is_traced_as_state_and_checked_against_eager():
    from state_models import Counter

    x, n0 = torch.randn(3), torch.randn(3)
    g = egraft.trace(Counter(), (x,))
    assert g.state_names() == ["n"]
    m = Counter()
    m.n.copy_(n0)
    want = m(x)
    new_n, out = egraft.ir.evaluate(g, [x.numpy(), n0.numpy()])
    np.testing.assert_allclose(new_n, m.n.numpy(), rtol=1e-6)
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-6)


def test_wrong_rule_is_caught_at_its_node(monkeypatch):
    """A rule producing the wrong shape is reported at that op, not downstream."""
    bad = lowering.Rule("aten.neg", lambda ctx, x: x.sum(0))
    monkeypatch.setitem(lowering.LOWERINGS, "aten.neg", bad)
    with pytest.raises(IRError, match=r"aten.neg.default produced shape \(4,\), torch says \(3, 4\)"):
        egraft.trace(lambda x: -x, (torch.randn(3, 4),))


def test_unsupported_dtype_input():
    with pytest.raises(InputError, match="complex64"):
        egraft.trace(lambda x: x * 2, (torch.randn(3, dtype=torch.complex64),))
